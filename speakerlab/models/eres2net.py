"""ERes2Net: Res2Net-style speaker embedding trunk with local and global feature fusion.

Chen et al., "An Enhanced Res2Net with Local and Global Feature Fusion for Speaker Verification"
(Interspeech 2023). Layer structure and parameter names match the 3D-Speaker release, so its
`eres2net_base` / `eres2net_large` checkpoints load with `strict=True`.

- Local feature fusion: inside each residual block the channels are split into `scale` groups
  processed hierarchically (Res2Net); in stages 3-4 the groups are merged by an AFF gate instead
  of plain addition.
- Global feature fusion: the output of each stage is downsampled by a strided 3x3 conv and merged
  with the next stage's output by an AFF (`fuse_mode12`, `fuse_mode123`, `fuse_mode1234`), so the
  pooled map carries information from every scale.
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
from speakerlab.models.registry import register_variant


class ERes2Net(EmbeddingHead):
    """ERes2Net speaker embedding extractor: `(B, T, feat_dim) -> (B, embedding_size)`.

    Stem 3x3 conv to `m_channels`, four stages of `Res2NetBlock`s with `m_channels * (1, 2, 4, 8)`
    planes (expansion 2; strides 1, 2, 2, 2; AFF local fusion in stages 3-4), bottom-up global
    fusion of the stage outputs, temporal statistics pooling (`TSTP`) and the embedding head.

    Args:
        feat_dim: fbank bins F of the input.
        embedding_size: output dimension.
        m_channels: stem width; stage k has `m_channels * 2**k * 2` output channels.
        num_blocks: residual blocks per stage.
        base_width: Res2Net group width per 64 planes (`width = planes * base_width // 64`).
        scale: number of Res2Net groups per block.
        two_emb_layer: `seg_1 -> ReLU -> BN -> seg_2` head instead of `seg_1` alone.
    """

    expansion = 2

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 192,
        m_channels: int = 32,
        num_blocks: Sequence[int] = (3, 4, 6, 3),
        base_width: int = 32,
        scale: int = 2,
        two_emb_layer: bool = False,
    ):
        super().__init__()
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size
        e = self.expansion

        self.conv1 = conv3x3(1, m_channels)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet_stages(
            m_channels, num_blocks, e, lambda i, p, s, k: Res2NetBlock(i, p, s, base_width, scale, e, fuse=k >= 2)
        )

        # Global feature fusion: bring stage k's (already fused) map to stage k+1's resolution
        # and width, then gate it against stage k+1's output.
        c = [m_channels * 2**k * e for k in range(4)]
        self.layer1_downsample = conv3x3(c[0], c[1], stride=2)
        self.layer2_downsample = conv3x3(c[1], c[2], stride=2)
        self.layer3_downsample = conv3x3(c[2], c[3], stride=2)
        self.fuse_mode12 = AFF(c[1])
        self.fuse_mode123 = AFF(c[2])
        self.fuse_mode1234 = AFF(c[3])

        self.pool = TSTP()
        # 3D-Speaker sizes this as int(feat_dim / 8) * 8 * m_channels * 2; the frequency axis
        # really ends at ceil-halved thrice, which is the same for every multiple of 8.
        stats_dim = 2 * c[3] * downsampled_size(feat_dim, 3)
        self._build_head(stats_dim, embedding_size, two_emb_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, T, feat_dim)` fbank -> `(B, embedding_size)` embedding."""
        out = F.relu(self.bn1(self.conv1(to_image(x))), inplace=True)
        out1 = self.layer1(out)
        out2 = self.layer2(out1)
        fused = self.fuse_mode12(out2, self.layer1_downsample(out1))
        out3 = self.layer3(out2)
        fused = self.fuse_mode123(out3, self.layer2_downsample(fused))
        out4 = self.layer4(out3)
        fused = self.fuse_mode1234(out4, self.layer3_downsample(fused))
        return self._embed(self.pool(fused))


_COMMON = dict(feat_dim=80, embedding_size=192, num_blocks=(3, 4, 6, 3), base_width=32, scale=2, two_emb_layer=False)
for _name, _doc, _channels in (
    ("eres2net_base", "ERes2Net-base (3D-Speaker `eres2net_base`, 6.61 M params): `(B, T, 80) -> (B, 192)`.", 32),
    ("eres2net_large", "ERes2Net-large (3D-Speaker `eres2net_large`, 22.46 M params): `(B, T, 80) -> (B, 192)`.", 64),
):
    register_variant(_name, ERes2Net, dict(_COMMON, m_channels=_channels), _doc)
