"""Source-filter voice model: per-speaker traits, random phone strings, per-session channel.

Everything is 16 kHz mono float32 in [-1, 1]. Synthesis works on an STFT grid (spectra.py: 512-point frames
every 128 samples, 8 ms): a glottal pulse train and a white-noise source are each transformed,
multiplied frame by frame by a spectral envelope (formant resonances / fricative shape / session
channel), and overlap-added back. That is a time-varying filter without a per-sample recursion,
so one 3 s utterance costs a few milliseconds of numpy.

Identity lives in things a mean-normalised log-mel keeps: F0 and its harmonics, the vocal-tract
scaling of each phone's formants plus a speaker-specific per-phone offset (idiolect), a fixed
extra resonance and nasal anti-resonance in voiced frames, formant bandwidths, voice quality
(glottal pulse shape, tilt, breathiness, jitter, shimmer) and speaking rate. The session (channel
EQ, coloured noise, level) is what an un-normalised long-term spectrum mostly sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .rooms import smooth_eq_db
from .spectra import FREQS, HOP, SR, istft, resonances, stft

# Phone inventory: name, kind, F1-F4 (Hz, adult-male reference), duration range (ms),
# voicing amplitude, noise amplitude, noise centre (Hz), noise width (octaves).
# Kinds: V vowel, A approximant, N nasal, F voiceless fricative, Z voiced fricative,
# P voiceless stop, B voiced stop. Obstruent formants are NaN: they take the neighbours' loci.
_NAN = float("nan")
PHONES = (
    ("i", "V", 270, 2290, 3010, 3700, 70, 170, 1.0, 0, 0, 0),
    ("I", "V", 390, 1990, 2550, 3600, 60, 130, 1.0, 0, 0, 0),
    ("E", "V", 530, 1840, 2480, 3600, 60, 150, 1.0, 0, 0, 0),
    ("ae", "V", 660, 1720, 2410, 3500, 80, 190, 1.0, 0, 0, 0),
    ("a", "V", 730, 1090, 2440, 3400, 80, 190, 1.0, 0, 0, 0),
    ("O", "V", 570, 840, 2410, 3400, 80, 180, 1.0, 0, 0, 0),
    ("U", "V", 440, 1020, 2240, 3400, 60, 130, 1.0, 0, 0, 0),
    ("u", "V", 300, 870, 2240, 3400, 70, 170, 1.0, 0, 0, 0),
    ("V", "V", 640, 1190, 2390, 3500, 60, 140, 1.0, 0, 0, 0),
    ("3", "V", 490, 1350, 1690, 3300, 80, 170, 1.0, 0, 0, 0),
    ("w", "A", 300, 610, 2200, 3300, 40, 80, 0.6, 0, 0, 0),
    ("j", "A", 260, 2070, 3020, 3700, 40, 80, 0.6, 0, 0, 0),
    ("l", "A", 360, 1000, 2800, 3500, 40, 80, 0.55, 0, 0, 0),
    ("r", "A", 310, 1060, 1380, 3200, 40, 80, 0.55, 0, 0, 0),
    ("m", "N", 250, 1100, 2200, 3300, 50, 90, 0.35, 0, 0, 0),
    ("n", "N", 250, 1700, 2600, 3400, 50, 90, 0.35, 0, 0, 0),
    ("s", "F", _NAN, _NAN, _NAN, _NAN, 70, 150, 0.0, 0.30, 6000, 0.8),
    ("S", "F", _NAN, _NAN, _NAN, _NAN, 70, 150, 0.0, 0.30, 3200, 0.9),
    ("f", "F", _NAN, _NAN, _NAN, _NAN, 60, 130, 0.0, 0.07, 5000, 2.5),
    ("h", "F", _NAN, _NAN, _NAN, _NAN, 40, 90, 0.0, 0.08, 1500, 2.0),
    ("z", "Z", _NAN, _NAN, _NAN, _NAN, 50, 110, 0.25, 0.18, 6000, 0.8),
    ("v", "Z", _NAN, _NAN, _NAN, _NAN, 40, 90, 0.3, 0.05, 5000, 2.5),
    ("p", "P", _NAN, _NAN, _NAN, _NAN, 50, 90, 0.0, 0.35, 1200, 2.5),
    ("t", "P", _NAN, _NAN, _NAN, _NAN, 50, 90, 0.0, 0.40, 4500, 1.5),
    ("k", "P", _NAN, _NAN, _NAN, _NAN, 50, 90, 0.0, 0.40, 2200, 1.0),
    ("b", "B", _NAN, _NAN, _NAN, _NAN, 40, 80, 0.08, 0.25, 1200, 2.5),
    ("d", "B", _NAN, _NAN, _NAN, _NAN, 40, 80, 0.08, 0.30, 4000, 1.5),
    ("g", "B", _NAN, _NAN, _NAN, _NAN, 40, 80, 0.08, 0.30, 2200, 1.0),
)
_KIND = np.array([p[1] for p in PHONES])
_FORMANTS = np.array([p[2:6] for p in PHONES], dtype=np.float64)  # (P, 4) Hz
_VOWELS = np.flatnonzero(_KIND == "V")
_CONSONANTS = np.flatnonzero(_KIND != "V")
# Sonorant consonants are drawn twice as often as obstruents: more voiced frames per second, and
# voiced frames are where the voice is.
_CONSONANT_P = np.where(np.isin(_KIND[_CONSONANTS], ["A", "N"]), 2.0, 1.0)
_CONSONANT_P /= _CONSONANT_P.sum()
_BANDWIDTHS = np.array([60.0, 90.0, 130.0, 180.0])  # Hz, F1-F4 at bandwidth scale 1


@dataclass
class SpeakerTraits:
    """Fixed voice of one speaker (units in the field comments)."""

    group: str  # "male" | "female" | "child": the population the traits were drawn around
    f0_mean: float  # Hz, centre of the intonation contour
    f0_range: float  # semitones, excursion of the intonation contour
    vtl: float  # formant scale (1 = adult-male reference vocal tract, > 1 = shorter tract)
    open_quotient: float  # fraction of each glottal cycle the glottis is open
    speed_quotient: float  # opening / closing duration of the Rosenberg pulse (skew)
    tilt: float  # dB per octave added above 500 Hz
    breathiness: float  # aspiration-noise level relative to the glottal pulse
    jitter: float  # per-cycle relative F0 perturbation (std)
    shimmer: float  # per-cycle relative amplitude perturbation (std)
    bandwidth: float  # formant-bandwidth scale
    nasality: float  # 0..1, nasal pole-zero pair strength in vowels
    nasal_zero: float  # Hz, frequency of the nasal anti-resonance
    extra_formant: float  # Hz, a speaker-specific resonance between F3 and F4 (voiced frames)
    rate: float  # speaking-rate factor (> 1 = faster)
    idiolect: np.ndarray  # (num_phones, 4) natural-log offsets of each phone's F1-F4

    def vector(self) -> np.ndarray:
        """Scalar traits as one (15,) float vector (for comparing speakers)."""
        return np.array(
            [
                self.f0_mean,
                self.f0_range,
                self.vtl,
                self.open_quotient,
                self.speed_quotient,
                self.tilt,
                self.breathiness,
                self.jitter,
                self.shimmer,
                self.bandwidth,
                self.nasality,
                self.nasal_zero,
                self.extra_formant,
                self.rate,
                float(np.abs(self.idiolect).sum()),
            ]
        )


def draw_speaker(rng: np.random.Generator) -> SpeakerTraits:
    """Draw one speaker's traits from the population (male 45 %, female 45 %, child 10 %)."""
    group = rng.choice(["male", "female", "child"], p=[0.45, 0.45, 0.10])
    f0_centre, vtl_centre = {"male": (115.0, 1.0), "female": (205.0, 1.16), "child": (270.0, 1.3)}[group]
    return SpeakerTraits(
        group=str(group),
        f0_mean=float(f0_centre * np.exp(rng.normal(0.0, 0.25))),
        f0_range=float(rng.uniform(0.6, 2.0)),
        vtl=float(vtl_centre * np.exp(rng.normal(0.0, 0.10))),
        open_quotient=float(rng.uniform(0.4, 0.8)),
        speed_quotient=float(rng.uniform(1.2, 4.0)),
        tilt=float(rng.uniform(-9.0, 3.0)),
        breathiness=float(np.exp(rng.uniform(np.log(0.03), np.log(1.5)))),
        jitter=float(rng.uniform(0.002, 0.02)),
        shimmer=float(rng.uniform(0.01, 0.10)),
        bandwidth=float(np.exp(rng.uniform(np.log(0.5), np.log(2.0)))),
        nasality=float(rng.uniform(0.2, 1.0)),
        nasal_zero=float(rng.uniform(700.0, 1800.0)),
        extra_formant=float(rng.uniform(2300.0, 4200.0)),
        rate=float(np.exp(rng.normal(0.0, 0.12))),
        # Idiolect: a speaker-specific accent on each phone, so identity shows in how the
        # formants move between phones and not only in their long-term average.
        idiolect=rng.normal(0.0, 0.10, size=(len(PHONES), 4)) * np.array([1.0, 1.0, 0.7, 0.4]),
    )


def _smooth(x: np.ndarray, width: int) -> np.ndarray:
    """Moving average over axis 0 with edge padding, same length: (T, ...) -> (T, ...)."""
    if width <= 1:
        return x
    pad = [(width // 2, width - 1 - width // 2)] + [(0, 0)] * (x.ndim - 1)
    c = np.cumsum(np.pad(x, pad, mode="edge"), axis=0)
    c = np.concatenate([np.zeros_like(c[:1]), c], axis=0)
    return (c[width:] - c[:-width]) / width


def _phone_track(traits: SpeakerTraits, num_frames: int, rng: np.random.Generator) -> dict:
    """Frame-level articulation for a random phone string filling ``num_frames`` 8 ms frames.

    Returns arrays of length T: formants (T, 4) Hz, voice / noise amplitude (T,), noise centre
    (T,) Hz and width (T,) octaves, nasal (T,) 0..1.
    """
    ms_per_frame = 1000.0 * HOP / SR
    rate = traits.rate * np.exp(rng.normal(0.0, 0.05))
    segments = []  # (phone index or -1 for silence, frames, part) with part in {"", "closure", "burst"}
    total = int(rng.integers(int(80 / ms_per_frame), int(300 / ms_per_frame)))
    segments.append((-1, total, ""))
    while True:  # at least one syllable, so that even a very short utterance has formants
        syllable = []
        if rng.random() < 0.75:
            syllable.append(int(rng.choice(_CONSONANTS, p=_CONSONANT_P)))
        syllable.append(int(rng.choice(_VOWELS)))
        if rng.random() < 0.35:
            syllable.append(int(rng.choice(_CONSONANTS, p=_CONSONANT_P)))
        for p in syllable:
            lo, hi = PHONES[p][6:8]
            n = max(2, int(round(rng.uniform(lo, hi) / rate / ms_per_frame)))
            if _KIND[p] in "PB":  # stop: closure, then a short burst
                burst = max(1, n // 4)
                segments += [(p, n - burst, "closure"), (p, burst, "burst")]
            else:
                segments.append((p, n, ""))
            total += n
        if rng.random() < 0.12:  # a word-boundary pause
            n = int(rng.integers(int(60 / ms_per_frame), int(250 / ms_per_frame)))
            segments.append((-1, n, ""))
            total += n
        if total >= num_frames:
            break

    formants = np.full((total + 1, 4), np.nan)
    vamp = np.zeros(total + 1)
    namp = np.zeros(total + 1)
    ncentre = np.full(total + 1, 3000.0)
    nwidth = np.full(total + 1, 2.0)
    nasal = np.full(total + 1, traits.nasality)
    t = 0
    for p, n, part in segments:
        s = slice(t, t + n)
        t += n
        if p < 0:
            continue
        kind = PHONES[p][1]
        if kind in "VAN":
            formants[s] = _FORMANTS[p] * traits.vtl * np.exp(traits.idiolect[p])
        if kind == "N":
            nasal[s] = 1.0
        voice, noise, centre, width = PHONES[p][8:12]
        if part == "closure":
            vamp[s] = voice  # voice bar of b d g; voiceless closures are silent
            continue
        vamp[s] = voice
        if noise > 0:
            namp[s] = noise * np.exp(rng.normal(0.0, 0.2))
            # Fricative and burst spectra move with the tract length too (shorter front cavity).
            ncentre[s] = centre * traits.vtl**0.7 * np.exp(traits.idiolect[p, 0])
            nwidth[s] = width
    # Obstruents and silences take formant loci interpolated from their neighbours; the
    # moving average then makes CV/VC transitions (coarticulation) of about 50 ms.
    valid = np.flatnonzero(~np.isnan(formants[:, 0]))
    idx = np.arange(total + 1)
    for k in range(4):
        formants[:, k] = np.interp(idx, valid, formants[valid, k])
    track = {
        "formants": _smooth(formants, 7),
        "vamp": _smooth(vamp, 3),
        "namp": _smooth(namp, 2),
        "ncentre": ncentre,
        "nwidth": nwidth,
        "nasal": _smooth(nasal, 5),
    }
    return {k: v[:num_frames] for k, v in track.items()}


def _f0_contour(traits: SpeakerTraits, num_frames: int, rng: np.random.Generator) -> np.ndarray:
    """Frame-level F0 (T,) Hz: declination + pitch accents + slow wander around the speaker's F0."""
    u = np.linspace(0.0, 1.0, num_frames)
    semitones = traits.f0_range * (0.5 - u) * rng.uniform(0.3, 1.0)
    frame_s = HOP / SR
    for centre in np.arange(rng.uniform(0.1, 0.4), num_frames * frame_s, rng.uniform(0.3, 0.6)):
        width = rng.uniform(0.06, 0.15) / frame_s
        bump = np.exp(-0.5 * ((np.arange(num_frames) - centre / frame_s) / width) ** 2)
        semitones += rng.uniform(0.3, 1.2) * traits.f0_range * bump
    semitones += 0.3 * traits.f0_range * _smooth(rng.normal(0, 3.0, num_frames), 25)
    semitones += rng.normal(0.0, 0.3)  # the speaker's day-to-day pitch offset
    return np.clip(traits.f0_mean * 2.0 ** (semitones / 12.0), 50.0, 600.0)


def _glottal_source(
    traits: SpeakerTraits, f0_frames: np.ndarray, num_samples: int, rng: np.random.Generator
) -> np.ndarray:
    """Rosenberg glottal-flow derivative with jitter, shimmer and pulsed aspiration: (N,)."""
    f0 = np.interp(np.arange(num_samples), np.arange(len(f0_frames)) * HOP, f0_frames)
    # Jitter and shimmer are drawn per glottal cycle: index the cycles by the unperturbed phase.
    cycles0 = (np.cumsum(f0) * (1.0 / SR)).astype(np.int64)
    f0 *= (1.0 + traits.jitter * rng.standard_normal(int(cycles0[-1]) + 2))[cycles0]
    phase = np.cumsum(f0) * (1.0 / SR)
    cycle = phase.astype(np.int64)
    # One period of the speaker's pulse, tabulated: a lookup is much cheaper than cosines per sample.
    oq, sq = traits.open_quotient, traits.speed_quotient
    t_open, t_close = oq * sq / (1.0 + sq), oq / (1.0 + sq)
    grid = np.linspace(0.0, 1.0, 1025)
    table = np.where(
        grid < t_open,
        0.5 * (1.0 - np.cos(np.pi * grid / t_open)),
        np.where(grid < oq, np.cos(0.5 * np.pi * (grid - t_open) / t_close), 0.0),
    )
    flow = np.interp(phase - cycle, grid, table)
    amp = np.clip(1.0 + traits.shimmer * rng.standard_normal(int(cycle[-1]) + 2), 0.2, None)[cycle]
    # Flow derivative per sample (lip radiation), rescaled per cycle so the level does not grow
    # with F0.
    source = np.diff(flow, prepend=0.0) * (SR / f0) * amp
    source += traits.breathiness * rng.standard_normal(num_samples) * (0.3 + flow)
    return source


def _vocal_tract(traits: SpeakerTraits, track: dict) -> np.ndarray:
    """Vocal-tract + source-tilt magnitude envelope per frame: (T, 257) linear, float32."""
    # Formant tracks are smoothed over ~7 frames, so every other frame is enough; the frames in
    # between are linear interpolations.
    half = track["formants"][::2].astype(np.float32)
    f5 = np.full((len(half), 1), 4400.0 * traits.vtl, dtype=np.float32)
    bandwidths = np.append(_BANDWIDTHS, 250.0).astype(np.float32) * np.float32(traits.bandwidth)
    log_env = resonances(np.concatenate([half, f5], axis=1), bandwidths)
    # Nasal coupling: an anti-resonance (zero) at the speaker's nasal-zero frequency and a low
    # nasal pole, both growing with the frame's nasal weight.
    zero = resonances(np.array([[traits.nasal_zero * traits.vtl]]), np.array([120.0]))
    pole = resonances(np.array([[270.0 * traits.vtl]]), np.array([100.0]))
    octaves = np.log2(np.maximum(FREQS, 500.0) / 500.0)
    tilt = (traits.tilt * np.log(10.0) / 20.0) * octaves[None, :]
    # The extra resonance (hypopharynx / piriform cavities) is fixed by anatomy, not articulation:
    # the same peak in every voiced frame, a per-frame cue that mean normalisation keeps.
    # An 18 dB Lorentzian bump, 400 Hz wide: a peak without the roll-off a resonator would add.
    extra = (18.0 * np.log(10.0) / 20.0) / (1.0 + ((FREQS - traits.extra_formant) / 200.0) ** 2)
    log_env += (track["nasal"][::2, None] * (0.6 * pole - zero) + extra + tilt).astype(np.float32)
    env = np.exp(log_env)
    out = np.empty((len(track["formants"]), env.shape[1]), dtype=np.float32)
    out[::2] = env
    following = np.concatenate([env[1:], env[-1:]])
    out[1::2] = (0.5 * (env + following))[: len(out) // 2]
    return out


def _frication(track: dict) -> np.ndarray:
    """Fricative / burst noise log envelope per frame: (T, 257) natural log (amplitude folded in)."""
    octaves = np.log2(np.maximum(FREQS, 50.0)[None, :] / track["ncentre"][:, None])
    shape = -0.5 * (octaves / (0.5 * track["nwidth"][:, None])) ** 2
    return shape + np.log(track["namp"][:, None] + 1e-6)


@dataclass
class Session:
    """One recording session: channel, background noise and level."""

    eq_db: np.ndarray  # (257,) dB channel gain on the STFT bins (microphone, room colouring)
    snr_db: float  # speech-to-noise power ratio, dB
    noise_db: np.ndarray  # (257,) dB background-noise spectrum shape
    noise_drift: float  # 0..0.5, depth of a slow noise-level modulation
    level_db: float  # RMS level of the result, dBFS


def draw_session(
    rng: np.random.Generator,
    eq_std_db: float = 5.0,
    snr_range: tuple = (15.0, 40.0),
    level_range: tuple = (-32.0, -14.0),
    band_limit_prob: float = 0.2,
) -> Session:
    """Random channel (smooth EQ, sometimes band-limited), coloured noise at an SNR, and level.

    ``eq_std_db`` is the typical std of the channel gain over frequency, ``snr_range`` and
    ``level_range`` (dBFS) are uniform ranges, ``band_limit_prob`` the chance of a band limit.
    """
    f = np.maximum(FREQS, 20.0)
    eq = smooth_eq_db(FREQS, rng, eq_std_db)
    if rng.random() < band_limit_prob:  # band-limited microphone / codec: 24 dB/octave outside [lo, hi]
        lo, hi = rng.uniform(80.0, 300.0), rng.uniform(3400.0, 7500.0)
        eq = eq - 24.0 * (np.log2(np.maximum(lo / f, 1.0)) + np.log2(np.maximum(f / hi, 1.0)))
    # Background noise is mostly low-frequency heavy (fans, traffic, rooms): -7 to -1 dB/octave.
    noise = rng.uniform(-7.0, -1.0) * np.log2(f / 1000.0) + smooth_eq_db(FREQS, rng, 4.0)
    drift = rng.uniform(0.0, 0.5) if rng.random() < 0.3 else 0.0
    return Session(
        eq_db=eq,
        snr_db=float(rng.uniform(*snr_range)),
        noise_db=noise,
        noise_drift=float(drift),
        level_db=float(rng.uniform(*level_range)),
    )


def synth_utterance(
    traits: SpeakerTraits, num_samples: int, rng: np.random.Generator, session: Session | None = None
) -> np.ndarray:
    """One utterance of ``num_samples`` samples at 16 kHz: float32 (N,) in [-1, 1].

    Without ``session`` the result is clean speech at -20 dBFS with no channel (used for the
    speech-like interference of the MUSAN-style set).
    """
    T = num_samples // HOP + 1
    track = _phone_track(traits, T, rng)
    source = _glottal_source(traits, _f0_contour(traits, T, rng), num_samples, rng)
    # Voicing amplitude is applied to the source before filtering, so that onsets stay sharp.
    source *= np.interp(np.arange(num_samples), np.arange(T) * HOP, track["vamp"])
    white = stft(rng.standard_normal(num_samples))
    spec = stft(source) * _vocal_tract(traits, track) + white * np.exp(_frication(track))
    if session is not None:
        spec *= (10.0 ** (session.eq_db / 20.0))[None, :]
        # Background noise shares the white STFT with the frication: a sum of independent and of
        # shared noise is the same Gaussian noise up to level, and it saves a transform. The SNR
        # is set on STFT energies, which are proportional to the waveform energies.
        noise = white * (10.0 ** (session.noise_db / 20.0))[None, :]
        if session.noise_drift > 0:
            t = np.arange(T) * (HOP / SR)
            noise *= (
                1.0 + session.noise_drift * np.sin(2 * np.pi * rng.uniform(0.1, 1.0) * t + rng.uniform(0.0, 2 * np.pi))
            )[:, None]
        ratio = np.sum(np.abs(spec) ** 2) / (np.sum(np.abs(noise) ** 2) + 1e-12)
        spec += noise * np.sqrt(ratio * 10.0 ** (-session.snr_db / 10.0))
    out = istft(spec, num_samples)
    level = -20.0 if session is None else session.level_db
    out *= 10.0 ** (level / 20.0) / (np.sqrt(np.mean(out**2)) + 1e-9)
    peak = np.max(np.abs(out))
    if peak > 0.99:  # keep int16 from clipping: loud sessions are simply a little quieter
        out *= 0.99 / peak
    return out.astype(np.float32)
