"""The settings of training's augmentation: the config's `augment` section (noise, music, babble, reverberation and
speed perturbation on the training device; telephone channels, codecs and short crops in the loader workers),
torch-free like the config that reads it (speakerlab.dataio.waveform.augment, speakerlab.dataio.waveform.speed and
speakerlab.dataio.waveform.degrade implement it).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Dict, List, Optional

from speakerlab.settings import setting

# The augmentation kinds and the ranges of the Kaldi VoxCeleb recipe (also 3D-Speaker's and
# WeSpeaker's), in dB; speakerlab.dataio.waveform.augment implements them.
AUGMENT_KINDS = ("reverb", "noise", "music", "babble")
DEFAULT_SNR = {"noise": (0.0, 15.0), "music": (5.0, 15.0), "babble": (13.0, 20.0)}
# Telephone channels and codecs of the worker-side channel augmentation
# (speakerlab.dataio.waveform.degrade.ChannelAugment).
CHANNEL_KINDS = ("tel", "ulaw", "gsm", "opus", "mp3")
DEFAULT_BABBLE_SPEAKERS = (3, 7)


def _pair(lo_min: Optional[float] = None) -> Callable[[Any], Optional[str]]:
    """Rule of a `[lo, hi]` range setting (lo <= hi, optionally lo >= lo_min)."""

    def check(v):
        if len(v) != 2 or v[0] > v[1]:
            return f"must be [lo, hi] with lo <= hi, got {v}"
        if lo_min is not None and v[0] < lo_min:
            return f"must start at >= {lo_min}, got {v}"
        return None

    return check


def _kinds(v) -> Optional[str]:
    if not v or len(set(v)) != len(v) or any(k not in AUGMENT_KINDS for k in v):
        return f"must list distinct kinds among {', '.join(AUGMENT_KINDS)}, got {v}"
    return None


def _channel_mix(v) -> Optional[str]:
    if not isinstance(v, dict) or not v or any(k not in CHANNEL_KINDS for k in v):
        return f"must map kinds among {', '.join(CHANNEL_KINDS)} to weights, got {v}"
    if any(not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0 for w in v.values()) or not sum(v.values()):
        return f"weights must be numbers >= 0, not all 0, got {v}"
    return None


def _speed_factors(v) -> Optional[str]:
    # Each factor must be a ratio of small integers: the resampler is polyphase (speakerlab.dataio.waveform.speed).
    for f in v:
        if not f > 0:
            return f"must all be > 0, got {v}"
        ratio = Fraction(1 / f).limit_denominator(100)
        if abs(float(ratio) - 1 / f) > 1e-9 / f:
            return f"must be ratios of integers <= 100 (like 0.9 or 1.1), got {f}"
    return None if v else "must not be empty"


@dataclass
class AugmentSettings:
    lists: Optional[str] = None  # folder of noise/music/babble/rirs.scp (musan_rirs prepare); null: off
    prob: float = setting(0.6, ge=0, le=1)  # chance a crop gets one augmentation (of `kinds`)
    kinds: List[str] = setting(list(AUGMENT_KINDS), check=_kinds)
    noise_snr: List[float] = setting(list(DEFAULT_SNR["noise"]), check=_pair())  # dB, uniform
    music_snr: List[float] = setting(list(DEFAULT_SNR["music"]), check=_pair())
    babble_snr: List[float] = setting(list(DEFAULT_SNR["babble"]), check=_pair())
    babble_speakers: List[int] = setting(list(DEFAULT_BABBLE_SPEAKERS), check=_pair(1))  # files summed
    reverb_noise_prob: float = setting(0.0, ge=0, le=1)  # chance a reverberated crop also gets an additive kind
    # Random smooth equaliser (a microphone's, a room's colouring), drawn apart from `prob`: with eq_prob a crop's
    # speech (after reverb, before the additive kinds) gets gains drawn N(0, eq_db) dB at 10 log-spaced frequencies
    # from 60 Hz to 8 kHz, linear in log-frequency between them (FilterAugment, Nam et al. 2022, is one such);
    # the crops of one utterance then differ in channel, which self-supervised objectives would otherwise learn
    eq_prob: float = setting(0.0, ge=0, le=1)
    eq_db: float = setting(5.0, gt=0, le=30)
    bank: Optional[str] = None  # int16 noise bank (speakerlab-noise-bank); null: <lists>/bank,
    # built at start when missing or older than the lists
    speed_factors: List[float] = setting([0.9, 1.0, 1.1], check=_speed_factors)  # sox `speed` factors
    speed_prob: float = setting(0.0, ge=0, le=1)  # chance a crop is sped up by a factor != 1; 0: off
    speed_new_speakers: bool = True  # sped-up copies are new classes: speaker + factor class x num speakers
    # Channel augmentation in the loader workers (speakerlab.dataio.waveform.degrade.ChannelAugment): with
    # channel_prob a crop
    # goes through one telephone channel or codec, drawn by the weights of channel_mix; with short_prob its first
    # short_seconds (uniform in the range) are repeated over the crop (short-utterance statistics at a fixed crop)
    channel_prob: float = setting(0.0, ge=0, le=1)
    channel_mix: Dict[str, float] = setting({k: 1.0 for k in CHANNEL_KINDS}, check=_channel_mix)
    short_prob: float = setting(0.0, ge=0, le=1)
    short_seconds: List[float] = setting([0.5, 1.5], check=_pair(0.1))
