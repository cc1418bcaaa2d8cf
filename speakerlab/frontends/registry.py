"""The front-end registry itself (FRONT_ENDS), the config's `features` section (FeatureSettings), the mapping
between the two and a FeatureSpec both ways, and the FeatureSpec; speakerlab.frontends says what it is for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from speakerlab.frontends.settings import (
    WINDOW_TYPES,
    FbankConfig,
    FrontEndConfig,
    ReDimNetMelConfig,
    W2VBertFbankConfig,
    WaveformConfig,
    pow2,
)
from speakerlab.settings import ConfigError, setting


@dataclass(frozen=True, kw_only=True)
class FrontEnd:
    """One kind of model input. `keys`: the `features.*` keys it reads and their defaults (None: derived from
    the others); `fixed`: keys it accepts with one value only. `settings_of(keys, sample_rate)` -> its settings,
    `keys_of(settings)` the inverse (a ValueError names a setting no key expresses)."""

    settings: type
    store_key: str  # the key its settings are stored under in a checkpoint's `features`
    module: str  # `module:callable`, called as callable(settings, mean_norm) -> wave (B, samples) -> model input
    keys: Mapping[str, Any]
    fixed: Mapping[str, Any]
    settings_of: Callable[[Dict[str, Any], int], Any]
    keys_of: Callable[[Any], Dict[str, Any]]
    encoder_input: bool = False  # the input of a self-supervised encoder (speakerlab.models.ssl), not of fbank models
    storable: bool = False  # the offline feature store (speakerlab.features.store) holds it; else computed from audio


def _defaults_only(settings: Any, names: tuple) -> None:
    """The settings `names` have no `features` key: a value other than the default cannot be expressed."""
    for name in names:
        default = next(f.default for f in dataclasses.fields(settings) if f.name == name)
        if getattr(settings, name) != default:
            raise ValueError(
                f"{type(settings).__name__}.{name} = {getattr(settings, name)!r}: no key of the features section "
                f"expresses it (only the default {default!r})"
            )


def _fbank(k: Dict[str, Any], sample_rate: int) -> FbankConfig:
    names = ("num_mel_bins", "frame_length_ms", "frame_shift_ms", "window_type", "preemphasis", "low_freq")
    return FbankConfig(
        sample_rate=sample_rate, high_freq=k["high_freq"], dither=k["dither"], **{n: k[n] for n in names}
    )


def _fbank_keys(c: FbankConfig) -> Dict[str, Any]:
    _defaults_only(c, ("remove_dc_offset", "energy_floor", "use_energy", "raw_energy", "snip_edges"))
    _defaults_only(c, ("round_to_power_of_two",))
    names = ("num_mel_bins", "frame_length_ms", "frame_shift_ms", "window_type", "preemphasis", "low_freq", "high_freq")
    return {n: getattr(c, n) for n in names}


# redimnet_mel's keys that are one of its settings under another name; frame length and shift are in ms.
_MEL_NAMES = {
    "num_mel_bins": "n_mels",
    "fft_size": "n_fft",
    "low_freq": "f_min",
    "high_freq": "f_max",
    "preemphasis": "preemphasis",
    "normalize_signal": "normalize_signal",
}


def _mel(k: Dict[str, Any], sample_rate: int) -> ReDimNetMelConfig:
    # Samples from milliseconds rounded (not truncated as Kaldi does), so that _mel_keys inverts it exactly.
    win, hop = (round(sample_rate * k[key] / 1000) for key in ("frame_length_ms", "frame_shift_ms"))
    named = {field: k[key] for key, field in _MEL_NAMES.items()}
    named["n_fft"] = named["n_fft"] or pow2(win)
    return ReDimNetMelConfig(sample_rate=sample_rate, win_length=win, hop_length=hop, **named)


def _mel_keys(c: ReDimNetMelConfig) -> Dict[str, Any]:
    ms = {"frame_length_ms": c.win_length * 1000 / c.sample_rate, "frame_shift_ms": c.hop_length * 1000 / c.sample_rate}
    return {**ms, **{key: getattr(c, field) for key, field in _MEL_NAMES.items()}}


def _w2vbert_keys(c: W2VBertFbankConfig) -> Dict[str, Any]:
    _defaults_only(c, ("stride",))
    return {"num_mel_bins": c.num_mel_bins}


_FBANK = dict(num_mel_bins=80, frame_length_ms=25.0, frame_shift_ms=10.0, preemphasis=0.97, low_freq=20.0)
FRONT_ENDS: Dict[str, FrontEnd] = {
    "kaldi_fbank": FrontEnd(
        settings=FbankConfig,
        store_key="fbank",  # the key of the files written before kinds existed: they read alike
        module="speakerlab.features.spec:KaldiFeatures",
        keys={**_FBANK, "window_type": "povey", "high_freq": 0.0, "dither": 0.0, "mean_norm": True},
        fixed={},
        settings_of=_fbank,
        keys_of=_fbank_keys,
        storable=True,
    ),
    "redimnet_mel": FrontEnd(
        settings=ReDimNetMelConfig,
        store_key="redimnet_mel",
        module="speakerlab.features.redimnet:mel_features",
        keys={
            **_FBANK,
            "num_mel_bins": 72,
            "fft_size": None,  # the window rounded up to a power of two
            "high_freq": 7600.0,
            "normalize_signal": True,
            "mean_norm": True,
        },
        fixed={"window_type": "hamming", "dither": 0.0},
        settings_of=_mel,
        keys_of=_mel_keys,
    ),
    "waveform": FrontEnd(
        settings=WaveformConfig,
        store_key="waveform",
        module="speakerlab.features.spec:WaveformFeatures",
        keys={"mean_norm": True},
        fixed={"dither": 0.0},
        settings_of=lambda k, sample_rate: WaveformConfig(sample_rate),
        keys_of=lambda c: {},
        encoder_input=True,
    ),
    "w2vbert_fbank": FrontEnd(
        settings=W2VBertFbankConfig,
        store_key="w2vbert_fbank",
        module="speakerlab.features.w2vbert:w2vbert_features",
        keys={"num_mel_bins": 80},
        fixed={"window_type": "povey", "dither": 0.0, "mean_norm": True},  # its normalisation is always on
        settings_of=lambda k, sample_rate: W2VBertFbankConfig(sample_rate, k["num_mel_bins"]),
        keys_of=_w2vbert_keys,
        encoder_input=True,
    ),
}
# The kinds the fbank models (speakerlab.models.list_models) take; the others feed self-supervised encoders.
FEATURE_KINDS = tuple(kind for kind, entry in FRONT_ENDS.items() if not entry.encoder_input)


@dataclass
class FeatureSettings:
    """The `features` section of a config. Every key may be left out (null): it is then the kind's default (see
    FRONT_ENDS) or, with train.init, the pretrained model's; a key its kind does not read must be left out."""

    # kaldi_fbank, Kaldi's log-mel fbank (the default); redimnet_mel, the ReDimNet2 releases' log-mel (Hamming window,
    # pre-emphasis, waveform normalised per utterance, HTK mel 20-7600 Hz); waveform (WavLM, wav2vec 2.0, HuBERT
    # encoders), the wave; w2vbert_fbank (w2v-BERT 2.0), 16 kHz Kaldi fbank normalised per bin, frame pairs stacked.
    kind: Optional[str] = setting(None, choices=tuple(FRONT_ENDS))
    num_mel_bins: Optional[int] = setting(None, ge=1, le=512)  # kaldi_fbank, w2vbert_fbank 80; redimnet_mel 72
    frame_length_ms: Optional[float] = setting(None, gt=0)  # 25 (fbank kinds)
    frame_shift_ms: Optional[float] = setting(None, gt=0)  # 10 (fbank kinds)
    window_type: Optional[str] = setting(None, choices=WINDOW_TYPES)  # kaldi_fbank's, povey; the others have their own
    preemphasis: Optional[float] = setting(None, ge=0, le=1)  # 0.97 (kaldi_fbank, redimnet_mel)
    low_freq: Optional[float] = setting(None, ge=0)  # lowest mel edge, Hz: 20 (kaldi_fbank, redimnet_mel)
    high_freq: Optional[float] = None  # highest mel edge, Hz: redimnet_mel 7600; kaldi_fbank 0 (<= 0: from Nyquist)
    fft_size: Optional[int] = setting(None, ge=2)  # redimnet_mel: null, the window rounded up to a power of two
    normalize_signal: Optional[bool] = None  # redimnet_mel: each wave to zero mean, unit variance first (true)
    dither: float = setting(0.0, ge=0)  # kaldi_fbank, training only (checkpoints and extraction use 0)
    mean_norm: Optional[bool] = None  # per-utterance mean normalisation of each bin (true); waveform: the encoder's
    # do_normalize (zero mean and unit variance of the wave); w2vbert_fbank: always on


def _key_values(section: FeatureSettings, kind: str, sample_rate: int) -> Dict[str, Any]:
    """The kind's keys: the section's where given, else the defaults; a key it does not read, or a fixed one
    set otherwise, is a ConfigError naming it."""
    entry = FRONT_ENDS[kind]
    values = dict(entry.keys)
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name == "kind" or value is None:
            continue
        if f.name in entry.fixed:
            if value != entry.fixed[f.name]:
                raise ConfigError(f"config key 'features.{f.name}': {kind} takes only {entry.fixed[f.name]!r}")
        elif f.name in entry.keys:
            values[f.name] = value
        else:
            raise ConfigError(f"config key 'features.{f.name}': {kind} has no {f.name}; leave it out")
    if values.get("high_freq", 0) > sample_rate / 2:
        raise ConfigError(
            f"config key 'features.high_freq': {values['high_freq']:g} Hz is above the Nyquist frequency of "
            f"data.sample_rate {sample_rate} ({kind})"
        )
    return values


def feature_spec(section: FeatureSettings, sample_rate: int, training: bool = False) -> "FeatureSpec":
    """The front-end of a `features` config section at `sample_rate` (ConfigError naming the key when it cannot
    be one). A checkpoint stores it without dither; `training` keeps the section's (kaldi_fbank)."""
    kind = section.kind or "kaldi_fbank"
    values = _key_values(section, kind, sample_rate)
    mean_norm = values.pop("mean_norm", FRONT_ENDS[kind].fixed.get("mean_norm"))
    if not training and "dither" in values:
        values["dither"] = 0.0
    try:
        return FeatureSpec(FRONT_ENDS[kind].settings_of(values, sample_rate), mean_norm)
    except ValueError as e:
        raise ConfigError(f"config key 'features' ({kind}): {e}") from None


def section_keys(spec: "FeatureSpec") -> Dict[str, Any]:
    """The `features` keys that give `spec` (kind, the kind's keys, mean_norm): the inverse of `feature_spec`
    (with `data.sample_rate` = spec.sample_rate). A setting no key expresses is a ValueError naming it."""
    entry = FRONT_ENDS[spec.kind]
    keys = {"kind": spec.kind, **entry.keys_of(spec.config)}
    if "mean_norm" in entry.keys:
        keys["mean_norm"] = spec.mean_norm
    elif spec.mean_norm != entry.fixed.get("mean_norm"):
        raise ValueError(f"{spec.kind} takes only mean_norm {entry.fixed.get('mean_norm')!r}")
    return keys


@dataclass(frozen=True)
class FeatureSpec:
    """The front-end of an embedding model: `config`, the settings of one kind (its class says which, see
    FRONT_ENDS; the sample rate is among them, dither is 0 for inference), and `mean_norm`, per-utterance mean
    normalisation of each feature bin. Stored as plain values in every checkpoint, so inference rebuilds the
    exact front-end without the training config."""

    config: FrontEndConfig = FbankConfig()
    mean_norm: bool = True

    def __post_init__(self) -> None:
        if not any(type(self.config) is e.settings for e in FRONT_ENDS.values()):
            raise TypeError(f"FeatureSpec config must be one of {[e.settings.__name__ for e in FRONT_ENDS.values()]}")

    @property
    def kind(self) -> str:
        return next(k for k, e in FRONT_ENDS.items() if type(self.config) is e.settings)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def feat_dim(self) -> int:
        """Values per frame of the model input (1 for the waveform)."""
        return self.config.feat_dim

    @property
    def fbank(self) -> FbankConfig:
        """The Kaldi fbank options of a kaldi_fbank spec (the only kind the feature store holds)."""
        if self.kind != "kaldi_fbank":
            raise ValueError(f"a {self.kind} front-end has no Kaldi fbank options")
        return self.config

    def describe(self) -> str:
        """One line for logs: kind, bins, rate, normalisation."""
        norm = "mean norm" if self.mean_norm else "no mean norm"
        what = "samples" if self.kind == "waveform" else f"{self.feat_dim} bins"
        return f"{self.kind}, {what} at {self.sample_rate} Hz, {norm}"

    def to_dict(self) -> Dict[str, Any]:
        key = FRONT_ENDS[self.kind].store_key
        return {"kind": self.kind, key: dataclasses.asdict(self.config), "mean_norm": self.mean_norm}

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "FeatureSpec":
        """The inverse of `to_dict`; a dict without `kind` (written before kinds existed) is kaldi_fbank."""
        kind = raw.get("kind", "kaldi_fbank")
        if kind not in FRONT_ENDS:
            raise ValueError(f"unknown front-end kind {kind!r} (known: {', '.join(FRONT_ENDS)}); a newer speakerlab?")
        entry = FRONT_ENDS[kind]
        known = {f.name for f in dataclasses.fields(entry.settings)}
        unknown = sorted(set(raw[entry.store_key]) - known)
        if unknown:
            raise ValueError(f"unknown {entry.store_key} setting(s) {unknown}")
        return cls(entry.settings(**raw[entry.store_key]), bool(raw["mean_norm"]))
