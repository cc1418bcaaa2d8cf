"""The segmentation model's ONNX file run without torch: waveform -> powerset frame scores -> activities.

    segmenter = OnnxSegmenter("exp/segmentation/segmentation.onnx")
    scores = segmenter.scores(wave)            # (T, C) log-probabilities of the powerset classes, 20 ms frames
    active = segmenter.activities(wave)        # (T, K) 0/1: which local speaker talks in each frame
    acts, step = segmenter.sliding(wave, 5.0, 2.5)   # (W, T, K) of windows every `step` frames

The file's metadata (written by speakerlab.diarization.segmentation.export_onnx) gives the frame layout and
the powerset classes, so nothing here depends on the model code.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional, Tuple, Union

import numpy as np

PREFIX = "speakerlab.segmentation."


def window_layout(num_samples: int, window: float, step: float, rate: int, kernel: int, hop: int):
    """Windows of `window` s every `step` s (a whole number of frames of `hop` samples, at least one) over
    `num_samples` samples -> (samples per window, samples between window starts, number of windows): enough
    windows that the last reaches the end, one for a shorter recording."""
    size = max(int(round(window * rate)), kernel + hop)
    stride = max(1, int(round(step * rate / hop))) * hop
    return size, stride, 1 + max(0, int(np.ceil((num_samples - size) / stride)))


class SegmentationFileError(ValueError):
    """The file is not a segmentation model's ONNX export."""


class OnnxSegmenter:
    """A segmentation model's ONNX file: waves at its sample rate -> frame scores."""

    def __init__(self, path: Union[str, Path], threads: Optional[int] = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.path = str(path)
        if not Path(path).is_file():
            raise SegmentationFileError(f"{self.path}: no such file")
        # Read once: the session is built from these bytes, and their digest keys this model's activities in a
        # diarization cache (cache.py).
        model = Path(path).read_bytes()
        self.model_id = hashlib.sha256(model).hexdigest()[:20]
        try:
            self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's own error types (InvalidProtobuf, Fail, ...) share no base of theirs
            raise SegmentationFileError(f"{self.path}: not an ONNX model onnxruntime can load ({e})") from None
        meta = self.session.get_modelmeta().custom_metadata_map
        try:
            self.sample_rate = int(meta[PREFIX + "sample_rate"])
            self.kernel = int(meta[PREFIX + "kernel"])
            self.hop = int(meta[PREFIX + "hop"])
            classes = [tuple(int(s) for s in c.split(",") if s) for c in meta[PREFIX + "powerset"].split(";")]
        except (KeyError, ValueError) as e:
            raise SegmentationFileError(f"{self.path}: no segmentation metadata ({e})") from None
        self.num_local = 1 + max(max(c, default=-1) for c in classes)
        # (C, K): the local speakers of each class.
        self.powerset = np.zeros((len(classes), self.num_local), np.float32)
        for i, members in enumerate(classes):
            self.powerset[i, list(members)] = 1.0

    def frame_centres(self, num_frames: int) -> np.ndarray:
        """(T,) each frame's centre in seconds from the wave's start."""
        return (np.arange(num_frames) * self.hop + self.kernel / 2) / self.sample_rate

    def scores(self, waves: np.ndarray) -> np.ndarray:
        """(B, S) or (S,) float32 waves -> (B, T, C) or (T, C) log-probabilities of the powerset classes."""
        x = np.asarray(waves, np.float32)
        batch = x[None] if x.ndim == 1 else x
        logits = self.session.run(None, {"wave": batch})[0]
        shifted = logits - logits.max(-1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        return logp[0] if x.ndim == 1 else logp

    def activities(self, waves: np.ndarray) -> np.ndarray:
        """(B, S) or (S,) -> (B, T, K) or (T, K) 0/1 float32: the local speakers of each frame's best class."""
        return self.powerset[self.scores(waves).argmax(-1)]

    def sliding(
        self, wave: np.ndarray, window: float = 5.0, step: float = 2.5, batch: int = 32
    ) -> Tuple[np.ndarray, int]:
        """(S,) wave at the model's rate -> activities (W, T, K) 0/1 float32 of windows of `window` seconds every
        `step` seconds (rounded to whole frames), and that step in frames: frame t of window w is frame
        w * step + t of the recording (its centre: `frame_centres`). The wave is zero-padded so that the last
        window reaches its end; a wave shorter than a window is one window."""
        size, stride, count = window_layout(len(wave), window, step, self.sample_rate, self.kernel, self.hop)
        padded = np.zeros((count - 1) * stride + size, np.float32)
        padded[: len(wave)] = wave
        out = []
        for first in range(0, count, batch):
            starts = range(first * stride, min(first + batch, count) * stride, stride)
            out.append(self.activities(np.stack([padded[a : a + size] for a in starts])))
        return np.concatenate(out), stride // self.hop
