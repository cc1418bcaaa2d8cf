"""Synthetic noise, music and room impulse responses (16 kHz float64 numpy, no voice model).

These stand in for MUSAN and RIRS_NOISES in the offline mini recipe: small, deterministic
given the generator, and shaped like the real thing closely enough for augmentation code
(stationary coloured noise, tonal music with note onsets, exponentially decaying RIRs with a
direct path and early reflections).
"""

from __future__ import annotations

import numpy as np

SR = 16000
# RT60 range (s) of each simulated room size, after the Kaldi RIRS_NOISES naming.
ROOM_RT60 = {"smallroom": (0.15, 0.35), "mediumroom": (0.35, 0.7), "largeroom": (0.7, 1.2)}


def smooth_eq_db(freqs: np.ndarray, rng: np.random.Generator, std_db: float, num_terms: int = 6) -> np.ndarray:
    """Random smooth gain curve over ``freqs`` (Hz, any shape): dB, same shape, zero mean.

    A sum of cosines on a log-frequency axis (50 Hz - 8 kHz), so the curve has a few broad
    bumps the way microphones and rooms colour speech; its std is ``std_db`` times U(0.5, 1.5).
    """
    u = np.log(np.clip(freqs, 50.0, 8000.0) / 50.0) / np.log(8000.0 / 50.0)
    k = np.arange(1, num_terms + 1)
    amp = rng.standard_normal(num_terms) / np.sqrt(k)  # broad bumps dominate
    ph = rng.uniform(0.0, 2.0 * np.pi, num_terms)
    curve = (amp[:, None] * np.cos(np.pi * k[:, None] * u.reshape(1, -1) + ph[:, None])).sum(0)
    curve = curve - curve.mean()
    curve *= std_db * rng.uniform(0.5, 1.5) / (curve.std() + 1e-9)
    return curve.reshape(np.shape(freqs))


def coloured_noise(
    num_samples: int, rng: np.random.Generator, slope_db: float = -3.0, eq_std_db: float = 4.0
) -> np.ndarray:
    """Stationary noise with a spectral slope (dB/octave re 1 kHz) and a random smooth EQ.

    Returns (num_samples,) float64 at unit RMS. Sometimes adds mains hum or a slow level
    modulation, as in recordings.
    """
    n_fft = num_samples + (num_samples % 2)
    freqs = np.fft.rfftfreq(n_fft, 1.0 / SR)
    coarse = np.linspace(0.0, SR / 2, 257)  # the EQ is smooth: evaluate it coarsely, interpolate
    eq_db = np.interp(freqs, coarse, smooth_eq_db(coarse, rng, eq_std_db))
    gain_db = slope_db * np.log2(np.maximum(freqs, 20.0) / 1000.0) + eq_db
    spec = np.fft.rfft(rng.standard_normal(n_fft)) * 10.0 ** (gain_db / 20.0)
    x = np.fft.irfft(spec, n=n_fft)[:num_samples]
    x /= np.sqrt(np.mean(x**2)) + 1e-12
    t = np.arange(num_samples) / SR
    if rng.random() < 0.15:  # mains hum: 50 or 60 Hz and a few harmonics
        base = rng.choice([50.0, 60.0])
        hum = sum(np.sin(2 * np.pi * base * h * t + rng.uniform(0, 6.3)) / h for h in range(1, 5))
        x += rng.uniform(0.3, 1.0) * hum
    if rng.random() < 0.3:  # slow level drift (passing traffic, fans)
        x *= 1.0 + 0.5 * np.sin(2 * np.pi * rng.uniform(0.1, 1.0) * t + rng.uniform(0, 6.3))
    return x / (np.sqrt(np.mean(x**2)) + 1e-12)


def music(num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Tonal "music": 1-3 voices of harmonic notes on a random scale, with decaying envelopes.

    Returns (num_samples,) float64 at unit RMS.
    """
    t_all = np.arange(num_samples) / SR
    out = np.zeros(num_samples)
    root = rng.integers(40, 60)  # MIDI note
    scale = np.array([0, 2, 4, 5, 7, 9, 11]) if rng.random() < 0.5 else np.array([0, 2, 3, 5, 7, 8, 10])
    for voice in range(int(rng.integers(1, 4))):
        beat = rng.uniform(0.15, 0.6)  # s per note
        decay = rng.uniform(2.0, 12.0)  # 1/s
        n_harm = int(rng.integers(3, 10))
        harm_amp = rng.uniform(0.2, 1.0, n_harm) / np.arange(1, n_harm + 1) ** rng.uniform(0.5, 1.5)
        start = 0.0
        while start < num_samples / SR:
            note = root + 12 * voice + scale[rng.integers(len(scale))] + 12 * rng.integers(0, 2)
            f0 = 440.0 * 2.0 ** ((note - 69) / 12.0)
            dur = beat * rng.choice([1, 1, 2, 0.5])
            a, b = int(start * SR), min(num_samples, int((start + dur) * SR))
            t = t_all[a:b] - start
            h = np.arange(1, n_harm + 1)[:, None]
            keep = (h[:, 0] * f0) < 7500.0  # no partials above 7.5 kHz (no aliasing)
            tone = (harm_amp[keep, None] * np.sin(2 * np.pi * f0 * h[keep] * t[None, :])).sum(0)
            env = np.minimum(t / 0.01, 1.0) * np.exp(-decay * t)
            out[a:b] += tone * env * rng.uniform(0.5, 1.0)
            start += dur
    return out / (np.sqrt(np.mean(out**2)) + 1e-12)


def babble(utterances: list) -> np.ndarray:
    """Sum of several speech signals (list of equal-length (N,) arrays) at unit RMS: (N,)."""
    x = np.sum(np.stack(utterances), axis=0)
    return x / (np.sqrt(np.mean(x**2)) + 1e-12)


def rir(rng: np.random.Generator, rt60: float) -> np.ndarray:
    """Room impulse response for reverberation time ``rt60`` (s): (N,) float64, peak 1.

    Direct path after a 1-10 ms propagation delay, 6-20 sparse early reflections in the next
    ~50 ms, then an exponentially decaying noise tail (-60 dB at rt60) whose high frequencies
    die faster, as air and wall absorption make them.
    """
    length = int(min(1.2 * rt60 + 0.05, 1.5) * SR)
    h = np.zeros(length)
    delay = int(rng.uniform(0.001, 0.01) * SR)
    h[delay] = 1.0
    n_early = int(rng.integers(6, 21))
    early_t = delay + (rng.uniform(0.002, 0.05, n_early) * SR).astype(int)
    early_gain = rng.uniform(0.2, 0.7, n_early) * rng.choice([-1.0, 1.0], n_early)
    early_gain *= np.exp(-6.9 * (early_t - delay) / SR / rt60)
    np.add.at(h, early_t, early_gain)
    t = np.arange(length) / SR
    tail_start = delay + int(rng.uniform(0.01, 0.03) * SR)
    tail = rng.standard_normal(length) * np.exp(-6.9 * t / rt60)
    # Second, faster-decaying band: a first difference of the noise is mostly high frequency.
    tail_hf = np.diff(rng.standard_normal(length + 1)) * np.exp(-6.9 * t / (0.5 * rt60))
    tail = 0.6 * tail + 0.3 * tail_hf
    tail[:tail_start] = 0.0
    h += rng.uniform(0.1, 0.3) * tail * np.exp(6.9 * (tail_start / SR) / rt60)
    return h / np.max(np.abs(h))
