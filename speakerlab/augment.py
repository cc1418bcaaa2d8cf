"""Training-time augmentation: MUSAN noise, music and babble, and RIR reverberation.

The lists come from `python -m speakerlab.datasets.musan_rirs prepare --out DIR`: DIR holds
`noise.scp music.scp babble.scp rirs.scp`, one `<id> <audio path>` per line. An `Augmenter` reads
and checks the lists it needs once, at construction (every problem reported at once, as
`file:line:`), then transforms training crops `(N,)` float32 -> `(N,)` float32.

With probability `prob` a crop gets exactly ONE augmentation, drawn uniformly among the enabled kinds:
  reverb  convolution with a random RIR, aligned on its direct path, input power kept
  noise   a random crop of a noise file at an SNR drawn uniformly from `snr["noise"]` (dB)
  music   the same with music files and `snr["music"]`
  babble  3-7 (`babble_speakers`) speech files summed, added at `snr["babble"]`
With `reverb_noise_prob` > 0, a reverberated crop also gets, with that probability, one of the
enabled additive kinds on top (reverberant speech in a noisy room); the default 0 keeps one kind.
Every random draw comes from the `numpy.random.Generator` the caller passes in (the per-item
generator of `speakerlab.batches.CropDataset`), so the augmented samples of an optimizer step are
the same on any hardware and with any number of loader workers. The output is not clipped or
rescaled beyond what is documented per kind: it stays float, and the features never see a wrap.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.audio import AudioError, audio_info, read_audio, read_crop
from speakerlab.config import AUGMENT_KINDS as KINDS
from speakerlab.config import DEFAULT_BABBLE_SPEAKERS, DEFAULT_SNR
from speakerlab.lists import ListError, read_wav_scp

LIST_FILES = {"reverb": "rirs.scp", "noise": "noise.scp", "music": "music.scp", "babble": "babble.scp"}
# Decoded RIRs kept per process: all of RIRS_NOISES (60,000 files, ~1 s each, ~4 GB as float32)
# would not fit in every loader worker, so only the first RIRs read, up to this many bytes, are kept.
RIR_CACHE_BYTES = 64 * 2**20
MAX_SHOWN = 50


@dataclass(frozen=True)
class Source:
    """One usable list entry: the audio path and its length in samples."""
    path: str
    samples: int


@dataclass(frozen=True)
class Applied:
    """What `Augmenter.apply` did: `kind` None when the crop was left clean; `snr_db` for additive kinds."""
    kind: Optional[str] = None
    snr_db: Optional[float] = None
    files: Tuple[str, ...] = ()


def read_source_list(path: Path, sample_rate: int, problems: List[str]) -> List[Source]:
    """`<id> <path>` lines (read as a wav.scp) -> sources, in file order. Problems (malformed list,
    missing or unusable audio) are appended to `problems` as `path:line: ...` instead of raised, so
    the problems of every list and every file are reported at once."""
    if not path.is_file():
        problems.append(f"{path}: list does not exist (run `python -m speakerlab.datasets.musan_rirs prepare`)")
        return []
    try:
        entries = read_wav_scp(path)
    except ListError as e:  # malformed line or duplicate id; the message names the line
        problems.append(str(e))
        return []
    out = []
    for lineno, audio in entries.values():
        where = f"{path}:{lineno}"
        if not os.path.isfile(audio):
            problems.append(f"{where}: {audio} does not exist")
            continue
        try:
            samples = audio_info(audio, sample_rate)  # the message names the file
        except AudioError as e:
            problems.append(f"{where}: {e}")
            continue
        if samples == 0:
            problems.append(f"{where}: {audio}: empty audio file")
            continue
        out.append(Source(audio, samples))
    if not entries:
        problems.append(f"{path}: no entries")
    return out


def power(x: np.ndarray) -> float:
    """Mean square of a signal (float64 accumulation)."""
    return float(np.mean(np.square(x, dtype=np.float64))) if x.size else 0.0


def add_at_snr(wave: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """`wave + g * noise` with g chosen so that 10 log10(P(wave) / P(g noise)) = snr_db. Both `(N,)`.

    A silent wave or silent noise has no defined SNR: the wave is returned unchanged then."""
    pw, pn = power(wave), power(noise)
    if pw == 0.0 or pn == 0.0:
        return wave
    gain = np.sqrt(pw / (pn * 10.0 ** (snr_db / 10.0)))
    return (wave.astype(np.float64) + gain * noise).astype(np.float32)


def reverberate(wave: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """`wave (N,)` convolved with `rir (L,)`, aligned on the RIR's direct path, `(N,)` with wave's power.

    The RIR is scaled to unit energy and the output taken from the direct-path peak on, so the
    reverberant speech is not delayed against the clean crop (taps before the peak still add
    their early energy). The output power is set back to the input's: reverberation should change
    the room, not the level the model hears.
    """
    n = wave.shape[0]
    if n == 0 or not np.any(rir):
        return wave
    rir = rir.astype(np.float64) / np.sqrt(np.sum(np.square(rir, dtype=np.float64)))
    peak = int(np.argmax(np.abs(rir)))
    size = 1 << (n + rir.shape[0] - 2).bit_length()  # power of two >= full convolution length
    full = np.fft.irfft(np.fft.rfft(wave.astype(np.float64), size) * np.fft.rfft(rir, size), size)
    out = full[peak:peak + n]
    pin, pout = power(wave), power(out)
    if pout > 0.0:
        out = out * np.sqrt(pin / pout)
    return out.astype(np.float32)


class Augmenter:
    """Random additive noise / reverberation for training crops, see the module docstring.

    `lists`: folder with the `.scp` lists of the enabled `kinds` (only those are read);
    `snr`: {kind: (lo, hi) dB} overriding DEFAULT_SNR; `babble_speakers`: (lo, hi) files summed.
    Raises `ListError` listing every problem of the lists (with `file:line:`).
    """

    def __init__(self, lists, prob: float = 0.6, kinds: Sequence[str] = KINDS,
                 snr: Optional[Dict[str, Sequence[float]]] = None,
                 babble_speakers: Sequence[int] = DEFAULT_BABBLE_SPEAKERS, sample_rate: int = 16000,
                 reverb_noise_prob: float = 0.0):
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown or not kinds:
            raise ValueError(f"augmentation kinds must be a non-empty subset of {KINDS}, got {list(kinds)}")
        if not (0.0 <= prob <= 1.0 and 0.0 <= reverb_noise_prob <= 1.0):
            raise ValueError(f"augmentation probabilities must be in [0, 1], got {prob}, {reverb_noise_prob}")
        self.root, self.prob, self.kinds = Path(lists), float(prob), tuple(kinds)
        self.snr = {k: tuple(map(float, v)) for k, v in {**DEFAULT_SNR, **(snr or {})}.items()}
        self.babble_speakers = (int(babble_speakers[0]), int(babble_speakers[1]))
        self.sample_rate = sample_rate
        self.reverb_noise_prob = float(reverb_noise_prob)
        self.additive = tuple(k for k in self.kinds if k != "reverb")
        problems: List[str] = []
        self.sources = {k: read_source_list(self.root / LIST_FILES[k], sample_rate, problems) for k in self.kinds}
        if problems:
            shown = "\n".join(f"  {p}" for p in problems[:MAX_SHOWN])
            more = f"\n  ... and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
            raise ListError(f"{len(problems)} problem(s) in the augmentation lists under {self.root}:\n{shown}{more}")
        self._rir_cache: Dict[int, np.ndarray] = {}
        self._rir_cache_bytes = 0

    def describe(self) -> str:
        """One line for the training log."""
        parts = []
        for k in self.kinds:
            extra = "" if k == "reverb" else f" {self.snr[k][0]:g}-{self.snr[k][1]:g} dB"
            if k == "babble":
                extra += f" x {self.babble_speakers[0]}-{self.babble_speakers[1]} speakers"
            parts.append(f"{k} ({len(self.sources[k])} files{extra})")
        both = ""
        if self.reverb_noise_prob > 0 and "reverb" in self.kinds and self.additive:
            both = f"; reverb + an additive kind with probability {self.reverb_noise_prob:g} of reverb"
        return f"augmentation with probability {self.prob:g}, one of: {', '.join(parts)}{both} from {self.root}"

    def __call__(self, wave: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.apply(wave, rng)[0]

    def apply(self, wave: np.ndarray, rng: np.random.Generator) -> Tuple[np.ndarray, Applied]:
        """`wave (N,)` float32 -> (`(N,)` float32, what was done). Draws: one uniform for `prob`,
        then (only when augmenting) the kind and that kind's own draws; after reverb, one uniform
        for `reverb_noise_prob` when it is > 0 (so the default draws are unchanged by the option)."""
        if rng.random() >= self.prob:
            return wave, Applied()
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        if kind != "reverb":
            return self._add(kind, wave, rng)
        src = self._pick(kind, rng)
        wave, rir_file = reverberate(wave, self._rir(src)), self.sources[kind][src].path
        if self.reverb_noise_prob > 0 and self.additive and rng.random() < self.reverb_noise_prob:
            extra = self.additive[int(rng.integers(len(self.additive)))]
            wave, added = self._add(extra, wave, rng)
            return wave, Applied(f"reverb+{extra}", added.snr_db, (rir_file, *added.files))
        return wave, Applied(kind, None, (rir_file,))

    def _add(self, kind: str, wave: np.ndarray, rng: np.random.Generator) -> Tuple[np.ndarray, Applied]:
        """One additive kind (noise, music or babble) at an SNR drawn from its range."""
        n = wave.shape[0]
        if kind == "babble":
            lo, hi = self.babble_speakers
            count = int(rng.integers(lo, hi + 1))
            pool = len(self.sources[kind])
            # Distinct talkers when the list has enough of them; a tiny list repeats files.
            picks = rng.choice(pool, size=count, replace=pool < count)
            noise = np.zeros(n, dtype=np.float64)
            for i in picks:
                speech = self._crop(self.sources[kind][int(i)], n, rng)
                # Equal level per talker, so one loud file does not turn babble into one voice.
                p = power(speech)
                noise += speech / np.sqrt(p) if p > 0.0 else speech
            files = tuple(self.sources[kind][int(i)].path for i in picks)
        else:
            src = self._pick(kind, rng)
            noise = self._crop(self.sources[kind][src], n, rng)
            files = (self.sources[kind][src].path,)
        snr_db = float(rng.uniform(*self.snr[kind]))
        return add_at_snr(wave, noise, snr_db), Applied(kind, snr_db, files)

    def _pick(self, kind: str, rng: np.random.Generator) -> int:
        return int(rng.integers(len(self.sources[kind])))

    def _crop(self, src: Source, n: int, rng: np.random.Generator) -> np.ndarray:
        # read_crop repeats a file shorter than the crop end to end (random phase), like the
        # speech crops: a noise that stops halfway would teach the model that noise comes and goes.
        return read_crop(src.path, n, src.samples, rng, self.sample_rate)

    def _rir(self, index: int) -> np.ndarray:
        rir = self._rir_cache.get(index)
        if rir is None:
            rir = read_audio(self.sources["reverb"][index].path, self.sample_rate)
            if self._rir_cache_bytes + rir.nbytes <= RIR_CACHE_BYTES:
                self._rir_cache[index] = rir
                self._rir_cache_bytes += rir.nbytes
        return rir
