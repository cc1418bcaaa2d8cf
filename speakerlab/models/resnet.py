"""ResNet34 speaker embedding extractor (the r-vector trunk of WeSpeaker / 3D-Speaker).

He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), applied to fbank
"images" `(B, 1, F, T)`: four stages of basic residual blocks, temporal statistics pooling and a
two-layer embedding head. Parameter names match the 3D-Speaker release (`resnet34`).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.models.blocks import (EmbeddingHead, conv3x3, downsampled_size, projection_shortcut, resnet_stages,
                                     to_image)
from speakerlab.models.pooling import TSTP
from speakerlab.models.registry import register


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with a residual: `(B, in_planes, F, T) -> (B, planes, F', T')`.

    The first conv carries the stride; the shortcut is an identity or a strided 1x1 conv + BN.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = projection_shortcut(in_planes, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BN outputs are fresh tensors, so the ReLUs can work in place.
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class ResNet(EmbeddingHead):
    """ResNet speaker embedding extractor: `(B, T, feat_dim) -> (B, embedding_size)`.

    Stem 3x3 conv to `m_channels`, four stages of `BasicBlock`s with `m_channels * (1, 2, 4, 8)`
    channels (strides 1, 2, 2, 2), `TSTP` pooling and, by default, the two-layer head
    `seg_1 -> ReLU -> BatchNorm1d(affine=False) -> seg_2`.

    Args:
        feat_dim: fbank bins F of the input.
        embedding_size: output dimension.
        m_channels: stem width.
        num_blocks: residual blocks per stage ((3, 4, 6, 3) is ResNet34).
        two_emb_layer: two-layer head (published) or `seg_1` alone.
    """

    def __init__(self, feat_dim: int = 80, embedding_size: int = 192, m_channels: int = 32,
                 num_blocks: Sequence[int] = (3, 4, 6, 3), two_emb_layer: bool = True):
        super().__init__()
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size

        self.conv1 = conv3x3(1, m_channels)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet_stages(
            m_channels, num_blocks, 1, lambda i, p, s, k: BasicBlock(i, p, s))

        self.pool = TSTP()
        # 3D-Speaker: int(feat_dim / 8) * 8 * m_channels (equal for multiples of 8).
        stats_dim = 2 * m_channels * 8 * downsampled_size(feat_dim, 3)  # stage 4 width x pooled bins
        self._build_head(stats_dim, embedding_size, two_emb_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, T, feat_dim)` fbank -> `(B, embedding_size)` embedding."""
        out = F.relu(self.bn1(self.conv1(to_image(x))), inplace=True)
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self._embed(self.pool(out))


@register
def resnet34(feat_dim: int = 80, embedding_size: int = 192, m_channels: int = 32,
             num_blocks: Sequence[int] = (3, 4, 6, 3), two_emb_layer: bool = True) -> ResNet:
    """ResNet34 (3D-Speaker `resnet34`, 6.34 M params): `(B, T, 80) -> (B, 192)`."""
    return ResNet(feat_dim, embedding_size, m_channels, num_blocks, two_emb_layer)
