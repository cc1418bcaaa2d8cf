"""Gemini DF-ResNet speaker embedding extractors (DF-ResNet114, DF-ResNet183).

DF-ResNet (Liu et al., "DF-ResNet: Boosting Speaker Verification Performance with Depth-First
Design", Interspeech 2022) stacks many cheap inverted-bottleneck blocks (1x1 expand x4, 3x3
depthwise, 1x1 project) between separate strided 3x3 downsampling convs. The "Gemini" variant
(Liu et al., "Golden Gemini is All You Need: Finding the Sweet Spots for Speaker Verification",
arXiv:2312.03620) halves the frequency axis at all four downsamplings but the time axis only at
the second, keeping the temporal resolution that speaker verification profits from.

Module and parameter names follow WeSpeaker's `Gemini_DF_ResNet` (`downsample_layers.1.0.weight`,
`stages.2.26.conv2.weight`, `seg_1.weight`, ...), checked key by key and shape by shape against its
source, so its released state dicts should load with `strict=True`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.models.blocks import EmbeddingHead, conv1x1, downsampled_size, to_image
from speakerlab.models.pooling import TSTP
from speakerlab.models.registry import register_variant

# (frequency, time) stride of each of the four downsampling convs (Golden Gemini "T14c").
_STRIDES = ((2, 1), (2, 2), (2, 1), (2, 1))


class InvertedBottleneck(nn.Module):
    """`(B, C, F, T) -> (B, C, F, T)`: 1x1 conv to 4C, 3x3 depthwise conv, 1x1 conv back to C, each
    followed by BN (ReLU after the first two), plus the identity; a ReLU closes the block."""

    def __init__(self, dim: int, expansion: int = 4):
        super().__init__()
        hidden = dim * expansion
        self.conv1 = conv1x1(dim, hidden)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.conv2 = nn.Conv2d(hidden, hidden, kernel_size=3, padding=1, groups=hidden, bias=False)
        self.bn2 = nn.BatchNorm2d(hidden)
        self.conv3 = conv1x1(hidden, dim)
        self.bn3 = nn.BatchNorm2d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        out += x  # in place: BatchNorm's backward needs its input, not this output
        return F.relu(out, inplace=True)


def _conv_bn(in_ch: int, out_ch: int, stride) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(out_ch)
    )


class GeminiDFResNet(EmbeddingHead):
    """Gemini DF-ResNet: `(B, T, feat_dim) -> (B, embedding_size)`.

    `downsample_layers[0]` is the stem (3x3 conv to `dims[0]`, BN, ReLU); for stage k,
    `downsample_layers[k + 1]` (strided 3x3 conv + BN to `dims[k + 1]`) precedes `stages[k]`
    (`depths[k]` inverted bottlenecks). The last map `(B, dims[4], F/16, T/2)` is pooled by `TSTP`
    and projected by `seg_1` (or the two-layer head with `two_emb_layer`).

    Args:
        feat_dim: fbank bins F of the input.
        embedding_size: output dimension.
        depths: blocks per stage ((3, 3, 27, 3) is DF-ResNet114).
        dims: stem width, then the width of each stage.
        two_emb_layer: two-layer head or `seg_1` alone.
    """

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 256,
        depths: Sequence[int] = (3, 3, 27, 3),
        dims: Sequence[int] = (32, 32, 64, 128, 256),
        two_emb_layer: bool = False,
    ):
        super().__init__()
        if len(depths) != 4 or len(dims) != 5:
            raise ValueError(f"need 4 depths and 5 dims, got {list(depths)} and {list(dims)}")
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size
        stem = nn.Sequential(
            nn.Conv2d(1, dims[0], kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(dims[0]), nn.ReLU()
        )
        self.downsample_layers = nn.ModuleList([stem] + [_conv_bn(dims[k], dims[k + 1], _STRIDES[k]) for k in range(4)])
        self.stages = nn.ModuleList(
            nn.Sequential(*[InvertedBottleneck(dims[k + 1]) for _ in range(depths[k])]) for k in range(4)
        )

        self.pool = TSTP(eps=1e-7)  # WeSpeaker's value
        # WeSpeaker: int(feat_dim / 16) * dims[-1] per statistic (equal for multiples of 16).
        stats_dim = 2 * dims[4] * downsampled_size(feat_dim, 4)
        self._build_head(stats_dim, embedding_size, two_emb_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, T, feat_dim)` fbank -> `(B, embedding_size)` embedding."""
        out = to_image(x)
        # Literal indices: TorchScript cannot index a ModuleList with a loop variable.
        out = self.downsample_layers[0](out)
        out = self.stages[0](self.downsample_layers[1](out))
        out = self.stages[1](self.downsample_layers[2](out))
        out = self.stages[2](self.downsample_layers[3](out))
        out = self.stages[3](self.downsample_layers[4](out))
        return self._embed(self.pool(out))


_DIMS = (32, 32, 64, 128, 256)
for _name, _doc, _depths in (
    ("gemini_dfresnet114", "Gemini DF-ResNet114 (WeSpeaker `Gemini_DF_ResNet114`, 6.53 M params).", (3, 3, 27, 3)),
    ("gemini_dfresnet183", "Gemini DF-ResNet183 (WeSpeaker `Gemini_DF_ResNet183`, 9.20 M params).", (3, 8, 45, 3)),
):
    register_variant(
        _name,
        GeminiDFResNet,
        dict(feat_dim=80, embedding_size=256, depths=_depths, dims=_DIMS, two_emb_layer=False),
        _doc + " `(B, T, 80) -> (B, 256)`.",
    )
