"""The input features of w2v-BERT 2.0 (the reference is transformers' `SeamlessM4TFeatureExtractor`), in
torch on any device, for whole batches:

    wave (B, samples) in [-1, 1) at 16 kHz -> x 32768 (int16 scale, as Kaldi) -> Kaldi fbank: 80 bins,
    25 / 10 ms povey frames, pre-emphasis 0.97, DC removal, no dither (speakerlab.features.fbank.Fbank)
    -> per utterance and bin: (x - mean) / sqrt(var + 1e-7) (unbiased variance over the frames)
    -> pairs of frames stacked: (B, frames // 2, 160)

With an odd frame count the reference pads one zero frame and masks the pair it lands in; here that
pair is left out, so every row is made of real frames. Computed in float64 (window and mel filters
included): the reference's numpy arithmetic, which float32 meets only to about 5e-5 after the variance
normalisation; the output is float32.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from speakerlab.features.fbank import Fbank, num_frames
from speakerlab.frontends import FbankConfig, W2VBertFbankConfig

INT16_SCALE = 32768.0


class W2VBertFbank(torch.nn.Module):
    """wave `(B, samples)` -> `(B, frames // stride, num_mel_bins * stride)` float32 (module docstring)."""

    def __init__(self, config: Optional[W2VBertFbankConfig] = None):
        super().__init__()
        self.config = config = config or W2VBertFbankConfig()
        self.fbank = Fbank(FbankConfig(sample_rate=config.sample_rate, num_mel_bins=config.num_mel_bins), torch.float64)

    def num_frames(self, num_samples: int) -> int:
        """Model input frames (stacked) for `num_samples` samples."""
        return num_frames(num_samples, self.fbank.config) // self.config.stride

    def batch_length(self, num_samples: int) -> int:
        # The normalisation spans the fbank frames only: samples past the last frame are never read.
        return num_frames(num_samples, self.fbank.config)

    def forward(self, wave: Tensor) -> Tensor:
        with torch.autocast(wave.device.type, enabled=False):
            feats = self.fbank(wave.double() * INT16_SCALE)
            var, mean = torch.var_mean(feats, dim=1, correction=1, keepdim=True)
            feats = (feats - mean) / torch.sqrt(var + 1e-7)
            b, t, f = feats.shape
            s = self.config.stride
            return feats[:, : t - t % s].reshape(b, t // s, f * s).float()


def w2vbert_features(config: W2VBertFbankConfig, mean_norm: bool) -> W2VBertFbank:
    """The w2vbert_fbank front-end of a spec (speakerlab.frontends); its normalisation is always on."""
    return W2VBertFbank(config)
