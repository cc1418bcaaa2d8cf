"""ResNet speaker embedding extractors: ResNet34 (basic blocks), ResNet221 / ResNet293 (bottlenecks).

He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), applied to fbank
"images" `(B, 1, F, T)` as in the r-vector systems: a 3x3 stem, four residual stages (no max
pooling), temporal statistics pooling and an embedding head. ResNet34 follows the 3D-Speaker
release (`resnet34`, two-layer head, 192-D); the deep bottleneck variants follow WeSpeaker's
VoxCeleb recipe (`ResNet221`, `ResNet293`: one embedding layer, 256-D). Their module and parameter
names (`layer3.47.conv3.weight`, `seg_1.weight`, ...) were checked key by key and shape by shape
against WeSpeaker's source, and its weights loaded with `strict=True` give the same embeddings, so its
released state dicts (minus the classifier's `projection.*` keys) should load unchanged.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.models.blocks import (
    EmbeddingHead,
    conv1x1,
    conv3x3,
    downsampled_size,
    projection_shortcut,
    resnet_stages,
    to_image,
)
from speakerlab.models.pooling import TSTP
from speakerlab.models.registry import register_variant


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN layers with a residual: `(B, in_planes, F, T) -> (B, planes, F', T')`.

    The first conv carries the stride; the shortcut is an identity or a strided 1x1 conv + BN.
    """

    expansion = 1

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
        out += self.shortcut(x)  # in place too: BatchNorm's backward needs its input, not this output
        return F.relu(out, inplace=True)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), each with BN, plus a residual:
    `(B, in_planes, F, T) -> (B, 4 * planes, F', T')`.

    The stride sits on the 3x3 conv (the "ResNet v1.5" placement, as in WeSpeaker), so the
    strided block still sees every input position through its first 1x1 conv.
    """

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = conv1x1(in_planes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, out_planes)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = projection_shortcut(in_planes, out_planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        out += self.shortcut(x)
        return F.relu(out, inplace=True)


_BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


class ResNet(EmbeddingHead):
    """ResNet speaker embedding extractor: `(B, T, feat_dim) -> (B, embedding_size)`.

    Stem 3x3 conv to `m_channels`, four stages of residual blocks of width `m_channels * (1, 2, 4,
    8)` (strides 1, 2, 2, 2; a bottleneck stage outputs 4x its width), `TSTP` pooling over the
    `(channels x F/8)` maps and an embedding head: `seg_1` alone, or with `two_emb_layer`
    `seg_1 -> ReLU -> BatchNorm1d(affine=False) -> seg_2`.

    Args:
        feat_dim: fbank bins F of the input.
        embedding_size: output dimension.
        m_channels: stem width.
        num_blocks: residual blocks per stage ((3, 4, 6, 3) basic is ResNet34).
        two_emb_layer: two-layer head or `seg_1` alone.
        block: "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1 with 4x expansion).
        pool_eps: added to the variance before the root in `TSTP` (1e-8 in 3D-Speaker, 1e-7 in WeSpeaker).
    """

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 192,
        m_channels: int = 32,
        num_blocks: Sequence[int] = (3, 4, 6, 3),
        two_emb_layer: bool = True,
        block: str = "basic",
        pool_eps: float = 1e-8,
    ):
        super().__init__()
        if block not in _BLOCKS:
            raise ValueError(f"block must be one of {sorted(_BLOCKS)}, got {block!r}")
        block_cls = _BLOCKS[block]
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size

        self.conv1 = conv3x3(1, m_channels)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet_stages(
            m_channels, num_blocks, block_cls.expansion, lambda i, p, s, k: block_cls(i, p, s)
        )

        self.pool = TSTP(pool_eps)
        # 3D-Speaker / WeSpeaker: int(feat_dim / 8) * m_channels * 8 * expansion (equal for multiples of 8).
        stats_dim = 2 * m_channels * 8 * block_cls.expansion * downsampled_size(feat_dim, 3)
        self._build_head(stats_dim, embedding_size, two_emb_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, T, feat_dim)` fbank -> `(B, embedding_size)` embedding."""
        out = F.relu(self.bn1(self.conv1(to_image(x))), inplace=True)
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self._embed(self.pool(out))


# name -> (what it is, its arguments, what makes it this variant); params at the defaults.
VARIANTS = {
    "resnet34": (
        "ResNet34 (3D-Speaker `resnet34`, 6.34 M params): `(B, T, 80) -> (B, 192)`.",
        dict(feat_dim=80, embedding_size=192, m_channels=32, num_blocks=(3, 4, 6, 3), two_emb_layer=True),
        dict(block="basic"),
    ),
    "resnet221": (
        "ResNet221, bottleneck blocks (6, 16, 48, 3) (WeSpeaker `ResNet221`, 23.79 M): `(B, T, 80) -> (B, 256)`.",
        dict(feat_dim=80, embedding_size=256, m_channels=32, num_blocks=(6, 16, 48, 3), two_emb_layer=False),
        dict(block="bottleneck", pool_eps=1e-7),
    ),
    "resnet293": (
        "ResNet293, bottleneck blocks (10, 20, 64, 3) (WeSpeaker `ResNet293`, 28.62 M): `(B, T, 80) -> (B, 256)`.",
        dict(feat_dim=80, embedding_size=256, m_channels=32, num_blocks=(10, 20, 64, 3), two_emb_layer=False),
        dict(block="bottleneck", pool_eps=1e-7),
    ),
}
for _name, (_doc, _defaults, _fixed) in VARIANTS.items():
    register_variant(_name, ResNet, _defaults, _doc, _fixed)
