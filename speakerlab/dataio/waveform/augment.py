"""Training-time augmentation, worker side: every random draw, and the int16 audio those draws pick.

Kinds (unchanged from the per-sample CPU augmenter this replaces; `speakerlab.train.inputs.pipeline` does
the arithmetic, batched on the training device). With probability `prob` a crop gets exactly ONE
augmentation, drawn uniformly among the enabled kinds:
  reverb  convolution with a random RIR, aligned on its direct path, input power kept
  noise   a random crop of a noise file at an SNR drawn uniformly from `snr["noise"]` (dB)
  music   the same with music files and `snr["music"]`
  babble  3-7 (`babble_speakers`) speech files at equal level, summed, added at `snr["babble"]`
With `reverb_noise_prob` > 0, a reverberated crop also gets, with that probability, one of the
enabled additive kinds on top (reverberant speech in a noisy room). Apart from those, with `eq_prob` a crop's
speech is coloured by a random smooth equaliser (`eq_db` dB std at EQ_HZ; after reverb, before the additive part).

The audio comes from a `speakerlab.dataio.waveform.noise_bank.NoiseBank` (memory-mapped int16, built once by
`speakerlab-noise-bank`); every draw comes from the generator the caller passes (the
per-item generator of `speakerlab.dataio.loaders.batches.CropDataset`), so the samples of an optimizer step are
the same on any hardware and with any number of loader workers.

`reference_wave` is the per-sample float64 numpy / scipy path (scipy.signal.resample_poly,
fftconvolve): the tests check the batched device path against it, and bench/data_pipeline.py
times it as the per-sample pipeline.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.augment_settings import DEFAULT_BABBLE_SPEAKERS, DEFAULT_SNR
from speakerlab.dataio.waveform.noise_bank import KINDS, NoiseBank, bank_problem, build_bank
from speakerlab.dataio.waveform.speed import input_length, resample_ratio

INT16_SCALE = 1.0 / 32768.0  # int16 -> float as soundfile reads PCM_16 (the features' input scale)
# The random equaliser's control points (Hz): 10 log-spaced from 60 Hz to 8 kHz; gains hold flat outside them.
EQ_HZ = tuple(float(f) for f in np.geomspace(60.0, 8000.0, 10))


def eq_curve(gains_db: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """The equaliser's gain `(F,)` in dB at `freqs` (Hz) from its gains `(len(EQ_HZ),)` at EQ_HZ: linear in
    log-frequency between the points (numpy; the training pipeline has the batched torch twin)."""
    return np.interp(np.log(np.maximum(freqs, EQ_HZ[0])), np.log(EQ_HZ), gains_db)


@dataclass(frozen=True)
class Draw:
    """What one crop got: `kind` None when clean (of `prob`'s kinds), else e.g. "noise" or "reverb+music"; `rir` the
    RIR index (-1: none); `snr_db` the SNR of the additive part (nan: none); `sources` the bank files of the additive
    part."""

    kind: Optional[str] = None
    rir: int = -1
    snr_db: float = math.nan
    sources: Tuple[int, ...] = ()
    eq_db: Tuple[float, ...] = ()  # the random equaliser's gains at EQ_HZ (none: not equalised)


@dataclass
class Picked:
    """A crop's augmentation audio, int16 from the bank: `rir` `(L,)` or None, `noise` a list of
    `(crop,)` segments (one per babble talker, one for noise or music, none when not additive)."""

    draw: Draw
    rir: Optional[np.ndarray]
    noise: List[np.ndarray]


class Augmenter:
    """Draws the augmentation of one crop and picks its audio from `bank`, see the module docstring.

    `snr`: {kind: (lo, hi) dB} overriding DEFAULT_SNR; `babble_speakers`: (lo, hi) files summed.
    Raises ValueError when the bank lacks files of an enabled kind."""

    def __init__(
        self,
        bank: NoiseBank,
        prob: float = 0.6,
        kinds: Sequence[str] = KINDS,
        snr: Optional[Dict[str, Sequence[float]]] = None,
        babble_speakers: Sequence[int] = DEFAULT_BABBLE_SPEAKERS,
        reverb_noise_prob: float = 0.0,
        eq_prob: float = 0.0,
        eq_db: float = 5.0,
    ):
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown or not kinds:
            raise ValueError(f"augmentation kinds must be a non-empty subset of {KINDS}, got {list(kinds)}")
        if not all(0.0 <= p <= 1.0 for p in (prob, reverb_noise_prob, eq_prob)):
            raise ValueError(
                f"augmentation probabilities must be in [0, 1], got {prob}, {reverb_noise_prob}, {eq_prob}"
            )
        empty = [k for k in kinds if bank.count(k) == 0]
        if empty:
            raise ValueError(f"noise bank {bank.root} has no files of kind(s) {empty}")
        self.bank, self.prob, self.kinds = bank, float(prob), tuple(kinds)
        self.snr = {k: tuple(map(float, v)) for k, v in {**DEFAULT_SNR, **(snr or {})}.items()}
        self.babble_speakers = (int(babble_speakers[0]), int(babble_speakers[1]))
        self.reverb_noise_prob = float(reverb_noise_prob)
        self.eq_prob, self.eq_db = float(eq_prob), float(eq_db)
        self.additive = tuple(k for k in self.kinds if k != "reverb")

    def describe(self) -> str:
        """One line for the training log."""
        parts = []
        for k in self.kinds:
            extra = "" if k == "reverb" else f" {self.snr[k][0]:g}-{self.snr[k][1]:g} dB"
            if k == "babble":
                extra += f" x {self.babble_speakers[0]}-{self.babble_speakers[1]} speakers"
            parts.append(f"{k} ({self.bank.count(k)} files{extra})")
        both = ""
        if self.reverb_noise_prob > 0 and "reverb" in self.kinds and self.additive:
            both = f"; reverb + an additive kind with probability {self.reverb_noise_prob:g} of reverb"
        if self.eq_prob > 0:
            both += f"; a random equaliser ({self.eq_db:g} dB std, {EQ_HZ[0]:g}-{EQ_HZ[-1]:g} Hz) with probability "
            both += f"{self.eq_prob:g}"
        return f"augmentation with probability {self.prob:g}, one of: {', '.join(parts)}{both} from {self.bank.root}"

    def pick(self, rng: np.random.Generator, n: int) -> Picked:
        """The draws for a crop of `n` samples, and their audio. Draws: one uniform for `prob`, then
        (only when augmenting) the kind and that kind's own draws; after reverb, one uniform for
        `reverb_noise_prob` when it is > 0; last, when `eq_prob` > 0, one uniform for it and (when equalising) the
        gains (so the default draws do not depend on the options)."""
        picked = self._pick(rng, n)
        if self.eq_prob > 0 and rng.random() < self.eq_prob:
            gains = tuple(float(g) for g in rng.normal(0.0, self.eq_db, len(EQ_HZ)))
            picked.draw = dataclasses.replace(picked.draw, eq_db=gains)
        return picked

    def _pick(self, rng: np.random.Generator, n: int) -> Picked:
        if rng.random() >= self.prob:
            return Picked(Draw(), None, [])
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        if kind != "reverb":
            return self._additive(kind, rng, n, -1, None)
        rir_index = int(rng.integers(self.bank.count("reverb")))
        rir = np.array(self.bank.segment("reverb", rir_index))
        if self.reverb_noise_prob > 0 and self.additive and rng.random() < self.reverb_noise_prob:
            extra = self.additive[int(rng.integers(len(self.additive)))]
            return self._additive(extra, rng, n, rir_index, rir)
        return Picked(Draw("reverb", rir_index), rir, [])

    def _additive(
        self, kind: str, rng: np.random.Generator, n: int, rir_index: int, rir: Optional[np.ndarray]
    ) -> Picked:
        pool = self.bank.count(kind)
        if kind == "babble":
            lo, hi = self.babble_speakers
            count = int(rng.integers(lo, hi + 1))
            # Distinct talkers when the list has enough of them; a tiny list repeats files.
            picks = [int(i) for i in rng.choice(pool, size=count, replace=pool < count)]
        else:
            picks = [int(rng.integers(pool))]
        noise = [self.bank.crop(kind, i, n, rng) for i in picks]
        snr_db = float(rng.uniform(*self.snr[kind]))
        name = kind if rir is None else f"reverb+{kind}"
        return Picked(Draw(name, rir_index, snr_db, tuple(picks)), rir, noise)


def open_augmenter(settings, sample_rate: int, log=print) -> Augmenter:
    """The augmenter of config section `augment` (speakerlab.augment_settings.AugmentSettings) with `lists` set.

    Opens the bank (`bank`, default `<lists>/bank`), building it first when it is missing or older
    than the lists (every list problem is then reported at once, as `list:line:`)."""
    lists = Path(settings.lists)
    root = Path(settings.bank) if settings.bank else lists / "bank"
    stale = bank_problem(root, lists, settings.kinds, sample_rate)
    if stale is not None:
        log(f"{stale}: building it (speakerlab-noise-bank --lists {lists} --out {root})")
        build_bank(lists, root, settings.kinds, sample_rate, log)
    snr = {"noise": settings.noise_snr, "music": settings.music_snr, "babble": settings.babble_snr}
    aug = Augmenter(
        NoiseBank(root),
        settings.prob,
        settings.kinds,
        snr,
        settings.babble_speakers,
        settings.reverb_noise_prob,
        settings.eq_prob,
        settings.eq_db,
    )
    log(aug.describe())
    return aug


# ---- the per-sample float64 reference path (numpy / scipy) ----


def power(x: np.ndarray) -> float:
    """Mean square of a signal (float64 accumulation)."""
    return float(np.mean(np.square(x, dtype=np.float64))) if x.size else 0.0


def add_at_snr(wave: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """`wave + g * noise` with g chosen so that 10 log10(P(wave) / P(g noise)) = snr_db. Both `(N,)`.

    A silent wave or silent noise has no defined SNR: the wave is returned unchanged then."""
    pw, pn = power(wave), power(noise)
    if pw == 0.0 or pn == 0.0:
        return wave
    return wave + np.sqrt(pw / (pn * 10.0 ** (snr_db / 10.0))) * noise


def reverberate(wave: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """`wave (N,)` convolved with `rir (L,)`, aligned on the RIR's direct path, `(N,)` with wave's power.

    The output is taken from the direct-path peak on, so the reverberant speech is not delayed
    against the clean crop (taps before the peak still add their early energy), and its power is
    set back to the input's: reverberation should change the room, not the level the model hears."""
    from scipy.signal import fftconvolve  # the reference path only; training does not need scipy

    n = wave.shape[0]
    if n == 0 or not np.any(rir):
        return wave
    peak = int(np.argmax(np.abs(rir)))
    out = fftconvolve(wave.astype(np.float64), rir.astype(np.float64))[peak : peak + n]
    pin, pout = power(wave), power(out)
    return out * np.sqrt(pin / pout) if pout > 0.0 else out


def babble_mix(segments: Sequence[np.ndarray]) -> np.ndarray:
    """Talkers `(N,)` each, summed at equal level (so one loud file does not turn babble into one voice)."""
    total = np.zeros(segments[0].shape[0], dtype=np.float64)
    for s in segments:
        p = power(s)
        total += s / np.sqrt(p) if p > 0.0 else s
    return total


def equalise(x: np.ndarray, gains_db: np.ndarray, sample_rate: int) -> np.ndarray:
    """`x (N,)` through the equaliser of `gains_db` (at EQ_HZ), zero phase over the crop, its power kept."""
    spectrum = np.fft.rfft(x) * 10.0 ** (eq_curve(gains_db, np.fft.rfftfreq(len(x), 1.0 / sample_rate)) / 20.0)
    y = np.fft.irfft(spectrum, len(x))
    py = power(y)
    return y * np.sqrt(power(x) / py) if py > 0 else y


def reference_wave(
    wave: np.ndarray, speed_factor: float, crop: int, picked: Picked, sample_rate: int = 16000
) -> np.ndarray:
    """One worker item, per sample, in float64: int16 `(N',)` -> speed -> reverb -> equaliser -> noise ->
    `(crop,)`."""
    from scipy.signal import resample_poly

    x = wave.astype(np.float64) * INT16_SCALE
    if speed_factor != 1.0:
        up, down = resample_ratio(speed_factor)
        x = resample_poly(x[: input_length(crop, speed_factor)], up, down)
    x = x[:crop]
    if picked.rir is not None:
        x = reverberate(x, picked.rir.astype(np.float64))
    if picked.draw.eq_db:
        x = equalise(x, np.array(picked.draw.eq_db), sample_rate)
    if picked.noise:
        noise = (
            picked.noise[0].astype(np.float64)
            if len(picked.noise) == 1
            else babble_mix([s.astype(np.float64) for s in picked.noise])
        )
        x = add_at_snr(x, noise, picked.draw.snr_db)
    return x
