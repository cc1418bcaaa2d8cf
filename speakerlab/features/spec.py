"""What an embedding model takes from audio (`FeatureSpec`, stored in every checkpoint) and the one
builder of the front-end module from it (`build_features`), used by inference, extraction, export,
validation and training alike.

    kind           settings (stored)       module: wave (B, samples) -> model input
    kaldi_fbank    FbankConfig             Kaldi fbank (speakerlab.features), mean norm -> (B, T, bins)
    redimnet_mel   ReDimNetMelConfig       ReDimNet2 releases' log-mel (speakerlab.features.redimnet) -> (B, T, n_mels)
    waveform       WaveformConfig          the wave itself, mean norm: zero mean, unit variance -> (B, samples)
    w2vbert_fbank  W2VBertFbankConfig      w2v-BERT 2.0's stacked fbank (speakerlab.features.w2vbert) -> (B, T, 160)

Every front-end module also answers `num_frames(samples)` (the time length of its output) and
`batch_length(samples)`: waves of equal batch length may share a batch, shorter ones repeated to the
longest, and still get exactly the features they would get alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

import torch
from torch import Tensor

from speakerlab.features.fbank import Fbank, FbankConfig, fbank_config, mean_normalize, num_frames
from speakerlab.features.redimnet import ReDimNetMel, ReDimNetMelConfig
from speakerlab.features.w2vbert import W2VBertFbank, W2VBertFbankConfig

if TYPE_CHECKING:  # annotation only: the spec never needs the config module at run time
    from speakerlab.config import FeatureSettings


@dataclass(frozen=True)
class WaveformConfig:
    """The settings of the waveform front-end (self-supervised encoders that take the wave itself)."""

    sample_rate: int = 16000

    def __post_init__(self) -> None:
        if self.sample_rate < 1000:
            raise ValueError(f"invalid {self}: sample_rate must be >= 1000")


FrontEndConfig = Union[FbankConfig, ReDimNetMelConfig, WaveformConfig, W2VBertFbankConfig]
# kind -> (its settings class, the key its settings are stored under). kaldi_fbank keeps the key of
# the files written before kinds existed ("fbank"), so those files and these read alike.
KINDS: Dict[str, tuple] = {
    "kaldi_fbank": (FbankConfig, "fbank"),
    "redimnet_mel": (ReDimNetMelConfig, "redimnet_mel"),
    "waveform": (WaveformConfig, "waveform"),
    "w2vbert_fbank": (W2VBertFbankConfig, "w2vbert_fbank"),
}
# Kinds whose model input is (B, T, bins) features; the others feed the models of speakerlab.models.ssl.
FEATURE_KINDS = ("kaldi_fbank", "redimnet_mel")


@dataclass(frozen=True)
class FeatureSpec:
    """The front-end of an embedding model: `config`, the settings of one kind (its class says which,
    see KINDS; the sample rate is among them, dither is 0 for inference), and `mean_norm`, per-utterance
    mean normalisation of each feature bin. Stored as plain values in every checkpoint, so inference
    rebuilds the exact front-end without the training config."""

    config: FrontEndConfig = FbankConfig()
    mean_norm: bool = True

    def __post_init__(self) -> None:
        if not any(isinstance(self.config, cls) for cls, _ in KINDS.values()):
            raise TypeError(f"FeatureSpec config must be one of {[c.__name__ for c, _ in KINDS.values()]}")

    @property
    def kind(self) -> str:
        return next(k for k, (cls, _) in KINDS.items() if isinstance(self.config, cls))

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def feat_dim(self) -> int:
        """Values per frame of the model input (1 for the waveform)."""
        c = self.config
        if isinstance(c, FbankConfig):
            return c.num_mel_bins
        if isinstance(c, ReDimNetMelConfig):
            return c.n_mels
        return c.feat_dim if isinstance(c, W2VBertFbankConfig) else 1

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
        key = KINDS[self.kind][1]
        return {"kind": self.kind, key: dataclasses.asdict(self.config), "mean_norm": self.mean_norm}

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "FeatureSpec":
        """The inverse of `to_dict`; a dict without `kind` (written before kinds existed) is kaldi_fbank."""
        kind = raw.get("kind", "kaldi_fbank")
        if kind not in KINDS:
            raise ValueError(f"unknown front-end kind {kind!r} (known: {', '.join(KINDS)}); a newer speakerlab?")
        settings_cls, key = KINDS[kind]
        known = {f.name for f in dataclasses.fields(settings_cls)}
        unknown = sorted(set(raw[key]) - known)
        if unknown:
            raise ValueError(f"unknown {key} setting(s) {unknown}")
        return cls(settings_cls(**raw[key]), bool(raw["mean_norm"]))


class KaldiFeatures(torch.nn.Module):
    """kaldi_fbank: wave `(B, samples)` -> `(B, frames, bins)` float32 Kaldi fbank, mean-normalised
    per utterance when `mean_norm`. Called outside autocast on purpose: log-mel energies in bf16 lose
    the small differences the model learns from (Fbank turns autocast off for its matmul too)."""

    def __init__(self, config: FbankConfig, mean_norm: bool):
        super().__init__()
        self.fbank, self.mean_norm = Fbank(config), mean_norm

    def num_frames(self, num_samples: int) -> int:
        return num_frames(num_samples, self.fbank.config)

    def batch_length(self, num_samples: int) -> int:
        # Samples past the last whole frame are never read: equal frame counts give equal features.
        return self.num_frames(num_samples)

    def normalize(self, feats: Tensor) -> Tensor:
        """Stored fbank `(B, T, F)` (the offline feature store) -> the model input."""
        return mean_normalize(feats) if self.mean_norm else feats

    def forward(self, wave: Tensor) -> Tensor:
        return self.normalize(self.fbank(wave.float()))


class WaveformFeatures(torch.nn.Module):
    """waveform: wave `(B, samples)` -> `(B, samples)` float32, each row normalised to zero mean and unit
    variance, `(x - mean) / sqrt(var + 1e-7)`, when `mean_norm` (the encoders' `do_normalize`)."""

    def __init__(self, config: WaveformConfig, mean_norm: bool):
        super().__init__()
        self.config, self.mean_norm = config, mean_norm

    def num_frames(self, num_samples: int) -> int:
        """Frames of the wav2vec 2.0-family convolutional encoders: 25 ms windows every 20 ms."""
        window, hop = int(0.025 * self.config.sample_rate), int(0.02 * self.config.sample_rate)
        return max(0, (num_samples - window) // hop + 1)

    def batch_length(self, num_samples: int) -> int:
        # Every sample counts: the normalisation, and the encoders' first GroupNorm, span the whole wave.
        return num_samples

    def forward(self, wave: Tensor) -> Tensor:
        x = wave.float()
        if not self.mean_norm:
            return x
        var, mean = torch.var_mean(x, dim=1, correction=0, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-7)


def build_features(spec: FeatureSpec) -> torch.nn.Module:
    """The front-end module of `spec` (on the CPU; move it with `.to(device)`)."""
    if spec.kind == "kaldi_fbank":
        return KaldiFeatures(spec.config, spec.mean_norm)
    if spec.kind == "waveform":
        return WaveformFeatures(spec.config, spec.mean_norm)
    if spec.kind == "w2vbert_fbank":
        return W2VBertFbank(spec.config)
    return ReDimNetMel(**dataclasses.asdict(spec.config), mean_norm=spec.mean_norm)


def feature_spec(settings: "FeatureSettings", sample_rate: int, dither: Optional[float] = 0.0) -> FeatureSpec:
    """The front-end of a `features` config section at `sample_rate`. `dither` (kaldi_fbank only) is 0 for
    the spec a checkpoint stores; None takes the section's (the training front-end)."""
    if settings.kind == "kaldi_fbank":
        return FeatureSpec(fbank_config(settings, sample_rate, dither), settings.mean_norm)
    if settings.kind == "waveform":
        return FeatureSpec(WaveformConfig(sample_rate), settings.mean_norm)
    if settings.kind == "w2vbert_fbank":  # its per-bin mean and variance normalisation is always on
        return FeatureSpec(W2VBertFbankConfig(sample_rate, settings.num_mel_bins), True)
    win = int(sample_rate * 0.001 * settings.frame_length_ms)
    mel = ReDimNetMelConfig(
        sample_rate=sample_rate,
        n_mels=settings.num_mel_bins,
        n_fft=1 << (win - 1).bit_length(),
        win_length=win,
        hop_length=int(sample_rate * 0.001 * settings.frame_shift_ms),
    )
    return FeatureSpec(mel, settings.mean_norm)


def input_problem(model: torch.nn.Module, kind: str, mean_norm: bool) -> Optional[str]:
    """What is wrong with feeding `model` the front-end `kind` (None when it fits): models on a self-supervised
    encoder name theirs (`input_kind`, and `do_normalize` for waves); every other model takes features."""
    wants = getattr(model, "input_kind", None)
    if (wants or kind) != kind or (wants is None and kind not in FEATURE_KINDS):
        return f"'features.kind': the model takes {wants or ' or '.join(FEATURE_KINDS)}, not {kind}"
    if kind == "waveform" and getattr(model, "do_normalize", None) not in (None, mean_norm):
        return (
            f"'features.mean_norm': the encoder's preprocessor_config.json has do_normalize {model.do_normalize}; "
            f"set {str(model.do_normalize).lower()}"
        )
    return None
