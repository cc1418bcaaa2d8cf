"""Speed perturbation: batched polyphase resampling in torch, and the speaker classes it adds.

Speeding up by a factor f (sox `speed f`) = resampling the signal from sr to sr/f and playing it at
sr: the duration becomes 1/f of the input and every frequency (F0, formants) is multiplied by f. The
factors are rationals (0.9 = 9/10), so this is a polyphase resampler with ratio up/down = 1/f: the filter
and phase weights of speakerlab.dataio.waveform.polyphase (those of `scipy.signal.resample_poly`), applied to a
whole batch as one strided `conv1d` with `up` output channels, on any device.

With `speed_new_speakers`, each speaker at each factor is its own class (a speaker sped up by 10 %
sounds like another person to the model): class = speaker index + factor class x num_speakers,
factor class 0 being the unperturbed speed, so the original speakers keep their ids.
"""

from __future__ import annotations

from fractions import Fraction
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from speakerlab.dataio.waveform.polyphase import output_length, phase_weights
from speakerlab.devices import in_exact_fp32

MAX_DENOMINATOR = 100


def resample_ratio(factor: float) -> Tuple[int, int]:
    """Speed factor f -> (up, down) with up / down = 1 / f in lowest terms (0.9 -> (10, 9)).

    Raises ValueError for a factor that is not > 0 or not a ratio of integers <= 100."""
    if not factor > 0:
        raise ValueError(f"speed factor must be > 0, got {factor}")
    ratio = Fraction(1 / factor).limit_denominator(MAX_DENOMINATOR)
    if abs(float(ratio) - 1 / factor) > 1e-9 * (1 / factor):
        raise ValueError(f"speed factor {factor} is not a ratio of integers <= {MAX_DENOMINATOR}")
    return ratio.numerator, ratio.denominator


def input_length(num_samples: int, factor: float) -> int:
    """Samples to read so that speed `factor` yields at least `num_samples` (a loader worker reads
    `crop x factor`, then the resampled output is cut to the crop)."""
    up, down = resample_ratio(factor)
    return -(-num_samples * down // up)


class Resampler(torch.nn.Module):
    """Batched polyphase resampling by up / down: `(B, N) -> (B, ceil(N * up / down))` float32.

    The polyphase weights are a buffer: move the module with `.to(device)`."""

    def __init__(self, up: int, down: int):
        super().__init__()
        self.up, self.down = up, down
        self.j_lo, weight = phase_weights(up, down)
        weight = weight[:, None, :]  # (up, 1, taps): one conv1d output channel per phase
        self.register_buffer("weight", torch.from_numpy(weight).float(), persistent=False)

    def extra_repr(self) -> str:
        return f"up={self.up}, down={self.down}, taps={tuple(self.weight.shape)}"

    @in_exact_fp32  # a TF32 convolution (hardware.tf32) would round the samples to ~1e-3 of full scale
    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2:
            raise ValueError(f"Resampler expects (batch, samples), got {tuple(x.shape)}")
        n = x.shape[1]
        n_out = output_length(n, self.up, self.down)
        groups = -(-n_out // self.up)  # output samples come in groups of `up`, one per phase
        size = self.weight.shape[-1]
        left = -self.j_lo  # the zeros before the signal that the first outputs' filters reach
        right = max(0, (groups - 1) * self.down + size - (n + left))
        padded = F.pad(x.to(self.weight.dtype).unsqueeze(1), (left, right))
        out = F.conv1d(padded, self.weight, stride=self.down)[:, :, :groups]  # (B, up, groups)
        return out.transpose(1, 2).reshape(x.shape[0], -1)[:, :n_out]


def by_rows(fn, chunk: Optional[int], *xs: Tensor) -> Tensor:
    """`fn(*xs)` computed over blocks of `chunk` rows and concatenated (all rows at once when `chunk`
    is None). The same result; on a CPU the blocks stay in cache: bench/data_pipeline.py's batch of
    128 x 3 s ran fbank, FFT convolution and resampling 4-10x faster per sample in blocks of 8-32."""
    n = xs[0].shape[0]
    if not chunk or n <= chunk:
        return fn(*xs)
    return torch.cat([fn(*(x[i : i + chunk] for x in xs)) for i in range(0, n, chunk)])


class SpeedPerturb(torch.nn.Module):
    """Per-item speed factors on a batch: `forward(waves (B, N'), classes (B,), crop) -> (B, crop)`.

    `classes[b]` indexes `factor_classes(factors)`; item b's first `input_length(crop, f)` samples
    are resampled and cut to `crop`. Items are grouped by factor, one `Resampler` call per group
    (per `chunk` rows of it, see `by_rows`)."""

    def __init__(self, factors: Sequence[float]):
        super().__init__()
        self.factors = factor_classes(factors)
        self.resamplers = torch.nn.ModuleList(Resampler(*resample_ratio(f)) for f in self.factors)

    def forward(self, waves: Tensor, classes: Tensor, crop: int, chunk: Optional[int] = None) -> Tensor:
        out = waves[:, :crop].to(torch.float32, copy=True)  # class 0 (speed 1) as read
        classes = classes.cpu()  # grouping on the host: a host batch's classes cost no device sync
        for c in torch.unique(classes).tolist():
            if c == 0:
                continue
            rows = (classes == c).nonzero().squeeze(1).to(waves.device, non_blocking=True)
            need = input_length(crop, self.factors[c])
            out[rows] = by_rows(self.resamplers[c], chunk, waves[rows, :need].float())[:, :crop]
        return out


def factor_classes(factors: Sequence[float]) -> List[float]:
    """The speed classes: 1.0 first (the unperturbed speakers keep class 0), then the other
    factors in config order, each once."""
    rest: List[float] = []
    for f in factors:
        resample_ratio(f)  # validates
        if float(f) != 1.0 and float(f) not in rest:
            rest.append(float(f))
    return [1.0, *rest]


def speed_speaker_names(speakers: Sequence[str], factors: Sequence[float]) -> List[str]:
    """The classifier's classes with speed perturbation as new speakers: the speakers, then for
    each other factor f (in `factor_classes` order) `sp<f>-<speaker>`, e.g. `sp0.9-id10001`."""
    names = list(speakers)
    for f in factor_classes(factors)[1:]:
        names += [f"sp{f:g}-{s}" for s in speakers]
    return names


def speed_labels(labels: Tensor, classes: Tensor, num_speakers: int) -> Tensor:
    """Speaker index + factor class x num_speakers, `(B,), (B,) -> (B,)`."""
    return labels + classes.to(labels.dtype) * num_speakers
