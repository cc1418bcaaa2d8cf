"""Speech activity detection: `(samples,)` float audio at 16 kHz -> speech regions `[(start, end), ...]` in
seconds, sorted and disjoint.

    vad = make_vad("silero")        # Silero VAD, the model file its PyPI package ships (no download)
    vad = make_vad("energy")        # frame energy against the file's own noise floor: no model, for tests
    regions = vad(wave16k)

Silero runs the package's sequence ONNX model (`silero_vad_16k_sequence.onnx`: every 32 ms frame of a
block in one onnxruntime call, the same probabilities as the frame-by-frame model) with the package's
threshold / hangover rule written out here (`hysteresis_regions`; tests/test_diarization.py checks it
against the package's `get_speech_timestamps_sequence`). The package itself is never imported: its
`__init__` imports torch, and diarization with an ONNX embedder runs without torch. Measured on the loaded
2-core machine: 0.62 s per minute of audio against 7.2 s for the TorchScript model's frame loop, the same
speech found (bench/diarization_vad.py; bench/RESULTS.md, "Diarization").

Both detectors are stateless between calls (onnxruntime sessions may be run from several threads at
once), so one detector serves concurrent diarizations.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Tuple

import numpy as np

VAD_RATE = 16000  # Hz: the rate every detector here reads
Interval = Tuple[float, float]
Detector = Callable[[np.ndarray], List[Interval]]


def runs(mask: np.ndarray) -> List[Tuple[int, int]]:
    """`(T,)` bool -> the `[start, end)` index ranges where it is True, in order."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def smooth_regions(regions: List[Interval], min_speech: float, min_silence: float, pad: float, end: float):
    """Regions with gaps shorter than `min_silence` filled, then those shorter than `min_speech` dropped,
    then each padded by `pad` seconds on both sides (clipped to [0, end], overlaps joined)."""
    joined: List[Interval] = []
    for s, e in regions:
        if joined and s - joined[-1][1] < min_silence:
            joined[-1] = (joined[-1][0], e)
        else:
            joined.append((s, e))
    out: List[Interval] = []
    for s, e in joined:
        if e - s < min_speech:
            continue
        s, e = max(0.0, s - pad), min(end, e + pad)
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


@dataclass(frozen=True)
class EnergyVad:
    """Frames (25 ms every 10 ms) whose energy is `margin` of the way from the file's noise floor (10th
    percentile of frame energies) to its loud level (99th), at least `min_margin_db` above the floor and
    `floor_db` dBFS in absolute terms, are speech; regions are then smoothed (`smooth_regions`).

    It knows no speech from other loud sounds: for tests and clean recordings. Pure digital silence and
    stationary noise give no speech."""

    margin: float = 0.3
    min_margin_db: float = 6.0
    floor_db: float = -60.0
    min_speech: float = 0.25
    min_silence: float = 0.3
    pad: float = 0.05

    def __call__(self, wave: np.ndarray) -> List[Interval]:
        frame, shift = VAD_RATE * 25 // 1000, VAD_RATE // 100
        x = np.asarray(wave, dtype=np.float64)
        if len(x) < frame:
            return []
        count = 1 + (len(x) - frame) // shift
        power = np.concatenate([[0.0], np.cumsum(x * x)])
        starts = np.arange(count) * shift
        db = 10.0 * np.log10((power[starts + frame] - power[starts]) / frame + 1e-12)
        low, high = np.percentile(db, [10, 99])
        threshold = max(self.floor_db, low + max(self.min_margin_db, self.margin * (high - low)))
        regions = [(s * shift / VAD_RATE, ((e - 1) * shift + frame) / VAD_RATE) for s, e in runs(db > threshold)]
        return smooth_regions(regions, self.min_speech, self.min_silence, self.pad, len(x) / VAD_RATE)


SILERO_FRAME, SILERO_CONTEXT = 512, 64  # samples at 16 kHz: one probability per frame, read with its context
SILERO_BLOCK = 512  # frames per onnxruntime call (16.4 s of audio)
SILERO_STATE = (1, 1, 128)  # the LSTM's h and c, carried from block to block


def silero_model_path() -> Path:
    """The sequence model file the silero-vad package ships. Found without importing the package, whose
    `__init__` imports torch."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the Silero VAD needs the silero-vad package: pip install -e '.[diarization]' in the speakerlab clone, "
            "or use --vad energy"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad_16k_sequence.onnx"
    if not path.is_file():
        raise ImportError(f"{path} is missing: the Silero VAD needs silero-vad >= 6.2 (its sequence model)")
    return path


def silero_session():
    """An onnxruntime session of `silero_model_path()` on one thread (the model is tiny: threads cost more
    than they bring)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ImportError(f"the Silero VAD runs on onnxruntime ({e}): pip install onnxruntime") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(str(silero_model_path()), options, providers=["CPUExecutionProvider"])


def silero_probabilities(session, wave: np.ndarray) -> np.ndarray:
    """`(samples,)` at 16 kHz -> `(ceil(samples / 512),)` speech probabilities, one per 32 ms frame (the last
    frame zero-padded). Each frame is fed with the 64 samples before it (zeros before the first). The inputs are
    made one block at a time: framing 3 hours at once would copy the audio twice over (1.5 GB, measured)."""
    x = np.ascontiguousarray(wave, dtype=np.float32).reshape(-1)
    count = -(-x.size // SILERO_FRAME)
    width = SILERO_CONTEXT + SILERO_FRAME
    h, c = np.zeros(SILERO_STATE, np.float32), np.zeros(SILERO_STATE, np.float32)
    out = []
    for a in range(0, count, SILERO_BLOCK):
        n = min(SILERO_BLOCK, count - a)
        start = a * SILERO_FRAME - SILERO_CONTEXT  # the block's first frame's context; before 0 at the first
        piece = np.zeros(SILERO_CONTEXT + n * SILERO_FRAME, np.float32)  # zeros before the start and past the end
        src = x[max(start, 0) : start + len(piece)]
        piece[max(-start, 0) : max(-start, 0) + len(src)] = src
        inputs = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(piece, width)[::SILERO_FRAME])
        p, h, c = session.run(["speech_probs", "hn", "cn"], {"input": inputs, "h": h, "c": c})
        out.append(np.asarray(p, np.float32).reshape(-1))
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def hysteresis_regions(
    probs: np.ndarray, num_samples: int, threshold: float, min_speech: int, min_silence: int, pad: int
) -> List[Tuple[int, int]]:
    """Frame probabilities -> speech `[start, end)` in samples, as the silero-vad package decides them.

    Speech starts at a frame >= `threshold`; it ends where the probability falls below threshold - 0.15
    (at least 0.01) and stays below `threshold` for `min_silence` samples; a region of at most `min_speech`
    samples is dropped. Each region is then widened by `pad` on both sides, a gap narrower than 2 x pad
    being split in the middle."""
    low = max(threshold - 0.15, 0.01)
    regions: List[List[int]] = []
    start, quiet_from = None, None  # quiet_from: where the current dip below `low` began
    for i, p in enumerate(np.asarray(probs, np.float64).tolist()):
        at = i * SILERO_FRAME
        if p >= threshold:
            quiet_from = None
            if start is None:
                start = at
            continue
        if start is not None and p < low:
            quiet_from = at if quiet_from is None else quiet_from
            if at - quiet_from >= min_silence:
                if quiet_from - start > min_speech:
                    regions.append([start, quiet_from])
                start, quiet_from = None, None
    if start is not None and num_samples - start > min_speech:
        regions.append([start, num_samples])
    for i, r in enumerate(regions):
        if i == 0:
            r[0] = max(0, r[0] - pad)
        if i + 1 < len(regions):
            gap = regions[i + 1][0] - r[1]
            widen = gap // 2 if gap < 2 * pad else pad
            r[1] = min(num_samples, r[1] + widen)
            regions[i + 1][0] = max(0, regions[i + 1][0] - widen)
        else:
            r[1] = min(num_samples, r[1] + pad)
    return [(a, b) for a, b in regions]


class SileroVad:
    """Silero VAD: the silero-vad package's sequence ONNX model on onnxruntime (torch-free) and its decision
    rule (`hysteresis_regions`): speech probability >= `threshold`, regions of at most `min_speech` seconds
    dropped, pauses shorter than `min_silence` kept inside, `pad` seconds added on each side. The model is
    loaded at the first call."""

    def __init__(self, threshold: float = 0.5, min_speech: float = 0.25, min_silence: float = 0.1, pad: float = 0.03):
        self.threshold = threshold
        self.samples = {
            k: int(round(VAD_RATE * v))
            for k, v in (("min_speech", min_speech), ("min_silence", min_silence), ("pad", pad))
        }
        self._session = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # its settings: the cache of speech regions (cache.py) is keyed by it
        return f"SileroVad(threshold={self.threshold}, samples={self.samples})"

    def __call__(self, wave: np.ndarray) -> List[Interval]:
        with self._lock:
            if self._session is None:
                self._session = silero_session()
        probs = silero_probabilities(self._session, wave)
        found = hysteresis_regions(probs, len(wave), self.threshold, **self.samples)
        return [(a / VAD_RATE, b / VAD_RATE) for a, b in found]


VADS = ("silero", "energy")


def make_vad(name: str) -> Detector:
    """A detector by name: `silero` or `energy` (see the module docstring)."""
    if name == "silero":
        return SileroVad()
    if name == "energy":
        return EnergyVad()
    raise ValueError(f"unknown VAD {name!r}: one of {', '.join(VADS)}")
