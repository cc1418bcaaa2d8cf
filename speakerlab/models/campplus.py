"""CAM++ (Wang et al., Interspeech 2023): a densely connected TDNN with context-aware masking.

    fbank (B, T, F) -> FCM 2-D res-net head (B, m * ceil(F / 8), T)
        -> TDNN, stride 2 (B, 128, T/2)
        -> 3 x [CAM dense block, transit layer halving the channels]   (B, 512, T/2)
        -> BN-ReLU, mean+std pooling (B, 1024) -> linear + BN without affine (B, D)

Module and parameter names follow the released 3D-Speaker checkpoints (`head.*`, `xvector.*`),
so their state dicts load with `strict=True`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp

from speakerlab.models.pooling import StatsPool
from speakerlab.models.registry import class_defaults, register_variant


class BNReLU(nn.Module):
    """BatchNorm1d then (optionally) ReLU, `(B, C, T) -> (B, C, T)` or `(B, C) -> (B, C)`.

    Held under the checkpoint name `nonlinear`, its norm under `batchnorm`.
    """

    def __init__(self, channels: int, relu: bool = True, affine: bool = True):
        super().__init__()
        self.batchnorm = nn.BatchNorm1d(channels, affine=affine)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.batchnorm(x)
        if self.relu:
            # In place is safe: BatchNorm's backward needs its input, not its output.
            x = F.relu(x, inplace=True)
        return x


class ResBlock2d(nn.Module):
    """Basic 3x3 residual block of the FCM head; strides only the frequency axis.

    `(B, C_in, F, T) -> (B, C, ceil(F / stride), T)`.
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        if stride != 1 or in_planes != planes:
            # A strided 1x1 conv, applied as row subsampling + an unstrided 1x1 conv: the same
            # result, but the strided form's backward is several times slower on CPU.
            self.shortcut: nn.Module = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, bias=False),
                nn.BatchNorm2d(planes),
            )
        else:
            self.shortcut = nn.Identity()  # no parameters: matches the checkpoint's empty shortcut
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x[:, :, :: self.stride])  # in place: BatchNorm's backward needs its input only
        return F.relu(out, inplace=True)


class FCM(nn.Module):
    """Front-end convolution module: a small 2-D res-net that downsamples frequency 8x.

    `(B, F, T) -> (B, m_channels * ceil(F / 8), T)`; the (channel, frequency) axes are
    flattened into the TDNN's channel axis.
    """

    def __init__(self, feat_dim: int = 80, m_channels: int = 32, num_blocks: Sequence[int] = (2, 2)):
        super().__init__()
        self.conv1 = nn.Conv2d(1, m_channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = self._make_layer(m_channels, num_blocks[0])
        self.layer2 = self._make_layer(m_channels, num_blocks[1])
        self.conv2 = nn.Conv2d(m_channels, m_channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(m_channels)
        freq = feat_dim
        for _ in range(3):  # three stride-2 convs with padding 1: F -> ceil(F / 2)
            freq = (freq + 1) // 2
        self.out_channels = m_channels * freq

    @staticmethod
    def _make_layer(channels: int, num_blocks: int) -> nn.Sequential:
        # The first block of a layer halves the frequency axis, the others keep it.
        return nn.Sequential(*[ResBlock2d(channels, channels, 2 if i == 0 else 1) for i in range(num_blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))), inplace=True)
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        return out.flatten(1, 2)


class TDNNLayer(nn.Module):
    """Conv1d (no bias, 'same' padding) then BN-ReLU: `(B, C_in, T) -> (B, C_out, ceil(T / stride))`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, dilation: int = 1):
        super().__init__()
        assert kernel_size % 2 == 1, "odd kernel sizes only ('same' padding)"
        padding = (kernel_size - 1) // 2 * dilation
        self.linear = nn.Conv1d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation, bias=False
        )
        self.nonlinear = BNReLU(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


def segment_mean(x: torch.Tensor, seg_len: int) -> torch.Tensor:
    """Mean of each run of `seg_len` frames: `(B, C, T) -> (B, C, ceil(T / seg_len))`.

    The last segment may be short; it is averaged over its real frames only. Computed as a plain average pool of
    the frames padded with zeros to whole segments, the short one rescaled by seg_len / its frames: a ceil-mode
    pool (what the official code calls) gives the same values, but inductor's gradient of it is wrong for an
    overhanging window (torch 2.11-2.13, CPU and CUDA: a compiled CAM++ step's gradients 14-52 % off; tests/
    test_speedups.py). A pool rather than reshape: the reshape made torch.export specialise the time axis.
    """
    pooled = _padded_pool(x, seg_len)
    covered = (x.shape[-1] - torch.arange(pooled.shape[-1], device=x.device) * seg_len).clamp(max=seg_len)
    return pooled * (seg_len / covered.to(x.dtype))


def _padded_pool(x: torch.Tensor, seg_len: int) -> torch.Tensor:
    """`(B, C, T) -> (B, C, ceil(T / seg_len))`: the sum of each run of `seg_len` frames / seg_len, the last run
    padded with zeros."""
    frames = x.shape[-1]
    segments = (frames + seg_len - 1) // seg_len
    return F.avg_pool1d(F.pad(x, (0, segments * seg_len - frames)), kernel_size=seg_len, stride=seg_len)


class _Spread(torch.autograd.Function):
    """Frame t takes segment t // seg_len's value (an index_select); its gradient is each segment's sum over its
    frames, computed as a pool. Autograd's own gradient of the index_select is an index_add that inductor compiles
    wrong (torch 2.11-2.13: "index out of bounds" inside the kernel, or on several CPU threads an assertion) once a
    crop has two segments, as every 3-s training crop has."""

    @staticmethod
    def forward(ctx, values: torch.Tensor, frames: int, seg_len: int) -> torch.Tensor:
        ctx.seg_len = seg_len
        return _index_spread(values, frames, seg_len)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _padded_pool(grad, ctx.seg_len) * ctx.seg_len, None, None


def spread_segments(values: torch.Tensor, frames: int, seg_len: int) -> torch.Tensor:
    """`(B, C, ceil(frames / seg_len)) -> (B, C, frames)`: each frame takes its segment's value. An index_select
    rather than expand-and-slice: the slice would need torch.export to prove frames <= ceil(frames / seg_len) *
    seg_len, which it cannot. TorchScript, which cannot script an autograd.Function, gets the plain index_select."""
    if torch.jit.is_scripting():
        return _index_spread(values, frames, seg_len)
    return _Spread.apply(values, frames, seg_len)


def _index_spread(values: torch.Tensor, frames: int, seg_len: int) -> torch.Tensor:
    """`(B, C, S)` segment values -> `(B, C, frames)`: frame t takes segment t // seg_len."""
    return values.index_select(-1, torch.arange(frames, device=values.device) // seg_len)


class CAMLayer(nn.Module):
    """Context-aware masking: a local conv gated by a mask from utterance + segment context.

    `(B, C_bn, T) -> (B, C_out, T)`. The context of frame t is mean(x) + mean(x over t's
    segment); it is constant within a segment, so the 1x1 mask convs run once per segment and
    only the (B, C_out, n_seg) mask is expanded back to frames.
    """

    def __init__(
        self,
        bn_channels: int,
        out_channels: int,
        kernel_size: int,
        dilation: int = 1,
        reduction: int = 2,
        seg_len: int = 100,
    ):
        super().__init__()
        padding = (kernel_size - 1) // 2 * dilation
        self.linear_local = nn.Conv1d(
            bn_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // reduction, 1)
        self.linear2 = nn.Conv1d(bn_channels // reduction, out_channels, 1)
        self.seg_len = seg_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_local(x)
        context = (x.mean(-1, keepdim=True) + segment_mean(x, self.seg_len)).transpose(1, 2)
        # (B, n_seg, C) rows: the 1x1 convs are plain matmuls, cheaper as such on a few columns.
        hidden = F.relu(F.linear(context, self.linear1.weight.squeeze(-1), self.linear1.bias))
        mask = torch.sigmoid(F.linear(hidden, self.linear2.weight.squeeze(-1), self.linear2.bias))
        return y * spread_segments(mask.transpose(1, 2), y.shape[-1], self.seg_len)


class CAMDenseTDNNLayer(nn.Module):
    """One dense layer: BN-ReLU, 1x1 bottleneck, BN-ReLU, CAM layer; its output is appended.

    `(B, C, T) -> (B, C + growth_rate, T)` (the dense concatenation happens here, so a block is a
    plain `nn.Sequential` of layers named `tdnnd1..N`, as in the checkpoint).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        bn_channels: int,
        kernel_size: int,
        dilation: int = 1,
        seg_len: int = 100,
        memory_efficient: bool = False,
    ):
        super().__init__()
        assert kernel_size % 2 == 1, "odd kernel sizes only ('same' padding)"
        self.nonlinear1 = BNReLU(in_channels)
        self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False)
        self.nonlinear2 = BNReLU(bn_channels)
        self.cam_layer = CAMLayer(bn_channels, out_channels, kernel_size, dilation=dilation, seg_len=seg_len)
        self.memory_efficient = memory_efficient

    def bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear1(self.nonlinear1(x))

    @torch.jit.unused
    def checkpointed_bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        # Recomputes BN-ReLU-conv in backward instead of storing the wide normalised input.
        return cp.checkpoint(self.bottleneck, x, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.memory_efficient and self.training and not torch.jit.is_scripting():
            h = self.checkpointed_bottleneck(x)
        else:
            h = self.bottleneck(x)
        return torch.cat([x, self.cam_layer(self.nonlinear2(h))], dim=1)


class TransitLayer(nn.Module):
    """BN-ReLU then a 1x1 conv without bias: `(B, C_in, T) -> (B, C_out, T)`."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.nonlinear = BNReLU(in_channels)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class DenseLayer(nn.Module):
    """Embedding layer: linear (stored as a 1x1 Conv1d) then BatchNorm without affine.

    `(B, C_in) -> (B, C_out)`.
    """

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.nonlinear = BNReLU(out_channels, relu=False, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(F.linear(x, self.linear.weight.squeeze(-1)))


class CAMPPlus(nn.Module):
    """CAM++ speaker-embedding network: fbank `(B, T, feat_dim) -> (B, embedding_size)`.

    Published setting: `feat_dim=80, embedding_size=192|512`, growth 32, bottleneck 4 x 32,
    128 initial channels, dense blocks of (12, 24, 16) layers with kernel 3 and dilations
    (1, 2, 2), 100-frame segments for the context mask. T >= 3 frames (the TDNN strides by 2 and
    the std needs two frames).
    """

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 512,
        growth_rate: int = 32,
        bn_size: int = 4,
        init_channels: int = 128,
        m_channels: int = 32,
        fcm_blocks: Sequence[int] = (2, 2),
        num_layers: Sequence[int] = (12, 24, 16),
        kernel_sizes: Sequence[int] = (3, 3, 3),
        dilations: Sequence[int] = (1, 2, 2),
        seg_len: int = 100,
        memory_efficient: bool = False,
    ):
        super().__init__()
        assert len(num_layers) == len(kernel_sizes) == len(dilations)
        self.feat_dim = feat_dim
        self.head = FCM(feat_dim, m_channels, fcm_blocks)
        layers = [("tdnn", TDNNLayer(self.head.out_channels, init_channels, 5, stride=2))]
        channels = init_channels
        for i, (n, k, d) in enumerate(zip(num_layers, kernel_sizes, dilations)):
            block = nn.Sequential()
            for j in range(n):
                block.add_module(
                    f"tdnnd{j + 1}",
                    CAMDenseTDNNLayer(
                        channels + j * growth_rate,
                        growth_rate,
                        bn_size * growth_rate,
                        k,
                        dilation=d,
                        seg_len=seg_len,
                        memory_efficient=memory_efficient,
                    ),
                )
            channels += n * growth_rate
            layers.append((f"block{i + 1}", block))
            layers.append((f"transit{i + 1}", TransitLayer(channels, channels // 2)))
            channels //= 2
        layers.append(("out_nonlinear", BNReLU(channels)))
        layers.append(("stats", StatsPool()))
        layers.append(("dense", DenseLayer(channels * 2, embedding_size)))
        self.xvector = nn.Sequential()
        for name, module in layers:
            self.xvector.add_module(name, module)
        self.embedding_size = embedding_size

        # The published recipe's init: He-normal 1-D convs, zero biases (2-D convs: default).
        for m in self.modules():
            if isinstance(m, (nn.Conv1d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.xvector(self.head(x.transpose(1, 2)))


# The registered builder is the class itself: its arguments are `CAMPPlus.__init__`'s.
register_variant(
    "campplus",
    CAMPPlus,
    class_defaults(CAMPPlus),
    """CAM++, `(B, T, feat_dim) -> (B, embedding_size)`; 7.18 M parameters at 512-D, 6.85 M at 192-D.

`memory_efficient` recomputes each dense layer's bottleneck in backward (less memory, slower).""",
)
