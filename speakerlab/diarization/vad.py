"""Speech activity detection: `(samples,)` float audio at 16 kHz -> speech regions `[(start, end), ...]` in
seconds, sorted and disjoint.

    vad = make_vad("silero")        # Silero VAD, the model file its PyPI package ships (no download)
    vad = make_vad("energy")        # frame energy against the file's own noise floor: no model, for tests
    regions = vad(wave16k)

Silero runs the package's sequence ONNX model (`silero_vad_16k_sequence.onnx`: every 32 ms frame of a
block in one onnxruntime call, the same probabilities as the frame-by-frame model) and the package's own
threshold / hangover logic (`get_speech_timestamps_from_probs` via `get_speech_timestamps_sequence`).
Measured on the loaded 2-core machine: 0.62 s per minute of audio against 7.2 s for the TorchScript
model's frame loop, the same speech found (bench/diarization_vad.py; bench/RESULTS.md, "Diarization").
Importing `silero_vad` sets torch's thread count to 1 as a side effect; `SileroVad` puts the caller's
count back.

Both detectors are stateless between calls (onnxruntime sessions may be run from several threads at
once), so one detector serves concurrent diarizations.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
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


_SILERO_LOCK = threading.Lock()


def _load_silero():
    """(the sequence model, `get_speech_timestamps_sequence`); ImportError naming the extra when absent."""
    from speakerlab.commands import require_torch

    torch = require_torch("the Silero VAD (the silero-vad package)", "use --vad energy")

    with _SILERO_LOCK:
        threads = torch.get_num_threads()
        try:
            from silero_vad import get_speech_timestamps_sequence, load_silero_vad
        except ImportError as e:
            raise ImportError(
                f"the Silero VAD needs the silero-vad and onnxruntime packages ({e}): "
                "pip install -e '.[diarization]' in the speakerlab clone, or use --vad energy"
            ) from None
        finally:
            torch.set_num_threads(threads)  # silero_vad.model sets 1 at import
        try:
            with warnings.catch_warnings():  # its importlib.resources.path call is deprecated in 3.11
                warnings.simplefilter("ignore", DeprecationWarning)
                return load_silero_vad(sequence=True), get_speech_timestamps_sequence
        except ImportError as e:
            raise ImportError(
                f"the Silero VAD's sequence model runs on onnxruntime ({e}): pip install onnxruntime"
            ) from None


class SileroVad:
    """Silero VAD with the package's post-processing: speech probability >= `threshold` (leaving speech
    below threshold - 0.15), regions shorter than `min_speech` dropped, pauses shorter than `min_silence`
    kept inside, `pad` seconds added on each side. The model is loaded at the first call."""

    def __init__(self, threshold: float = 0.5, min_speech: float = 0.25, min_silence: float = 0.1, pad: float = 0.03):
        self.options = {
            "threshold": threshold,
            "min_speech_duration_ms": int(round(1000 * min_speech)),
            "min_silence_duration_ms": int(round(1000 * min_silence)),
            "speech_pad_ms": int(round(1000 * pad)),
        }
        self._model = None
        self._lock = threading.Lock()

    def __call__(self, wave: np.ndarray) -> List[Interval]:
        with self._lock:
            if self._model is None:
                self._model = _load_silero()
        model, timestamps = self._model
        stamps = timestamps(np.ascontiguousarray(wave, dtype=np.float32), model, sampling_rate=VAD_RATE, **self.options)
        return [(s["start"] / VAD_RATE, s["end"] / VAD_RATE) for s in stamps]


VADS = ("silero", "energy")


def make_vad(name: str) -> Detector:
    """A detector by name: `silero` or `energy` (see the module docstring)."""
    if name == "silero":
        return SileroVad()
    if name == "energy":
        return EnergyVad()
    raise ValueError(f"unknown VAD {name!r}: one of {', '.join(VADS)}")
