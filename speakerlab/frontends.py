"""The front-end registry: every kind of model input computed from audio, one entry each in `FRONT_ENDS`,
which says all there is to say about it: its settings (`FeatureSpec.config`, stored in every checkpoint),
the module that computes it, its width, the keys of a config's `features` section it reads (`FeatureSettings`),
their defaults and rules, and the mapping between that section and the spec, both ways.

    kind           settings            module (speakerlab.features): wave (B, samples) ->
    kaldi_fbank    FbankConfig         Kaldi fbank, mean norm -> (B, T, bins)
    redimnet_mel   ReDimNetMelConfig   the ReDimNet2 releases' log-mel -> (B, T, n_mels)
    waveform       WaveformConfig      the wave, zero mean and unit variance -> (B, samples)
    w2vbert_fbank  W2VBertFbankConfig  w2v-BERT 2.0's stacked fbank -> (B, T, 160)

    feature_spec(cfg.features, cfg.data.sample_rate)   # section -> FeatureSpec (ConfigError naming the key)
    section_keys(spec)                                  # FeatureSpec -> the section's keys (train.init fills them)

A key of the section left out (null) takes the kind's default; a key the kind does not read must be left out.
This module is torch-free and imports only speakerlab.settings, because speakerlab.config reads it (the
config must load without torch): so each entry names its module by import path (`module:callable`, called as
`callable(settings, mean_norm)`), which speakerlab.features.spec.build_features resolves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Union

from speakerlab.settings import ConfigError, setting

WINDOW_TYPES = ("povey", "hamming", "hanning", "rectangular")


def _invalid(settings: Any, checks: Dict[str, bool]) -> None:
    problems = [message for message, ok in checks.items() if not ok]
    if problems:
        raise ValueError(f"invalid {settings}: " + "; ".join(problems))


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@dataclass(frozen=True)
class FbankConfig:
    """Options of Kaldi's `FbankOptions` (names follow torchaudio where they differ).

    `high_freq` <= 0 is an offset from Nyquist (0 means Nyquist). `energy_floor` only acts when `use_energy` is
    set and is ignored when <= 0, as in Kaldi."""

    sample_rate: int = 16000
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window_type: str = "povey"
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    dither: float = 0.0
    energy_floor: float = 1.0
    use_energy: bool = False
    raw_energy: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0
    snip_edges: bool = True
    round_to_power_of_two: bool = True

    @property
    def window_size(self) -> int:
        # Kaldi's own order of operations, truncated: samp_freq * 0.001 * frame_length_ms.
        return int(self.sample_rate * 0.001 * self.frame_length_ms)

    @property
    def window_shift(self) -> int:
        return int(self.sample_rate * 0.001 * self.frame_shift_ms)

    @property
    def fft_size(self) -> int:
        return _pow2(self.window_size) if self.round_to_power_of_two else self.window_size

    @property
    def effective_high_freq(self) -> float:
        return self.high_freq if self.high_freq > 0 else 0.5 * self.sample_rate + self.high_freq

    @property
    def feat_dim(self) -> int:
        return self.num_mel_bins + int(self.use_energy)

    def __post_init__(self) -> None:
        nyquist = 0.5 * self.sample_rate
        _invalid(
            self,
            {
                f"window_type must be one of {WINDOW_TYPES}": self.window_type in WINDOW_TYPES,
                "num_mel_bins must be >= 3": self.num_mel_bins >= 3,
                "frames need >= 2 samples and a shift >= 1 sample": self.sample_rate > 0
                and self.window_size >= 2
                and self.window_shift >= 1,
                "preemphasis must lie in [0, 1]": 0.0 <= self.preemphasis <= 1.0,
                "dither must be >= 0": self.dither >= 0.0,
                f"need 0 <= low_freq < high_freq <= Nyquist ({nyquist} Hz)": 0.0
                <= self.low_freq
                < self.effective_high_freq
                <= nyquist,
            },
        )


@dataclass(frozen=True)
class ReDimNetMelConfig:
    """The settings of the ReDimNet2 releases' log-mel (`speakerlab.features.redimnet.ReDimNetMel`); the defaults
    are the releases' (`TFMelBanks(n_mels=72, hop_length=160, do_preemph=True, norm_signal=True)`)."""

    sample_rate: int = 16000
    n_mels: int = 72
    n_fft: int = 512
    win_length: int = 400
    hop_length: int = 160
    f_min: float = 20.0
    f_max: float = 7600.0
    preemphasis: float = 0.97
    normalize_signal: bool = True

    @property
    def feat_dim(self) -> int:
        return self.n_mels

    def __post_init__(self) -> None:
        _invalid(
            self,
            {
                "n_mels must be >= 1": self.n_mels >= 1,
                "need 2 <= win_length <= n_fft": 2 <= self.win_length <= self.n_fft,
                "hop_length must be >= 1": self.hop_length >= 1,
                "preemphasis must lie in [0, 1]": 0.0 <= self.preemphasis <= 1.0,
                f"need 0 <= f_min < f_max <= Nyquist ({self.sample_rate / 2:g} Hz)": 0.0
                <= self.f_min
                < self.f_max
                <= self.sample_rate / 2,
            },
        )


@dataclass(frozen=True)
class WaveformConfig:
    """The settings of the waveform front-end (self-supervised encoders that take the wave itself)."""

    sample_rate: int = 16000

    @property
    def feat_dim(self) -> int:
        return 1

    def __post_init__(self) -> None:
        _invalid(self, {"sample_rate must be >= 1000": self.sample_rate >= 1000})


@dataclass(frozen=True)
class W2VBertFbankConfig:
    """The settings of w2v-BERT 2.0's input features (its own are the defaults)."""

    sample_rate: int = 16000
    num_mel_bins: int = 80
    stride: int = 2  # frames stacked into one model input frame

    @property
    def feat_dim(self) -> int:
        return self.num_mel_bins * self.stride

    def __post_init__(self) -> None:
        _invalid(self, {"stride must be >= 1": self.stride >= 1})
        FbankConfig(sample_rate=self.sample_rate, num_mel_bins=self.num_mel_bins)  # its own checks


FrontEndConfig = Union[FbankConfig, ReDimNetMelConfig, WaveformConfig, W2VBertFbankConfig]


@dataclass(frozen=True)
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


def _mel(k: Dict[str, Any], sample_rate: int) -> ReDimNetMelConfig:
    # Samples from milliseconds rounded (not truncated as Kaldi does), so that keys_of inverts it exactly.
    win = round(sample_rate * k["frame_length_ms"] / 1000)
    return ReDimNetMelConfig(
        sample_rate=sample_rate,
        n_mels=k["num_mel_bins"],
        n_fft=k["fft_size"] or _pow2(win),
        win_length=win,
        hop_length=round(sample_rate * k["frame_shift_ms"] / 1000),
        f_min=k["low_freq"],
        f_max=k["high_freq"],
        preemphasis=k["preemphasis"],
        normalize_signal=k["normalize_signal"],
    )


def _mel_keys(c: ReDimNetMelConfig) -> Dict[str, Any]:
    return {
        "num_mel_bins": c.n_mels,
        "frame_length_ms": c.win_length * 1000 / c.sample_rate,
        "frame_shift_ms": c.hop_length * 1000 / c.sample_rate,
        "fft_size": c.n_fft,
        "low_freq": c.f_min,
        "high_freq": c.f_max,
        "preemphasis": c.preemphasis,
        "normalize_signal": c.normalize_signal,
    }


def _w2vbert_keys(c: W2VBertFbankConfig) -> Dict[str, Any]:
    _defaults_only(c, ("stride",))
    return {"num_mel_bins": c.num_mel_bins}


_FBANK = dict(num_mel_bins=80, frame_length_ms=25.0, frame_shift_ms=10.0, preemphasis=0.97, low_freq=20.0)
FRONT_ENDS: Dict[str, FrontEnd] = {
    # kaldi_fbank keeps the key of the files written before kinds existed ("fbank"): they read alike.
    "kaldi_fbank": FrontEnd(
        FbankConfig,
        "fbank",
        "speakerlab.features.spec:KaldiFeatures",
        {**_FBANK, "window_type": "povey", "high_freq": 0.0, "dither": 0.0, "mean_norm": True},
        {},
        _fbank,
        _fbank_keys,
    ),
    "redimnet_mel": FrontEnd(
        ReDimNetMelConfig,
        "redimnet_mel",
        "speakerlab.features.redimnet:mel_features",
        {
            **_FBANK,
            "num_mel_bins": 72,
            "fft_size": None,
            "high_freq": 7600.0,
            "normalize_signal": True,
            "mean_norm": True,
        },
        {"window_type": "hamming", "dither": 0.0},
        _mel,
        _mel_keys,
    ),
    "waveform": FrontEnd(
        WaveformConfig,
        "waveform",
        "speakerlab.features.spec:WaveformFeatures",
        {"mean_norm": True},
        {"dither": 0.0},
        lambda k, sample_rate: WaveformConfig(sample_rate),
        lambda c: {},
        encoder_input=True,
    ),
    # Its per-bin mean and variance normalisation is always on.
    "w2vbert_fbank": FrontEnd(
        W2VBertFbankConfig,
        "w2vbert_fbank",
        "speakerlab.features.w2vbert:w2vbert_features",
        {"num_mel_bins": 80},
        {"window_type": "povey", "dither": 0.0, "mean_norm": True},
        lambda k, sample_rate: W2VBertFbankConfig(sample_rate, k["num_mel_bins"]),
        _w2vbert_keys,
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
    high_freq: Optional[float] = (
        None  # highest mel edge, Hz: redimnet_mel 7600; kaldi_fbank 0, <= 0: offset from Nyquist
    )
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
    if "high_freq" in values and values["high_freq"] is not None and values["high_freq"] > sample_rate / 2:
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
