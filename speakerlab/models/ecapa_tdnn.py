"""ECAPA-TDNN (Desplanques et al., Interspeech 2020), in the layout of 3D-Speaker's checkpoints.

    fbank (B, T, F) -> TDNN k5 (B, C, T) -> 3 x SE-Res2Net blocks, dilations 2, 3, 4 (B, C, T)
        -> multi-layer aggregation of the three block outputs, 1x1 TDNN (B, C_mfa, T)
        -> attentive statistics pooling (B, 2 * C_mfa) -> BN -> linear (B, D)

3D-Speaker's ECAPA follows SpeechBrain's layer layout: every conv sits in a wrapper as
`<name>.conv` and every BatchNorm as `<name>.norm`, a TDNN block applies conv, ReLU and then
BN, and 'same' padding reflects the signal. The names here are identical, so published state
dicts load with `strict=True`.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.models.pooling import stats_dtype, weighted_mean_std
from speakerlab.models.registry import register_variant


class Conv1d(nn.Module):
    """Stride-1 Conv1d with reflect 'same' padding, stored as `.conv`: `(B, C_in, T) -> (B, C_out, T)`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, dilation: int = 1, bias: bool = True):
        super().__init__()
        assert kernel_size % 2 == 1, "odd kernel sizes only ('same' padding)"
        padding = dilation * (kernel_size - 1) // 2
        self.conv = nn.Conv1d(
            in_channels,
            out_channels,
            kernel_size,
            dilation=dilation,
            padding=padding,
            padding_mode="reflect" if padding else "zeros",
            bias=bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class BatchNorm1d(nn.Module):
    """BatchNorm1d stored as `.norm`: `(B, C, T) -> (B, C, T)` or `(B, C) -> (B, C)`."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class TDNNBlock(nn.Module):
    """Conv1d, ReLU, then BatchNorm (this order): `(B, C_in, T) -> (B, C_out, T)`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 1, dilation: int = 1):
        super().__init__()
        self.conv = Conv1d(in_channels, out_channels, kernel_size, dilation)
        self.norm = BatchNorm1d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(F.relu(self.conv(x), inplace=True))


class DilatedRes2Net(nn.Module):
    """Res2Net with dilation: `(B, C, T) -> (B, C, T)`.

    The channels are cut into `scale` groups; group 0 passes through, group 1 goes through a
    TDNN block, group i > 1 through a TDNN block after adding the previous group's output.
    Not speakerlab.models.blocks.Res2NetBlock, ERes2Net's 2-D bottleneck (1x1 convs in and out, every group
    convolved, optional AFF fusion, a shortcut): the two share only the idea of split groups.
    """

    def __init__(self, channels: int, scale: int = 8, kernel_size: int = 3, dilation: int = 1):
        super().__init__()
        assert channels % scale == 0, "channels must split evenly into the Res2Net scale"
        width = channels // scale
        self.blocks = nn.ModuleList([TDNNBlock(width, width, kernel_size, dilation) for _ in range(scale - 1)])
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = torch.chunk(x, self.scale, dim=1)
        outs: List[torch.Tensor] = [chunks[0]]
        y = chunks[1]
        for i, block in enumerate(self.blocks):
            if i > 0:
                y = y + chunks[i + 1]
            y = block(y)
            outs.append(y)
        return torch.cat(outs, dim=1)


class SEBlock(nn.Module):
    """Squeeze-excitation over time: `(B, C, T) -> (B, C, T)`, channels rescaled by a 0..1 gate."""

    def __init__(self, channels: int, se_channels: int = 128):
        super().__init__()
        self.conv1 = Conv1d(channels, se_channels, 1)
        self.conv2 = Conv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=-1, keepdim=True)
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(s), inplace=True)))
        return x * s


class SERes2NetBlock(nn.Module):
    """TDNN 1x1, Res2Net, TDNN 1x1, SE, plus a residual: `(B, C_in, T) -> (B, C_out, T)`."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        res2net_scale: int = 8,
        se_channels: int = 128,
        kernel_size: int = 3,
        dilation: int = 1,
    ):
        super().__init__()
        self.tdnn1 = TDNNBlock(in_channels, out_channels, 1)
        self.res2net_block = DilatedRes2Net(out_channels, res2net_scale, kernel_size, dilation)
        self.tdnn2 = TDNNBlock(out_channels, out_channels, 1)
        self.se_block = SEBlock(out_channels, se_channels)
        # A projection only when the widths differ (never in the published settings).
        self.shortcut: nn.Module = (
            Conv1d(in_channels, out_channels, 1) if in_channels != out_channels else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))
        return out + self.shortcut(x)


class AttentiveStatsPool(nn.Module):
    """Channel-wise attentive statistics pooling: `(B, C, T) -> (B, 2 * C)` (weighted mean, std).

    With `global_context`, the attention TDNN sees each frame next to the utterance's mean and
    std, i.e. `tdnn(cat([x, mean, std]))` with the statistics repeated over time. Its 1x1 conv is
    split instead: frame part `W_x @ x` plus a per-utterance term `W_s @ [mean, std] + b`,
    broadcast over time, which is the same result without building the (B, 3C, T) input.
    Not speakerlab.models.pooling.ASTP (WeSpeaker's and ReDimNet2's layout: two plain 1x1 convs, unbiased variance,
    1e-7): ECAPA's released weights have a TDNN block with BatchNorm before the tanh and a biased variance, and
    each pooling keeps its source's keys and arithmetic so that released weights give their published embeddings.
    """

    def __init__(self, channels: int, attention_channels: int = 128, global_context: bool = True):
        super().__init__()
        self.global_context = global_context
        self.channels = channels
        self.tdnn = TDNNBlock(channels * 3 if global_context else channels, attention_channels, 1)
        self.conv = Conv1d(attention_channels, channels, 1)
        self.eps = 1e-12

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = stats_dtype(x)  # statistics in float32 (float64 for a float64 model), also under autocast
        if self.global_context:
            var, mean = torch.var_mean(xf, dim=-1, correction=0)
            std = var.clamp(min=self.eps).sqrt()
            weight = self.tdnn.conv.conv.weight  # (A, 3C, 1)
            frame = F.conv1d(x, weight[:, : self.channels])
            utt = F.linear(
                torch.cat([mean, std], dim=1).to(x.dtype), weight[:, self.channels :, 0], self.tdnn.conv.conv.bias
            )
            h = self.tdnn.norm(F.relu(frame + utt.unsqueeze(-1).to(frame.dtype)))
        else:
            h = self.tdnn(x)
        logits = self.conv(torch.tanh(h))
        attn = torch.softmax(stats_dtype(logits), dim=-1)
        mean, std = weighted_mean_std(xf, attn, self.eps)
        return torch.cat([mean, std], dim=1).to(x.dtype)  # the input's dtype, as every pooling


class ECAPATDNN(nn.Module):
    """ECAPA-TDNN: fbank `(B, T, feat_dim) -> (B, embedding_size)`.

    `channels` lists the widths of the first TDNN, the SE-Res2Net blocks and the aggregation
    layer (the latter conventionally 3x the block width); `kernel_sizes` and `dilations` pair
    with them. Published: C=1024 (20.8 M parameters) and C=512, both with 192-D embeddings.
    """

    def __init__(
        self,
        feat_dim: int = 80,
        embedding_size: int = 192,
        channels: Sequence[int] = (512, 512, 512, 512, 1536),
        kernel_sizes: Sequence[int] = (5, 3, 3, 3, 1),
        dilations: Sequence[int] = (1, 2, 3, 4, 1),
        attention_channels: int = 128,
        res2net_scale: int = 8,
        se_channels: int = 128,
        global_context: bool = True,
    ):
        super().__init__()
        assert len(channels) == len(kernel_sizes) == len(dilations) >= 3
        self.feat_dim = feat_dim
        self.blocks = nn.ModuleList([TDNNBlock(feat_dim, channels[0], kernel_sizes[0], dilations[0])])
        for i in range(1, len(channels) - 1):
            self.blocks.append(
                SERes2NetBlock(channels[i - 1], channels[i], res2net_scale, se_channels, kernel_sizes[i], dilations[i])
            )
        self.mfa = TDNNBlock(sum(channels[1:-1]), channels[-1], kernel_sizes[-1], dilations[-1])
        self.asp = AttentiveStatsPool(channels[-1], attention_channels, global_context)
        self.asp_bn = BatchNorm1d(channels[-1] * 2)
        self.fc = Conv1d(channels[-1] * 2, embedding_size, 1)
        self.embedding_size = embedding_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        feats: List[torch.Tensor] = []
        for block in self.blocks:
            x = block(x)
            feats.append(x)
        # Multi-layer feature aggregation: every SE-Res2Net output, not the first TDNN's.
        x = self.mfa(torch.cat(feats[1:], dim=1))
        x = self.asp_bn(self.asp(x))
        return F.linear(x, self.fc.conv.weight.squeeze(-1), self.fc.conv.bias)


_ARGS = dict(feat_dim=80, embedding_size=192, attention_channels=128, res2net_scale=8, se_channels=128)
for _name, _doc, _width in (
    ("ecapa_tdnn_c1024", "ECAPA-TDNN, 1024 channels (20.77 M params at 192-D): `(B, T, feat_dim) -> (B, D)`.", 1024),
    ("ecapa_tdnn_c512", "ECAPA-TDNN, 512 channels (6.19 M params at 192-D): `(B, T, feat_dim) -> (B, D)`.", 512),
):
    register_variant(_name, ECAPATDNN, _ARGS, _doc, dict(channels=(_width,) * 4 + (3 * _width,)))
