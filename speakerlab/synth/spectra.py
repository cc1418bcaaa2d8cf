"""The synthesiser's signal grid: 16 kHz, an STFT of 512-point sqrt-Hann frames every 128 samples (8 ms) and its
weighted overlap-add inverse, and the log-magnitude of formant resonators on that grid. voice.py shapes
sources frame by frame with them."""

from __future__ import annotations

import numpy as np

SR = 16000
N_FFT = 512
HOP = 128
FREQS = np.fft.rfftfreq(N_FFT, 1.0 / SR)  # (257,) Hz
# sqrt-Hann analysis and synthesis windows: their product (Hann) sums to 2 at a hop of N_FFT / 4.
_WIN = np.sqrt(np.hanning(N_FFT + 1)[:N_FFT]).astype(np.float64)
_OLA_GAIN = 2.0


def stft(x: np.ndarray) -> np.ndarray:
    """(N,) -> (T, 257) complex, T = N // HOP + 1 frames centred on multiples of HOP."""
    padded = np.pad(x, (N_FFT // 2, N_FFT // 2 + HOP))
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][: len(x) // HOP + 1]
    return np.fft.rfft(frames * _WIN, axis=1)


def istft(spec: np.ndarray, num_samples: int) -> np.ndarray:
    """Weighted overlap-add inverse of :func:`stft`: (T, 257) -> (num_samples,)."""
    frames = np.fft.irfft(spec, n=N_FFT, axis=1) * _WIN
    T, k = len(frames), N_FFT // HOP
    blocks = np.zeros((T + k - 1, HOP))
    for j in range(k):
        blocks[j : j + T] += frames[:, j * HOP : (j + 1) * HOP]
    return blocks.reshape(-1)[N_FFT // 2 : N_FFT // 2 + num_samples] / _OLA_GAIN


def resonances(formants: np.ndarray, bandwidths: np.ndarray) -> np.ndarray:
    """Log-magnitude of a cascade of 2-pole resonators, unity gain at DC.

    formants (T, K) Hz, bandwidths (K,) Hz -> (T, 257) natural log.
    """
    f2 = (FREQS**2).astype(formants.dtype)[None, :]
    power = np.ones((formants.shape[0], len(FREQS)), dtype=formants.dtype)
    # Analog-prototype magnitude |H|^2 = (F^2 + b^2)^2 / (((f-F)^2 + b^2)((f+F)^2 + b^2)), b = B/2,
    # multiplied over the resonators so that only one log is taken (the log is the slow part).
    for k in range(formants.shape[1]):
        F = formants[:, k : k + 1]
        b2 = (0.5 * bandwidths[k]) ** 2
        s = F * F + b2
        power *= s * s / ((f2 + s) ** 2 - 4.0 * f2 * F * F)
    return 0.5 * np.log(power)
