"""Audio of any sample rate and channel count for a model: read a whole file, keep its first channel,
resample it to the model's rate. Torch-free (numpy only): the diarization and ONNX paths run without torch.

    wave = read_for_model("call.wav", 16000)   # an 8 kHz stereo file -> (samples at 16 kHz,) float32

Training reads 16 kHz mono only (speakerlab.dataio.audio refuses anything else, so a mislabelled corpus is
caught); inference tools take what users have. Sample-rate conversion is `speakerlab.dataio.waveform.polyphase`'s numpy
executor (the filter of `scipy.signal.resample_poly` and of the torch `Resampler` of speed perturbation; on a
10-minute file it took 0.21 s where the torch conv1d took 1.9 s at 8 -> 16 kHz and 0.69 s at 44.1 -> 16 kHz, one
thread of the 2-core VM) with up / down = target / source in lowest terms:
8000 -> 16000 is 2 / 1, 44100 -> 16000 is 160 / 441. Its polyphase weights hold about
up x down + 20 x max(up, down) floats (44.1 kHz: 79 k; 11.025 kHz, 640 / 441: 295 k), so a ratio above
`MAX_WEIGHTS` (a rate like 16001 Hz) is refused rather than building a filter of gigabytes; every common
rate (8, 11.025, 12, 16, 22.05, 24, 32, 44.1, 48, 88.2, 96, 192 kHz) to 16 or 8 kHz is well below it.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Callable, Optional, Tuple

import numpy as np

from speakerlab.dataio.audio import AudioError, MultiChannelWarning, read_first_channel  # noqa: F401 (re-exported)
from speakerlab.dataio.waveform.polyphase import ZERO_CROSSINGS, phase_weights, polyphase

MAX_WEIGHTS = 1_000_000  # floats (4 MB) of polyphase weights; see the module docstring


def rate_ratio(source: int, target: int) -> Tuple[int, int]:
    """Sample rates -> (up, down), up / down = target / source in lowest terms (44100, 16000 -> (160, 441)).

    Raises ValueError for a rate that is not positive, or a ratio whose filter would exceed `MAX_WEIGHTS`."""
    if source <= 0 or target <= 0:
        raise ValueError(f"sample rates must be > 0, got {source} -> {target}")
    ratio = Fraction(int(target), int(source))
    up, down = ratio.numerator, ratio.denominator
    weights = up * down + 2 * ZERO_CROSSINGS * max(up, down)  # the (up, taps) phase weights, about
    if weights > MAX_WEIGHTS:
        raise ValueError(
            f"cannot resample {source} Hz -> {target} Hz: the ratio {up}/{down} needs a polyphase filter of "
            f"about {weights} weights (limit {MAX_WEIGHTS}); convert the file first (e.g. sox)"
        )
    return up, down


@lru_cache(maxsize=8)
def _weights(up: int, down: int) -> Tuple[int, np.ndarray]:
    # A tool embedding thousands of files at one rate builds the filter once.
    return phase_weights(up, down)


def resample(wave: np.ndarray, source: int, target: int) -> np.ndarray:
    """`(samples,)` float at `source` Hz -> `(ceil(samples x target / source),)` float32 at `target` Hz.

    The same values as `scipy.signal.resample_poly(wave, up, down)` up to float32 rounding (tests:
    within 1e-5 absolute for full-scale signals); the input itself when the rates are equal."""
    wave = np.asarray(wave, dtype=np.float32)
    if source == target:
        return wave
    up, down = rate_ratio(source, target)
    return polyphase(wave, up, down, _weights(up, down))


def read_for_model(path: str, sample_rate: int, warn: Optional[Callable[[str], None]] = None) -> np.ndarray:
    """A whole file of any rate and channel count -> `(samples at sample_rate,)` float32.

    Read by `speakerlab.dataio.audio.read_first_channel` (a multi-channel file gives its first channel, a
    message naming the file to `warn`); errors raise `AudioError` naming the file."""
    wave, sr = read_first_channel(path, warn)
    try:
        return resample(wave, int(sr), int(sample_rate))
    except ValueError as e:
        raise AudioError(f"{path}: {e}") from None
