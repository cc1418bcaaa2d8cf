"""Frame-level speaker segmentation over a powerset of local speakers, and its permutation-invariant loss.

    model = SegmentationModel()                        # waveform (B, S) at 16 kHz -> logits (B, T, 7)
    classes = model(wave).argmax(-1)                   # (B, T) powerset class per 20 ms frame
    active = to_multilabel(classes)                    # (B, T, 3) which local speaker talks, 0/1
    loss = powerset_loss(model(wave), reference)       # reference (B, T, 3) 0/1, local speakers in any order

A window of a few seconds holds at most `NUM_LOCAL` = 3 local speakers, and at most `MAX_ACTIVE` = 2 of them
at once (three-way overlap is rare enough in conversations to be left out, and it keeps the classes few):
the powerset classes are the subsets of {0, 1, 2} of size <= 2, in the order `POWERSET` gives: {} (no
speech), {0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}. One softmax over these 7 classes replaces three
independent speaker activities: no threshold to tune, and "two speakers" is a class of its own.

Local speakers have no names, so the loss is the smallest cross-entropy over the 3! orders of the
reference's speakers, per window. Frames where the reference has three speakers at once are left out of it.

The model is small on purpose (a CPU recipe trains it): a front end of 25 ms frames every 10 ms, normalised per
window (`frontend`: "learnt", a strided Conv1d on the waveform whose outputs' log magnitude are the features; or
"fbank", log mel filterbank energies computed in the graph from a fixed DFT), a stride-2 convolution to 20 ms
frames, a bidirectional LSTM and a linear layer (dropout before each LSTM layer and the head when training). Its
input is the waveform, so its ONNX file needs no front end of ours (torch-free inference, like the waveform
embedders).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NUM_LOCAL = 3
MAX_ACTIVE = 2
SAMPLE_RATE = 16000
# The learnt filterbank's kernel and hop (samples), then the stride-2 convolution: frames of 20 ms.
KERNEL, HOP, STRIDE = 400, 160, 2


def powerset_classes(num_local: int = NUM_LOCAL, max_active: int = MAX_ACTIVE) -> list:
    """The subsets of range(num_local) of size <= max_active, by size then in lexical order."""
    return [c for size in range(max_active + 1) for c in itertools.combinations(range(num_local), size)]


POWERSET = powerset_classes()
NUM_CLASSES = len(POWERSET)


def powerset_matrix() -> torch.Tensor:
    """(C, K) 0/1: row c marks the local speakers active in powerset class c."""
    m = torch.zeros(NUM_CLASSES, NUM_LOCAL)
    for c, members in enumerate(POWERSET):
        m[c, list(members)] = 1.0
    return m


def to_multilabel(classes: torch.Tensor) -> torch.Tensor:
    """(..., T) class indices -> (..., T, K) 0/1 activities."""
    return powerset_matrix().to(classes.device)[classes]


def to_powerset(active: torch.Tensor) -> torch.Tensor:
    """(..., T, K) 0/1 activities -> (..., T) class indices; -1 where more than MAX_ACTIVE are active."""
    m = powerset_matrix().to(active.device)
    # A frame's class is the row of `m` equal to it: the one whose members are all active and as many.
    hits = (active.float() @ m.T == m.sum(1)) & (active.float().sum(-1, keepdim=True) == m.sum(1))
    found = hits.any(-1)
    return torch.where(found, hits.float().argmax(-1), torch.full_like(found, -1, dtype=torch.long))


def powerset_loss(logits: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Permutation-invariant powerset cross-entropy: logits (B, T, C), reference (B, T, K) 0/1 -> scalar.

    Per window, the reference's local speakers are taken in the order that gives the lowest mean
    cross-entropy over its frames (three-speaker frames left out); the result is the mean over windows."""
    b, t, c = logits.shape
    per_order = []
    for order in itertools.permutations(range(reference.shape[-1])):
        target = to_powerset(reference[..., list(order)])  # (B, T)
        ce = F.cross_entropy(logits.reshape(b * t, c), target.reshape(-1), ignore_index=-1, reduction="none")
        valid = (target >= 0).float()
        per_order.append((ce.reshape(b, t) * valid).sum(1) / valid.sum(1).clamp(min=1.0))
    return torch.stack(per_order).min(0).values.mean()


FRONTENDS = ("learnt", "fbank")


@dataclass(frozen=True)
class SegmentationShape:
    """The model's sizes: front-end filters (learnt or mel), convolution channels, LSTM hidden units per direction
    and layers; the front end (FRONTENDS) and the dropout rate. Weights saved before `frontend` and `dropout`
    existed load as "learnt" and 0."""

    filters: int = 40
    channels: int = 64
    hidden: int = 64
    layers: int = 1
    frontend: str = "learnt"
    dropout: float = 0.0


def mel_matrix(filters: int, bins: int, rate: int = SAMPLE_RATE, low: float = 20.0) -> torch.Tensor:
    """(filters, bins) triangular filters, equally spaced on the mel scale (1127 ln(1 + f / 700)) from `low` Hz to
    Nyquist, over the `bins` = n_fft / 2 + 1 frequencies of a DFT."""

    def mel(f):
        return 1127.0 * np.log1p(np.asarray(f) / 700.0)

    edges = np.linspace(mel(low), mel(rate / 2), filters + 2)  # each filter spans three neighbouring edges
    freqs = mel(np.linspace(0.0, rate / 2, bins))
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rise, fall = (freqs - left) / (centre - left), (right - freqs) / (right - centre)
    return torch.from_numpy(np.clip(np.minimum(rise, fall), 0.0, None).astype(np.float32))


class Fbank(nn.Module):
    """Waveform (B, 1, S) -> log mel filterbank energies (B, filters, T0) of Hamming-windowed frames of KERNEL
    samples every HOP: the DFT as a fixed convolution (cosine and sine rows), so the ONNX graph holds it."""

    def __init__(self, filters: int):
        super().__init__()
        n, bins = torch.arange(KERNEL, dtype=torch.float64), KERNEL // 2 + 1
        angle = 2 * np.pi * torch.arange(bins, dtype=torch.float64)[:, None] * n[None] / KERNEL
        window = torch.hamming_window(KERNEL, periodic=False, dtype=torch.float64)
        basis = torch.cat([torch.cos(angle), torch.sin(angle)]) * window  # (2 * bins, KERNEL)
        # Buffers, not parameters: the transform is fixed (nothing to learn, no gradient to compute).
        self.register_buffer("basis", basis.float().unsqueeze(1))
        self.register_buffer("mel", mel_matrix(filters, bins))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        spec = F.conv1d(wave, self.basis, stride=HOP)  # (B, 2 * bins, T0)
        real, imag = spec.chunk(2, dim=1)
        # The floor (about -60 dB below a full-scale frame's energy per filter) keeps digital silence finite.
        return torch.log(torch.matmul(self.mel, real**2 + imag**2) + 1e-6)


class SegmentationModel(nn.Module):
    """Waveform (B, S) at 16 kHz -> powerset logits (B, T, NUM_CLASSES), one frame per 20 ms."""

    def __init__(self, shape: SegmentationShape = SegmentationShape()):
        super().__init__()
        if shape.frontend not in FRONTENDS:
            raise ValueError(f"frontend must be one of {', '.join(FRONTENDS)}, got {shape.frontend!r}")
        self.shape = shape
        if shape.frontend == "fbank":
            self.filterbank = Fbank(shape.filters)
        else:
            self.filterbank = nn.Conv1d(1, shape.filters, KERNEL, stride=HOP, bias=False)
        self.norm = nn.InstanceNorm1d(shape.filters, affine=True)
        self.conv = nn.Sequential(
            nn.Conv1d(shape.filters, shape.channels, 3, stride=STRIDE, padding=1),
            nn.BatchNorm1d(shape.channels),
            nn.ReLU(),
            nn.Conv1d(shape.channels, shape.channels, 3, padding=1),
            nn.BatchNorm1d(shape.channels),
            nn.ReLU(),
        )
        # Layers as single-layer LSTMs, one after the other (the same function as num_layers): torch.export cannot
        # decompose a multi-layer LSTM whose length axis is dynamic (measured: the ONNX export of 2 layers fails).
        self.lstm = nn.ModuleList(
            nn.LSTM(shape.channels if i == 0 else 2 * shape.hidden, shape.hidden, batch_first=True, bidirectional=True)
            for i in range(shape.layers)
        )
        self.drop = nn.Dropout(shape.dropout)
        self.head = nn.Linear(2 * shape.hidden, NUM_CLASSES)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        x = self.filterbank(wave.unsqueeze(1))  # (B, F, T0), 10 ms frames
        x = self.norm(x if self.shape.frontend == "fbank" else torch.log1p(x.abs()))
        x = self.conv(x).transpose(1, 2)  # (B, T, channels), 20 ms frames
        for lstm in self.lstm:
            x, _ = lstm(self.drop(x))
        return self.head(self.drop(x))

    @staticmethod
    def num_frames(num_samples: int) -> int:
        """Frames of a window of `num_samples` samples (>= KERNEL)."""
        return ((num_samples - KERNEL) // HOP) // STRIDE + 1

    @staticmethod
    def frame_centres(num_frames: int) -> np.ndarray:
        """(T,) the centre of each frame in seconds from the window's start."""
        return (np.arange(num_frames) * STRIDE * HOP + KERNEL / 2) / SAMPLE_RATE


def frame_labels(turns, num_frames: int, offset: float = 0.0) -> np.ndarray:
    """Reference activities of a window from its turns: (T, K) 0/1 float32.

    `turns` are (start, end, speaker) in seconds of the recording, `offset` the window's start; the local
    speakers are numbered in order of their first frame in the window. A window with more than K
    speakers keeps the K who talk most in it (the others' frames stay 0, as unlabelled as silence)."""
    centres = SegmentationModel.frame_centres(num_frames) + offset
    per_speaker: dict = {}
    for start, end, speaker in turns:
        on = (centres >= start) & (centres < end)
        if on.any():
            per_speaker[speaker] = per_speaker.get(speaker, np.zeros(num_frames, bool)) | on
    kept = sorted(per_speaker, key=lambda s: -per_speaker[s].sum())[:NUM_LOCAL]
    kept.sort(key=lambda s: int(np.argmax(per_speaker[s])))
    labels = np.zeros((num_frames, NUM_LOCAL), np.float32)
    for k, speaker in enumerate(kept):
        labels[:, k] = per_speaker[speaker]
    return labels


def export_onnx(model: SegmentationModel, path) -> None:
    """Write `model` as ONNX: input `wave` (B, S) at 16 kHz, S >= 560 -> output `scores` (B, T, NUM_CLASSES)
    logits, batch and length dynamic; the frame layout in the metadata (speakerlab.diarization.segmenter
    reads it).

    Through torch's TorchScript-based exporter (`dynamo=False`), which writes each LSTM as one ONNX LSTM node, not
    through torch.export as the embedders are: torch.export unrolls the recurrence symbolically, and exporting
    tests/test_segmentation.py's 2-layer model took 240 s that way against 1 s here (one thread, 2-core Intel
    Xeon, torch 2.13), the CPU recipe's model 10 minutes; a second torch.export of an LSTM in one process also
    fixed the length axis. The test compares the file with torch at several batch sizes and lengths."""
    import io
    import warnings

    import onnx

    from speakerlab.inference.deploy.graph import set_metadata
    from speakerlab.outputs import output_file

    buffer = io.BytesIO()
    # 2.5 s plus an odd tail: no length axis is specialised to a round value.
    example = torch.randn(2, 40123)
    with warnings.catch_warnings():
        # The exporter warns that an LSTM exported at batch 2 may not run at another batch size: that holds for
        # explicit initial states only (these start at zero, sized from the input; the test runs batches 1-3).
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model.eval(),
            (example,),
            buffer,
            input_names=["wave"],
            output_names=["scores"],
            dynamic_axes={"wave": {0: "batch", 1: "samples"}, "scores": {0: "batch", 1: "frames"}},
            opset_version=18,
            dynamo=False,
        )
    graph = onnx.load_from_string(buffer.getvalue())
    meta = {
        "speakerlab.segmentation.sample_rate": SAMPLE_RATE,
        "speakerlab.segmentation.kernel": KERNEL,
        "speakerlab.segmentation.hop": HOP * STRIDE,
        "speakerlab.segmentation.powerset": ";".join(",".join(map(str, c)) for c in POWERSET),
    }
    set_metadata(graph, {k: str(v) for k, v in meta.items()})
    with output_file(path, "wb") as f:
        f.write(graph.SerializeToString())
