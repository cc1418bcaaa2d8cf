"""The front-end modules: `build_features(spec)`, the one builder of the module that computes a model's input
from audio (the kind's entry of the registry, speakerlab.frontends, names it), used by inference, extraction,
export, validation and training alike; and the modules of the kinds that need no file of their own (Kaldi fbank
with mean normalisation, the waveform). `FeatureSpec`, what an embedding model takes from audio (stored in
every checkpoint), is the registry's.

Every front-end module also answers `num_frames(samples)` (the time length of its output) and
`batch_length(samples)`: waves of equal batch length may share a batch, shorter ones repeated to the
longest, and still get exactly the features they would get alone.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from speakerlab.features.fbank import Fbank, mean_normalize, num_frames
from speakerlab.frontends import FRONT_ENDS, FbankConfig, FeatureSpec, WaveformConfig


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
    module, name = FRONT_ENDS[spec.kind].module.split(":")
    return getattr(importlib.import_module(module), name)(spec.config, spec.mean_norm)
