"""What an embedding model takes from audio (`FeatureSpec`, stored in every checkpoint) and the one
builder of the front-end module from it (`build_features`), used by inference, extraction, export,
validation and training alike.

    kind           settings (stored)       module: wave (B, samples) -> model input
    kaldi_fbank    FbankConfig             Kaldi fbank (speakerlab.features), mean norm -> (B, T, bins)
    redimnet_mel   ReDimNetMelConfig       ReDimNet2 releases' log-mel (speakerlab.features_redimnet) -> (B, T, n_mels)

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

from speakerlab.features import Fbank, FbankConfig, fbank_config, mean_normalize, num_frames
from speakerlab.features_redimnet import ReDimNetMel, ReDimNetMelConfig

if TYPE_CHECKING:  # annotation only: the spec never needs the config module at run time
    from speakerlab.config import FeatureSettings

FrontEndConfig = Union[FbankConfig, ReDimNetMelConfig]
# kind -> (its settings class, the key its settings are stored under). kaldi_fbank keeps the key of
# the files written before kinds existed ("fbank"), so those files and these read alike.
KINDS: Dict[str, tuple] = {
    "kaldi_fbank": (FbankConfig, "fbank"),
    "redimnet_mel": (ReDimNetMelConfig, "redimnet_mel"),
}


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
        """Bins per frame of the model input."""
        return self.config.num_mel_bins if self.kind == "kaldi_fbank" else self.config.n_mels

    @property
    def fbank(self) -> FbankConfig:
        """The Kaldi fbank options of a kaldi_fbank spec (the only kind the feature store holds)."""
        if self.kind != "kaldi_fbank":
            raise ValueError(f"a {self.kind} front-end has no Kaldi fbank options")
        return self.config

    def describe(self) -> str:
        """One line for logs: kind, bins, rate, normalisation."""
        norm = "mean norm" if self.mean_norm else "no mean norm"
        return f"{self.kind}, {self.feat_dim} bins at {self.sample_rate} Hz, {norm}"

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


def build_features(spec: FeatureSpec) -> torch.nn.Module:
    """The front-end module of `spec` (on the CPU; move it with `.to(device)`)."""
    if spec.kind == "kaldi_fbank":
        return KaldiFeatures(spec.config, spec.mean_norm)
    return ReDimNetMel(**dataclasses.asdict(spec.config), mean_norm=spec.mean_norm)


def feature_spec(settings: "FeatureSettings", sample_rate: int, dither: Optional[float] = 0.0) -> FeatureSpec:
    """The front-end of a `features` config section at `sample_rate`. `dither` (kaldi_fbank only) is 0 for
    the spec a checkpoint stores; None takes the section's (the training front-end)."""
    if settings.kind == "kaldi_fbank":
        return FeatureSpec(fbank_config(settings, sample_rate, dither), settings.mean_norm)
    win = int(sample_rate * 0.001 * settings.frame_length_ms)
    mel = ReDimNetMelConfig(
        sample_rate=sample_rate,
        n_mels=settings.num_mel_bins,
        n_fft=1 << (win - 1).bit_length(),
        win_length=win,
        hop_length=int(sample_rate * 0.001 * settings.frame_shift_ms),
    )
    return FeatureSpec(mel, settings.mean_norm)
