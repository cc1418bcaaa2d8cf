"""ERes2NetV2: a wider, pruned ERes2Net for short-utterance speaker embedding.

Chen et al., "ERes2NetV2: Boosting Short-Duration Speaker Verification Performance with
Computational Efficiency" (Interspeech 2024). Compared with ERes2Net the stages are wider
(`m_channels` 64, configurable expansion), each Res2Net group is narrower (`base_width` 26), and
global fusion is pruned to a single AFF between the downsampled stage-3 map and stage 4
(`layer3_ds`, `fuse34`). Parameter names match the 3D-Speaker release (`eres2netv2`).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.models.blocks import (
    AFF,
    EmbeddingHead,
    Res2NetBlock,
    conv3x3,
    downsampled_size,
    resnet_stages,
    to_image,
)
from speakerlab.models.pooling import TSTP
from speakerlab.models.registry import register


class ERes2NetV2(EmbeddingHead):
    """ERes2NetV2 speaker embedding extractor: `(B, T, feat_dim) -> (B, embedding_size)`.

    Stem 3x3 conv to `m_channels`, four stages of `Res2NetBlock`s with `m_channels * (1, 2, 4, 8)`
    planes (strides 1, 2, 2, 2; AFF local fusion in stages 3-4), AFF fusion of the strided-conv
    downsampled stage-3 output with stage 4, temporal statistics pooling and the embedding head.

    Args:
        feat_dim: fbank bins F of the input.
        embedding_size: output dimension.
        m_channels: stem width; stage k has `m_channels * 2**k * expansion` output channels.
        num_blocks: residual blocks per stage.
        base_width: Res2Net group width per 64 planes (`width = planes * base_width // 64`).
        scale: number of Res2Net groups per block.
        expansion: block output channels / planes.
        two_emb_layer: `seg_1 -> ReLU -> BN -> seg_2` head instead of `seg_1` alone.
    """

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 192,
        m_channels: int = 64,
        num_blocks: Sequence[int] = (3, 4, 6, 3),
        base_width: int = 26,
        scale: int = 2,
        expansion: int = 2,
        two_emb_layer: bool = False,
    ):
        super().__init__()
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size

        self.conv1 = conv3x3(1, m_channels)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet_stages(
            m_channels,
            num_blocks,
            expansion,
            lambda i, p, s, k: Res2NetBlock(i, p, s, base_width, scale, expansion, fuse=k >= 2),
        )

        c3, c4 = m_channels * 4 * expansion, m_channels * 8 * expansion
        self.layer3_ds = conv3x3(c3, c4, stride=2)
        self.fuse34 = AFF(c4)

        self.pool = TSTP()
        # 3D-Speaker: int(feat_dim / 8) * 8 * m_channels * expansion (equal for multiples of 8).
        stats_dim = 2 * c4 * downsampled_size(feat_dim, 3)
        self._build_head(stats_dim, embedding_size, two_emb_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, T, feat_dim)` fbank -> `(B, embedding_size)` embedding."""
        out = F.relu(self.bn1(self.conv1(to_image(x))), inplace=True)
        out3 = self.layer3(self.layer2(self.layer1(out)))
        out4 = self.layer4(out3)
        fused = self.fuse34(out4, self.layer3_ds(out3))
        return self._embed(self.pool(fused))


@register
def eres2netv2(
    feat_dim: int = 80,
    embedding_size: int = 192,
    m_channels: int = 64,
    num_blocks: Sequence[int] = (3, 4, 6, 3),
    base_width: int = 26,
    scale: int = 2,
    expansion: int = 2,
    two_emb_layer: bool = False,
) -> ERes2NetV2:
    """ERes2NetV2 (3D-Speaker `eres2netv2`, 17.86 M params): `(B, T, 80) -> (B, 192)`."""
    return ERes2NetV2(feat_dim, embedding_size, m_channels, num_blocks, base_width, scale, expansion, two_emb_layer)
