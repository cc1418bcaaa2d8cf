"""Building blocks and backbone of ReDimNet2 (the embedding model is in speakerlab/models/redimnet2.py).

ReDimNet keeps one "1-D" feature map `(B, C*F, T)` at full time resolution and reshapes it into
2-D maps `(B, c, f, T')` with `c * f = C * F` for the convolutional stages. In the 1-D layout the
frequency index is the slow one: channel `i * c + j` holds frequency bin `i`, 2-D channel `j`.

Attribute names here are dictated by the official checkpoints (PalabraAI/redimnet2): `w`,
`conv_block.conv1pw`, `red_dim_conv`, `tcm`, `attention.q_proj`, ... so that a released state
dict loads with `strict=True`. Everything else is ours.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

# A stage: ((freq_stride, time_stride), num_blocks, expansion, kernel_sizes, att_reduction).
# `kernel_sizes` is kept for the release format but unused: the residual blocks are always 3x3.
# `att_reduction` None means no time-context block, else its width is C*F // att_reduction, rounded
# down to a multiple of its 4 attention heads (every released width already is one; other input
# widths, e.g. 80 bins for B0, would otherwise not split into heads).
StageSpec = Sequence[Any]


class ChannelLayerNorm(nn.Module):
    """LayerNorm over dim 1 (channels) of `(B, C, ...)` inputs, affine, eps 1e-6 by default.

    The official code normalises by hand; `F.layer_norm` on the channel axis moved last gives
    the same values and exports to one ONNX LayerNormalization.
    """

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.movedim(1, -1), self.weight.shape, self.weight, self.bias, self.eps)
        return y.movedim(-1, 1)


class MapAggregation(nn.Module):
    """Learned per-channel mixture of N stacked 1-D maps: `(B, N, D, T) -> (B, D, T)`.

    The mixing logits `w` (1, N, D, 1) go through a softmax over N, so each output channel is a
    convex combination of the N inputs. With N = 1 the result is the input and `w` is frozen.
    """

    def __init__(self, num_maps: int, channels: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1, num_maps, channels, 1), requires_grad=num_maps > 1)

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        return (torch.softmax(self.w, dim=1).to(maps.dtype) * maps).sum(dim=1)


class To2d(nn.Module):
    """`(B, f*c, T) -> (B, c, f, T)` (frequency-major 1-D channels, see the module docstring)."""

    def __init__(self, freq: int, channels: int):
        super().__init__()
        self.freq = freq
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], self.freq, self.channels, x.shape[-1]).transpose(1, 2)

    def extra_repr(self) -> str:
        return f"freq={self.freq}, channels={self.channels}"


class To1d(nn.Module):
    """`(B, c, f, T) -> (B, f*c, T)`, the inverse of `To2d`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[1] * x.shape[2], x.shape[3])


class RepeatFrames(nn.Module):
    """Nearest-neighbour upsampling in time: `(B, D, T) -> (B, D, T * factor)`, each frame repeated."""

    def __init__(self, factor: int):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.factor == 1:
            return x
        return x.unsqueeze(-1).expand(-1, -1, -1, self.factor).reshape(x.shape[0], x.shape[1], -1)

    def extra_repr(self) -> str:
        return f"factor={self.factor}"


class SeparableResBlock(nn.Module):
    """Residual block of two grouped 3x3 + pointwise convs: `(B, c, f, T) -> (B, c, f, T)`.

    `conv1` (3x3, `c / group_divisor` groups, no bias) -> `conv1pw` (1x1) -> ReLU -> `bn1` ->
    `conv2` -> `conv2pw` -> `bn2`, plus the input, then ReLU. The ReLU before `bn1` is the
    released order (not the usual conv-BN-ReLU).
    """

    def __init__(self, channels: int, group_divisor: int = 1):
        super().__init__()
        groups = channels // group_divisor
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, groups=groups, bias=False)
        self.conv1pw = nn.Conv2d(channels, channels, 1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, groups=groups, bias=False)
        self.conv2pw = nn.Conv2d(channels, channels, 1)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In place where autograd allows (conv and BN backward need their inputs, not their outputs):
        # two fewer full-size tensors per block, 5-8% of B3-B6's CPU fwd+bwd (bench/models.py).
        out = self.bn1(F.relu(self.conv1pw(self.conv1(x)), inplace=True))
        out = self.bn2(self.conv2pw(self.conv2(out)))
        out += x
        return F.relu(out, inplace=True)


class Block2d(nn.Module):
    """Holder of a `SeparableResBlock` under the checkpoint name `conv_block`: `(B, c, f, T)` in and out."""

    def __init__(self, channels: int, group_divisor: int = 1):
        super().__init__()
        self.conv_block = SeparableResBlock(channels, group_divisor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_block(x)


class DepthwiseConvBlock1d(nn.Module):
    """ConvNeXt-like 1-D block: `(B, C, T) -> (B, C, T)`.

    Depthwise conv with a wide 'same' kernel -> BatchNorm -> GELU -> pointwise conv, plus the
    input. The depthwise conv sits in a one-element list (`dwconvs.0`) as released.
    """

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.dwconvs = nn.ModuleList(
            [nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)]
        )
        self.norm = nn.BatchNorm1d(channels)
        self.pwconv1 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for conv in self.dwconvs:  # a single conv in every released configuration
            out = conv(out)
        return x + self.pwconv1(F.gelu(self.norm(out)))


class SelfAttention(nn.Module):
    """Multi-head self-attention over time: `(B, T, D) -> (B, T, D)`, `heads` heads of D / heads."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention width {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.head_dim = dim // heads
        # Registered in the released order (k, v, q, out) so the state-dict key order matches.
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Scaling the queries before the product (not the scores) follows the released model.
        q = self._split(self.q_proj(x) * (self.head_dim**-0.5))
        k, v = self._split(self.k_proj(x)), self._split(self.v_proj(x))
        attn = torch.softmax(torch.matmul(q, k.transpose(-1, -2)), dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2)
        return self.out_proj(out.reshape(x.shape[0], x.shape[1], -1))


class FeedForward(nn.Module):
    """Two linear layers with a tanh-approximated GELU between: `(B, T, D) -> (B, T, D)`."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.intermediate_dense = nn.Linear(dim, hidden)
        self.output_dense = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(x), approximate="tanh"))


class TransformerLayer(nn.Module):
    """Post-norm transformer encoder layer on channels-first input: `(B, D, T) -> (B, D, T)`.

    `x = LN(x + MHSA(x)); x = LN(x + FFN(x))`, LayerNorm eps 1e-6, no dropout.
    """

    def __init__(self, dim: int, hidden: int, heads: int = 4):
        super().__init__()
        self.attention = SelfAttention(dim, heads)
        self.layer_norm = nn.LayerNorm(dim, eps=1e-6)
        self.feed_forward = FeedForward(dim, hidden)
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        x = self.layer_norm(x + self.attention(x))
        x = self.final_layer_norm(x + self.feed_forward(x))
        return x.transpose(1, 2)


class TimeContextBlock(nn.Module):
    """Residual bottleneck over time ("conv+att"): `(B, D, T) -> (B, D, T)`.

    1x1 conv D -> h and channel LayerNorm, four depthwise blocks with kernels 7, 19, 31, 59,
    one transformer layer (4 heads, FFN width h), 1x1 conv h -> D, plus the input.
    """

    KERNELS = (7, 19, 31, 59)
    HEADS = 4

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.red_dim_conv = nn.Sequential(nn.Conv1d(dim, hidden, 1), ChannelLayerNorm(hidden))
        self.tcm = nn.Sequential(
            *[DepthwiseConvBlock1d(hidden, k) for k in self.KERNELS], TransformerLayer(hidden, hidden, self.HEADS)
        )
        self.exp_dim_conv = nn.Conv1d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.exp_dim_conv(self.tcm(self.red_dim_conv(x)))


def stage_layers(
    channels: int,
    freq: int,
    width: int,
    freq_stride: int,
    time_stride: int,
    num_blocks: int,
    expansion: float,
    att_reduction: int | None,
    num_inputs: int,
    group_divisor: int,
    norm_groups: int,
) -> nn.Sequential:
    """One ReDimNet2 stage: stacked maps `(B, N, width, T) -> (B, width, T)`, width = channels*freq.

    Mix the N maps, view as `(channels, freq)`, downsample by `freq_stride` in frequency and by the
    accumulated `time_stride` in time with a grouped conv widening to `expansion` times the new
    channel count, run `num_blocks` residual blocks, project back with 1x1 conv + BN when
    expanded, flatten to 1-D, optionally add a time-context block (bottleneck width / reduction),
    repeat frames back to full rate and, with `norm_groups` > 0, GroupNorm. The layer order,
    parameter-free layers included, gives the released indices (`stage0.2.weight`,
    `stage0.3.conv_block...`).
    """
    if freq % freq_stride:
        raise ValueError(f"{freq} frequency bins are not divisible by the stage's frequency stride {freq_stride}")
    new_channels = channels * freq_stride
    wide = int(new_channels * expansion)
    layers = [
        MapAggregation(num_inputs, width),
        To2d(freq, channels),
        nn.Conv2d(
            channels,
            wide,
            kernel_size=(freq_stride, time_stride),
            stride=(freq_stride, time_stride),
            groups=math.gcd(channels, wide),
        ),
    ]
    layers += [Block2d(wide, group_divisor) for _ in range(num_blocks)]
    if expansion != 1:
        layers.append(nn.Sequential(nn.Conv2d(wide, new_channels, 1), nn.BatchNorm2d(new_channels, eps=1e-6)))
    layers.append(To1d())
    if att_reduction is not None:
        heads = TimeContextBlock.HEADS
        layers.append(TimeContextBlock(width, max(heads, width // att_reduction // heads * heads)))
    layers.append(RepeatFrames(time_stride))
    if norm_groups:
        layers.append(nn.GroupNorm(norm_groups, width))
    return nn.Sequential(*layers)


class ReDimNet2Backbone(nn.Module):
    """Log-mel image `(B, 1, freq, T)` -> frame features `(B, out_dim, T')`, T' = T rounded down
    to a multiple of `time_stride`.

    Child names (`stem`, `stem_gnorm`, `stage<i>`, `fin_wght1d`, `fin_to2d`, `head`) are the
    release's `backbone.*` keys.
    """

    def __init__(
        self,
        freq: int,
        channels: int,
        stages: Sequence[StageSpec],
        out_channels: Optional[int] = None,
        return_2d_output: bool = True,
        group_divisor: int = 1,
        agg_gnorm: bool = False,
    ):
        super().__init__()
        width = channels * freq  # of every 1-D map
        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), ChannelLayerNorm(channels), To1d())
        self.stem_gnorm = nn.GroupNorm(channels, width) if agg_gnorm else nn.Identity()
        c, f, time_stride = channels, freq, 1
        for i, ((fs, ts), num_blocks, expansion, _kernels, att) in enumerate(stages):
            time_stride *= ts  # every stage reads full-rate maps: its stride is the accumulated one
            self.add_module(
                f"stage{i}",
                stage_layers(
                    c,
                    f,
                    width,
                    fs,
                    time_stride,
                    num_blocks,
                    expansion,
                    att,
                    num_inputs=i + 1,
                    group_divisor=group_divisor,
                    norm_groups=channels if agg_gnorm else 0,
                ),
            )
            c, f = c * fs, f // fs
        self.fin_wght1d = MapAggregation(len(stages) + 1, width)
        self.time_stride = time_stride
        self.freq_stride = freq // f
        if return_2d_output:
            self.fin_to2d = To2d(f, c)
            self.head = nn.Conv2d(c, out_channels, 1) if out_channels else nn.Identity()
            self.out_dim = f * (out_channels or c)
        else:
            self.fin_to2d = nn.Identity()
            self.head = nn.Conv1d(width, out_channels, 1) if out_channels else nn.Identity()
            self.out_dim = out_channels or width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Drop the frames past the last multiple of the time stride, so the strided convs and
        # the frame repetition give back exactly T' frames in every stage.
        frames = x.shape[-1]
        x = x[..., : frames - frames % self.time_stride]
        maps = [self.stem_gnorm(self.stem(x))]
        # The stages are children named `stage<i>` (checkpoint keys), not a ModuleList; TorchScript
        # cannot look them up by a computed name but does unroll a loop over the children.
        for name, module in self.named_children():
            if name.startswith("stage"):
                maps.append(module(torch.stack(maps, dim=1)))
        out = self.head(self.fin_to2d(self.fin_wght1d(torch.stack(maps, dim=1))))
        if out.dim() == 4:  # (B, c, f, T'): channel-major flattening, as released
            out = out.flatten(1, 2)
        return out
