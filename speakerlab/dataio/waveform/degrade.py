"""Degradations as users meet them: short, telephone, codec, noisy and reverberant audio, one place for
the stress table (`speakerlab-stress`) and the channel augmentation of training.

A condition is steps joined by `+`, e.g. `trunc2`, `gsm`, `reverb+noise5`, `tel+trunc2`:

  truncN    a seeded crop of N seconds (N may be a decimal, `trunc1.5`); shorter audio is kept whole
  tel       telephone band: to 8 kHz, 300-3400 Hz band-pass, back to the input rate
  ulaw      G.711 mu-law: the telephone band, then 8-bit mu-law at 8 kHz (libsndfile's ULAW, 64 kbit/s)
  gsm       GSM 06.10 full rate: the telephone band, then libsndfile's GSM610 at 8 kHz (13 kbit/s)
  opus      Opus at its lowest bitrate through libsndfile (OGG/OPUS, compression level 1: about 8 kbit/s at 16 kHz)
  mp3       MP3 (MPEG layer III, VBR, compression level 0.99: about 20 kbit/s at 16 kHz)
  noiseS    additive noise at S dB SNR (`noise0`, `noise5`, `noise-5`; also `musicS`, `babbleS`), from a noise bank
  reverb    a room impulse response of the noise bank (speakerlab.dataio.waveform.noise_bank)
  repN      not a degradation but a short-input policy: audio shorter than N seconds repeated up to N (as
            inference pads by repetition); `trunc1+rep2` against `trunc1` measures padding (bench/short_input.py)

Steps run in a fixed order whatever order they are written in: crop, room (reverb), additive noise,
channel (tel, ulaw, gsm), codec (opus, mp3), because that is the order a voice travels in; rep comes last. Codecs run
in memory through soundfile (libsndfile >= 1.1 encodes Opus and MP3; no ffmpeg, no temporary files);
`codec_problem()` says when the installed libsndfile lacks one.

Deterministic per (utterance, condition, seed): every draw comes from `rng_for(utt, condition, seed)`,
a generator seeded by stable hashes of the names, and the codecs are deterministic encoders. So a
degraded test side is streamed (recomputed when needed), never written to disk.

Waves are `(samples,)` float at `rate` Hz; every function returns float32.
"""

from __future__ import annotations

import io
import re
import zlib
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import soundfile as sf

from speakerlab.augment_settings import CHANNEL_KINDS
from speakerlab.dataio.waveform.augment import INT16_SCALE, add_at_snr, babble_mix, reverberate
from speakerlab.dataio.waveform.noise_bank import NoiseBank
from speakerlab.dataio.waveform.resample import resample

PHONE_RATE = 8000
PHONE_BAND = (300.0, 3400.0)  # Hz, ITU-T G.712's pass band
EDGE_HZ = 50.0  # raised-cosine edges of the band-pass (a brick wall would ring through the utterance)
# format, subtype, coding rate (None: the input's), soundfile write options
CODECS = {
    "ulaw": ("WAV", "ULAW", PHONE_RATE, {}),
    "gsm": ("WAV", "GSM610", PHONE_RATE, {}),
    "opus": ("OGG", "OPUS", None, {"compression_level": 1.0}),
    "mp3": ("MP3", "MPEG_LAYER_III", None, {"compression_level": 0.99}),
}
CHANNELS = ("tel", "ulaw", "gsm")
ADDITIVE = ("noise", "music", "babble")
ORDER = {
    "trunc": 0,
    "reverb": 1,
    "noise": 2,
    "music": 2,
    "babble": 2,
    "tel": 3,
    "ulaw": 3,
    "gsm": 3,
    "opus": 4,
    "mp3": 4,
    "rep": 5,
}
# A value may be negative (`noise-5`: noise 5 dB above the speech); a crop or repetition of <= 0 s is refused below.
STEP = re.compile(r"^(trunc|noise|music|babble|rep)(-?\d+(?:\.\d+)?)$|^(tel|ulaw|gsm|opus|mp3|reverb)$")
# The table of the stress stage: clean, short, channel, codec, noise, room, and the combinations users meet
# together (a phone call from a noisy street, a short clip from a far-field room).
DEFAULT_CONDITIONS = (
    "clean",
    "trunc1",
    "trunc2",
    "trunc3",
    "tel",
    "ulaw",
    "gsm",
    "opus",
    "mp3",
    "noise0",
    "noise5",
    "reverb",
    "reverb+noise5",
    "gsm+noise5",
    "trunc2+noise5",
)


class ConditionError(ValueError):
    """A condition name that does not parse, or that needs a noise bank, a codec or a rate it has not got."""


@dataclass(frozen=True)
class Step:
    """One step of a condition: `kind` (trunc, tel, ulaw, gsm, opus, mp3, noise, music, babble, reverb, rep) and
    its `value` (seconds of a crop or a repetition, SNR dB of additive noise; 0 otherwise)."""

    kind: str
    value: float = 0.0


def parse_condition(name: str) -> Tuple[Step, ...]:
    """`"reverb+noise5"` -> its steps in the order they run (module docstring); `"clean"` -> (). Raises
    ConditionError naming the bad step."""
    if name == "clean":
        return ()
    steps = []
    for token in name.split("+"):
        m = STEP.match(token)
        if m is None:
            raise ConditionError(
                f"condition {name!r}: unknown step {token!r} (truncN, tel, ulaw, gsm, opus, mp3, noiseS, musicS, "
                "babbleS, reverb, repN, joined by '+'; or clean)"
            )
        steps.append(Step(m.group(3)) if m.group(3) else Step(m.group(1), float(m.group(2))))
    kinds = [s.kind for s in steps]
    if len(set(kinds)) != len(kinds) or sum(k in CHANNELS for k in kinds) > 1:
        raise ConditionError(f"condition {name!r}: a step kind twice, or two telephone channels")
    if any(s.kind in ("trunc", "rep") and s.value <= 0 for s in steps):
        raise ConditionError(f"condition {name!r}: a crop or a repetition must be longer than 0 s")
    return tuple(sorted(steps, key=lambda s: ORDER[s.kind]))


def needs_bank(name: str) -> bool:
    """Whether condition `name` draws audio from a noise bank (noise, music, babble, reverb)."""
    return any(s.kind in ADDITIVE or s.kind == "reverb" for s in parse_condition(name))


def codec_problem(kind: str) -> Optional[str]:
    """Why the installed libsndfile cannot code `kind` (ulaw, gsm, opus, mp3), or None when it can."""
    fmt, subtype, _, _ = CODECS[kind]
    if fmt not in sf.available_formats() or subtype not in sf.available_subtypes(fmt):
        return f"{kind}: libsndfile {sf.__libsndfile_version__} has no {fmt}/{subtype} (Opus and MP3 need >= 1.1)"
    return None


def rng_for(utt: str, condition: str, seed: int) -> np.random.Generator:
    """The generator of utterance `utt` under `condition`: the same draws on every run, process and machine."""
    return np.random.default_rng([int(seed), zlib.crc32(utt.encode()), zlib.crc32(condition.encode())])


def truncate(wave: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """A crop of `samples` at a uniform random start; a wave no longer than that is returned whole."""
    if wave.shape[0] <= samples:
        return np.asarray(wave, np.float32)
    start = int(rng.integers(0, wave.shape[0] - samples + 1))
    return np.asarray(wave[start : start + samples], np.float32)


def band_pass(wave: np.ndarray, rate: int, low: float, high: float, edge: float = EDGE_HZ) -> np.ndarray:
    """Zero-phase band-pass by one FFT of the whole wave: bins in [low, high] kept, raised-cosine edges
    `edge` Hz wide outside them, the rest zeroed (a linear-phase filter; no scipy)."""
    n = wave.shape[0]
    if n == 0:
        return np.asarray(wave, np.float32)
    freqs = np.fft.rfftfreq(n, 1.0 / rate)
    below = np.clip((freqs - (low - edge)) / edge, 0.0, 1.0)
    above = np.clip(((high + edge) - freqs) / edge, 0.0, 1.0)
    gain = 0.5 - 0.5 * np.cos(np.pi * np.minimum(below, above))
    return np.fft.irfft(np.fft.rfft(wave.astype(np.float64)) * gain, n).astype(np.float32)


def telephone(wave: np.ndarray, rate: int) -> np.ndarray:
    """`wave` through a telephone channel: 8 kHz, 300-3400 Hz, back to `rate`, same length."""
    narrow = band_pass(resample(wave, rate, PHONE_RATE), PHONE_RATE, *PHONE_BAND)
    return _fit(resample(narrow, PHONE_RATE, rate), wave.shape[0])


def codec(wave: np.ndarray, rate: int, kind: str) -> np.ndarray:
    """`wave` encoded and decoded in memory by libsndfile (ulaw, gsm: at 8 kHz after the telephone band;
    opus, mp3: at `rate`), same length and rate. Raises ConditionError when the codec is missing."""
    problem = codec_problem(kind)
    if problem:
        raise ConditionError(problem)
    fmt, subtype, coding_rate, options = CODECS[kind]
    n = wave.shape[0]
    x = np.clip(wave, -1.0, 1.0).astype(np.float32)  # a channel clips what it cannot carry
    if coding_rate is not None:
        x = band_pass(resample(x, rate, coding_rate), coding_rate, *PHONE_BAND)
    at = coding_rate or rate
    buf = io.BytesIO()
    sf.write(buf, np.clip(x, -1.0, 1.0), at, format=fmt, subtype=subtype, **options)
    buf.seek(0)
    decoded, _ = sf.read(buf, dtype="float32")
    decoded = _fit(decoded, x.shape[0])  # GSM frames and Opus pages pad the end
    return _fit(resample(decoded, at, rate), n) if coding_rate is not None else decoded


def _fit(wave: np.ndarray, n: int) -> np.ndarray:
    """`wave` cut or zero-padded to `n` samples, float32."""
    wave = np.asarray(wave, np.float32)
    return wave[:n] if wave.shape[0] >= n else np.pad(wave, (0, n - wave.shape[0]))


def _bank_audio(bank: Optional[NoiseBank], kind: str, condition: str) -> NoiseBank:
    if bank is None or bank.count(kind) == 0:
        raise ConditionError(f"condition {condition!r} needs {kind} audio: give a noise bank with {kind} files")
    return bank


def degrade(
    wave: np.ndarray,
    rate: int,
    condition: str,
    rng: np.random.Generator,
    bank: Optional[NoiseBank] = None,
) -> np.ndarray:
    """`wave (samples,)` at `rate` under `condition` -> float32 `(samples',)` (shorter only by a crop).

    Draws (in step order): the crop start; the RIR index; the noise file index and its crop. `bank`
    (speakerlab.dataio.waveform.noise_bank) serves noise, music, babble and RIRs."""
    x = np.asarray(wave, np.float32)
    for step in parse_condition(condition):
        if step.kind == "trunc":
            x = truncate(x, int(round(step.value * rate)), rng)
        elif step.kind == "reverb":
            b = _bank_audio(bank, "reverb", condition)
            rir = b.segment("reverb", int(rng.integers(b.count("reverb"))))
            x = reverberate(x.astype(np.float64), rir.astype(np.float64)).astype(np.float32)
        elif step.kind in ADDITIVE:
            b = _bank_audio(bank, step.kind, condition)
            x = add_noise(x, b, step.kind, step.value, rng)
        elif step.kind == "tel":
            x = telephone(x, rate)
        elif step.kind == "rep":
            x = np.resize(x, max(x.shape[0], int(round(step.value * rate))))
        else:
            x = codec(x, rate, step.kind)
    return x


def add_noise(wave: np.ndarray, bank: NoiseBank, kind: str, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """`wave` plus a random crop of a random `kind` file of `bank` (3-7 talkers for babble) at `snr_db`."""
    n = wave.shape[0]
    if kind == "babble":
        picks = rng.choice(bank.count(kind), size=min(int(rng.integers(3, 8)), bank.count(kind)), replace=False)
        noise = babble_mix([bank.crop(kind, int(i), n, rng).astype(np.float64) for i in picks])
    else:
        noise = bank.crop(kind, int(rng.integers(bank.count(kind))), n, rng).astype(np.float64) * INT16_SCALE
    return add_at_snr(wave.astype(np.float64), noise, snr_db).astype(np.float32)


def check_conditions(names: Sequence[str], bank: Optional[NoiseBank]) -> None:
    """Raise ConditionError for the first name that does not parse, lacks its bank audio or its codec."""
    for name in names:
        for step in parse_condition(name):
            if step.kind in ADDITIVE or step.kind == "reverb":
                _bank_audio(bank, step.kind, name)
            if step.kind in CODECS and codec_problem(step.kind):
                raise ConditionError(f"condition {name!r}: {codec_problem(step.kind)}")


class ChannelAugment:
    """Training's channel augmentation, in the loader worker (soundfile codecs need the CPU): an int16 crop
    `(n,)` -> int16 `(n,)`.

    Draws, from the item's generator after the noise augmenter's (so runs without this draw as before): one
    uniform for `short_prob`, then (when short) the kept length; one uniform for `prob`, then (when coded) the
    channel, by the weights of `mix` ({kind: weight} over CHANNEL_KINDS). Short: the first
    `short_seconds` (uniform in [lo, hi]) of the crop repeated over it, as inference repeats a short input.
    The channel runs on the clean crop; speed, reverberation and noise follow on the training device (a
    stress condition runs the channel last: the cost of keeping codecs off the device)."""

    def __init__(self, prob: float, mix: dict, short_prob: float, short_seconds: Sequence[float], rate: int):
        for kind in mix:
            if mix[kind] > 0 and kind != "tel" and codec_problem(kind):
                raise ConditionError(f"augment.channel_mix: {codec_problem(kind)}")
        kinds = [k for k in CHANNEL_KINDS if mix.get(k, 0) > 0]
        weights = np.array([mix[k] for k in kinds], np.float64)
        self.prob, self.kinds, self.weights = float(prob), kinds, weights / weights.sum()
        self.short_prob, self.short_seconds, self.rate = float(short_prob), tuple(map(float, short_seconds)), rate

    def describe(self) -> str:
        """One line for the training log."""
        mix = ", ".join(f"{k} {w:.2g}" for k, w in zip(self.kinds, self.weights))
        return (
            f"channel augmentation with probability {self.prob:g} ({mix}); short crops with probability "
            f"{self.short_prob:g} ({self.short_seconds[0]:g}-{self.short_seconds[1]:g} s repeated)"
        )

    def apply(self, wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n = wave.shape[0]
        out = wave
        if self.short_prob > 0 and rng.random() < self.short_prob:
            keep = int(rng.uniform(*self.short_seconds) * self.rate)
            if 0 < keep < n:
                out = np.resize(out[:keep], n)
        if self.prob > 0 and rng.random() < self.prob:
            kind = self.kinds[int(rng.choice(len(self.kinds), p=self.weights))]
            x = out.astype(np.float32) * INT16_SCALE
            y = telephone(x, self.rate) if kind == "tel" else codec(x, self.rate, kind)
            out = np.clip(np.round(y * 32768.0), -32768, 32767).astype(np.int16)
        return out


def channel_augment(settings, sample_rate: int, log=print) -> Optional[ChannelAugment]:
    """The ChannelAugment of config section `augment` (speakerlab.augment_settings.AugmentSettings), None when both its
    probabilities are 0."""
    if settings.channel_prob == 0 and settings.short_prob == 0:
        return None
    aug = ChannelAugment(
        settings.channel_prob, settings.channel_mix, settings.short_prob, settings.short_seconds, sample_rate
    )
    log(aug.describe())
    return aug
