"""2-D convolutional building blocks shared by the ResNet / ERes2Net / ERes2NetV2 families.

All feature maps are laid out `(B, C, F, T)`: channels, frequency bins, frames. Module and
parameter names follow the 3D-Speaker checkpoints (`conv1`, `bns.0`, `fuse_models.0.local_att.3`,
`seg_1`, ...) so that released state dicts load with `strict=True`.
"""

from __future__ import annotations

import math
from typing import Callable, List, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


def clipped_relu_(x: torch.Tensor) -> torch.Tensor:
    """ReLU capped at 20 (`hardtanh(0, 20)`), the activation inside ERes2Net blocks, in place.

    Only for tensors nothing else saved for backward (BatchNorm and add outputs): the out-of-place
    form allocates a full-size tensor per call, which on CPU made a Res2Net block's forward+backward
    5% slower (ERes2NetV2 layer1 block, batch 16: 885 -> 837 ms with the in-place add below).
    Out of place under torch.export: its functionalisation of the in-place hardtanh over a dynamic length
    made `speakerlab-export` of ERes2Net 1.5x slower for the same file (bench/export_time.py; ReLU in
    place costs nothing there).
    """
    if torch.jit.is_scripting():  # TorchScript knows no torch.compiler
        return F.hardtanh(x, 0.0, 20.0, inplace=True)
    return F.hardtanh(x, 0.0, 20.0, inplace=not torch.compiler.is_exporting())


def conv1x1(in_ch: int, out_ch: int, stride: int = 1, bias: bool = False) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=1, stride=stride, bias=bias)


def conv3x3(in_ch: int, out_ch: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_ch, out_ch, kernel_size=3, stride=stride, padding=1, bias=False)


def projection_shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module:
    """Residual branch: identity when shapes agree, else strided 1x1 conv + BN (`shortcut.0/1`)."""
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    return nn.Sequential(conv1x1(in_ch, out_ch, stride), nn.BatchNorm2d(out_ch))


def downsampled_size(size: int, num_halvings: int) -> int:
    """Size of an axis after `num_halvings` stride-2 convs (1x1 no pad, or 3x3 pad 1): ceil each time."""
    for _ in range(num_halvings):
        size = (size + 1) // 2
    return size


def to_image(x: torch.Tensor) -> torch.Tensor:
    """`(B, T, F)` fbank -> `(B, 1, F, T)` single-channel image (a view: no copy, no in-place).

    The layout is left to the model: a `.to(memory_format=torch.channels_last)` model runs
    NHWC from its first conv on (oneDNN propagates the weight's layout), 15-25 % faster on CPU.
    NCHW stays the default because the CPU NHWC batch-norm kernel computes train-mode
    statistics less precisely (about 4e-6 relative error per layer against 4e-8 in NCHW, which
    compounds over 30+ layers), too coarse for bit-level checkpoint compatibility checks.
    """
    return x.transpose(1, 2).unsqueeze(1)


class AFF(nn.Module):
    """Attentional feature fusion of two equally shaped maps: `(B, C, F, T) x 2 -> (B, C, F, T)`.

    A bottleneck (`local_att`: 1x1 conv 2C -> C/r, BN, SiLU, 1x1 conv -> C, BN) over the
    concatenated inputs yields a gate `a = 1 + tanh(z)` in (0, 2); the output is
    `x * a + y * (2 - a)`, computed here as `x + y + tanh(z) * (x - y)` (same value, fewer
    passes over memory).
    """

    def __init__(self, channels: int, r: int = 4):
        super().__init__()
        inter = channels // r
        self.local_att = nn.Sequential(
            nn.Conv2d(channels * 2, inter, kernel_size=1),
            nn.BatchNorm2d(inter),
            nn.SiLU(),  # out of place: silu_ clones internally anyway
            nn.Conv2d(inter, channels, kernel_size=1),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gate = torch.tanh(self.local_att(torch.cat((x, y), dim=1)))
        return torch.addcmul(x + y, gate, x - y)


class Res2NetBlock(nn.Module):
    """ERes2Net / ERes2NetV2 residual block: `(B, in_planes, F, T) -> (B, planes*expansion, F', T')`.

    1x1 conv (carrying the stride) to `width * scale` channels, split into `scale` groups of
    `width = floor(planes * base_width / 64)`; group i goes through its own 3x3 conv after being
    merged with the previous group's output (local feature fusion): plain addition, or an AFF
    when `fuse=True` (the blocks of stages 3 and 4). The group outputs are concatenated and
    projected by a 1x1 conv; a (projection) shortcut is added and a clipped ReLU closes the block.
    """

    def __init__(
        self,
        in_planes: int,
        planes: int,
        stride: int = 1,
        base_width: int = 32,
        scale: int = 2,
        expansion: int = 2,
        fuse: bool = False,
    ):
        super().__init__()
        width = int(math.floor(planes * (base_width / 64.0)))
        out_planes = planes * expansion
        self.width = width
        self.conv1 = conv1x1(in_planes, width * scale, stride)
        self.bn1 = nn.BatchNorm2d(width * scale)
        self.convs = nn.ModuleList(conv3x3(width, width) for _ in range(scale))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(scale))
        # Registered between `bns` and `conv3` to keep the published state-dict key order.
        self.fuse_models = nn.ModuleList(AFF(width) for _ in range(scale - 1)) if fuse else None
        self.conv3 = conv1x1(width * scale, out_planes)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = projection_shortcut(in_planes, out_planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(clipped_relu_(self.bn1(self.conv1(x))), self.width, dim=1)
        outs = []
        sp = groups[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):  # unrolled: `scale` is static
            if i > 0:
                if self.fuse_models is None:
                    sp = sp + groups[i]
                else:
                    # TorchScript cannot index a ModuleList with a loop variable, so pick the
                    # (i-1)-th fusion by enumeration; the loops are unrolled, the cost is nil.
                    for j, fuse in enumerate(self.fuse_models):
                        if j == i - 1:
                            sp = fuse(sp, groups[i])
            sp = clipped_relu_(bn(conv(sp)))
            outs.append(sp)
        out = self.bn3(self.conv3(torch.cat(outs, dim=1)))
        out += self.shortcut(x)  # BatchNorm's backward needs its input, not this output
        return clipped_relu_(out)


class EmbeddingHead(nn.Module):
    """Base of the 2-D trunks, owning the head: pooled statistics `(B, D_in) -> (B, embedding_size)`.

    One layer (`seg_1`) or, with `two_emb_layer`, `seg_1 -> ReLU -> BatchNorm1d(affine=False)
    (seg_bn_1) -> seg_2`, the published 3D-Speaker heads. The layers live directly on the model
    so their checkpoint keys stay top level (`seg_1.weight`, ...).
    """

    def _build_head(self, in_dim: int, embedding_size: int, two_emb_layer: bool) -> None:
        self.two_emb_layer = two_emb_layer
        self.seg_1 = nn.Linear(in_dim, embedding_size)
        # Parameter-free identities when unused (as published), so that every attribute the
        # forward names exists, which TorchScript needs.
        self.seg_bn_1 = nn.BatchNorm1d(embedding_size, affine=False) if two_emb_layer else nn.Identity()
        self.seg_2 = nn.Linear(embedding_size, embedding_size) if two_emb_layer else nn.Identity()

    def _embed(self, stats: torch.Tensor) -> torch.Tensor:
        embed = self.seg_1(stats)
        if self.two_emb_layer:  # fixed at construction: no data-dependent control flow
            embed = self.seg_2(self.seg_bn_1(F.relu(embed)))
        return embed


def resnet_stages(
    m_channels: int, num_blocks: Sequence[int], expansion: int, make_block: Callable[[int, int, int, int], nn.Module]
) -> List[nn.Sequential]:
    """The four residual stages shared by ResNet, ERes2Net and ERes2NetV2.

    Stage k has `num_blocks[k]` blocks of width `m_channels * 2**k`; its first block has stride
    (1, 2, 2, 2)[k]. `make_block(in_planes, planes, stride, k)` builds one block, whose output has
    `planes * expansion` channels.
    """
    if len(num_blocks) != 4:
        raise ValueError(f"num_blocks must give 4 stages, got {list(num_blocks)}")
    in_planes, stages = m_channels, []
    for k, (n, stride) in enumerate(zip(num_blocks, (1, 2, 2, 2))):
        planes = m_channels * 2**k
        blocks = []
        for s in [stride] + [1] * (n - 1):
            blocks.append(make_block(in_planes, planes, s, k))
            in_planes = planes * expansion
        stages.append(nn.Sequential(*blocks))
    return stages
