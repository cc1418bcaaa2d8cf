"""The segmentation model's ONNX file run without torch: waveform -> powerset frame scores -> activities.

    segmenter = OnnxSegmenter("exp/segmentation/segmentation.onnx")
    scores = segmenter.scores(wave)            # (T, C) log-probabilities of the powerset classes, 20 ms frames
    active = segmenter.activities(wave)        # (T, K) 0/1: which local speaker talks in each frame

The file's metadata (written by speakerlab.diarization.segmentation.export_onnx) gives the frame layout and
the powerset classes, so nothing here depends on the model code.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple, Union

import numpy as np

from speakerlab.dataio.tables.rttm import Interval, merge_intervals

PREFIX = "speakerlab.segmentation."


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
        self.session = ort.InferenceSession(self.path, opts, providers=["CPUExecutionProvider"])
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

    def speaker_counts(self, wave: np.ndarray, window: float = 5.0) -> Tuple[np.ndarray, np.ndarray]:
        """(S,) wave at the model's rate -> counts (T,) int, how many speakers talk in each frame, and times
        (T,) each frame's centre in seconds. Windows of `window` seconds side by side (a count needs no matching
        of local speakers across windows); a piece shorter than two frames is zero-padded and keeps one."""
        step = int(window * self.sample_rate)
        counts, times = [], []
        for start in range(0, len(wave), step):
            piece = np.asarray(wave[start : start + step], np.float32)
            full = max(len(piece), self.kernel + self.hop)
            frames = max(1, 1 + (len(piece) - self.kernel) // self.hop)
            counts.append(self.activities(np.pad(piece, (0, full - len(piece)))).sum(-1)[:frames].astype(np.int64))
            times.append(start / self.sample_rate + self.frame_centres(frames))
        if not counts:
            return np.zeros(0, np.int64), np.zeros(0)
        return np.concatenate(counts), np.concatenate(times)

    def regions(self, wave: np.ndarray, window: float = 5.0) -> Tuple[List[Interval], List[Interval]]:
        """(S,) wave -> (speech, overlap): intervals in seconds where >= 1 and >= 2 speakers talk. A frame
        reaches halfway to its neighbours' centres (so windows side by side leave no gap), the first and last
        half a hop beyond their centres."""
        counts, times = self.speaker_counts(wave, window)
        if not len(times):
            return [], []
        half = self.hop / self.sample_rate / 2
        mids = (times[1:] + times[:-1]) / 2
        lo, hi = np.concatenate([[times[0] - half], mids]), np.concatenate([mids, [times[-1] + half]])
        return tuple(merge_intervals(zip(lo[counts >= k], hi[counts >= k])) for k in (1, 2))
