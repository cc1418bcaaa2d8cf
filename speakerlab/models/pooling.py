"""Pooling layers shared by the model families: frame-level features -> one utterance vector."""

from __future__ import annotations

import torch
import torch.nn as nn


def stats_dtype(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 when it is of lower precision (bfloat16 / float16 under autocast); float64 stays float64,
    so a float64 model computes its statistics in float64 too."""
    return x if x.dtype == torch.float64 else x.float()


# Every pooling here returns its statistics in the input's dtype: the head after it has the trunk's
# weights (a model cast to bfloat16 as a whole), and under autocast its linear layer casts anyway.


class TSTP(nn.Module):
    """Temporal statistics pooling for 2-D conv trunks (ResNet / ERes2Net).

    `(B, C, F, T) -> (B, 2 * C * F)`: mean and std (unbiased, + `eps` under the root) over time,
    each flattened over (C, F), then concatenated. `eps` is 1e-8 in 3D-Speaker, 1e-7 in WeSpeaker:
    each model family keeps its source's value so released weights give the same embeddings.
    Statistics in float32 for a bfloat16 / float16 trunk, returned in the trunk's dtype, as in StatsPool.
    """

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = stats_dtype(x)
        mean = xf.mean(dim=-1).flatten(start_dim=1)
        std = torch.sqrt(torch.var(xf, dim=-1, unbiased=True) + self.eps).flatten(start_dim=1)
        return torch.cat([mean, std], dim=1).to(x.dtype)


class StatsPool(nn.Module):
    """Statistics pooling for 1-D (TDNN) trunks, as in CAM++.

    `(B, C, T) -> (B, 2 * C)`: per-channel mean and unbiased std over time, concatenated.
    The statistics are taken in float32 so that a bfloat16 trunk (autocast) does not lose the
    small variances, and returned in the input's dtype; with float32 input no copy is made.
    Needs T >= 2 (unbiased std).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        std, mean = torch.std_mean(stats_dtype(x), dim=-1, unbiased=True)
        return torch.cat([mean, std], dim=1).to(x.dtype)


def weighted_mean_std(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-12):
    """Mean and std of `x` (B, C, T) under time weights `w` (B, C or 1, T) that sum to 1 over T.

    Returns two `(B, C)` tensors. The variance is taken around the weighted mean (two passes)
    rather than as E[x^2] - E[x]^2, which cancels badly for large, low-variance channels; it is
    clamped at `eps` before the root so the gradient stays finite for constant channels.
    """
    mean = (w * x).sum(dim=-1)
    var = (w * (x - mean.unsqueeze(-1)).square()).sum(dim=-1)
    return mean, var.clamp(min=eps).sqrt()


class ASTP(nn.Module):
    """Attentive statistics pooling in WeSpeaker's layout (`linear1`, `linear2`): `(B, C, T) -> (B, 2 * C)`.

    Per channel and frame, attention logits `linear2(tanh(linear1(h)))` with `h = x` or, with
    `global_context`, `[x; mean; std]` (the utterance's mean and unbiased std over time, + 1e-7
    under the root, repeated over frames); softmax over time; weighted mean and std, the
    variance clamped at 1e-7. Statistics in float32 (also under autocast), returned in the input's dtype.
    Needs T >= 2. ECAPA-TDNN has its own (speakerlab.models.ecapa_tdnn.AttentiveStatsPool): its released weights
    hold a BatchNorm inside the attention and a biased variance.
    """

    def __init__(self, in_dim: int, bottleneck_dim: int = 128, global_context: bool = True):
        super().__init__()
        self.global_context = global_context
        self.linear1 = nn.Conv1d(in_dim * 3 if global_context else in_dim, bottleneck_dim, kernel_size=1)
        self.linear2 = nn.Conv1d(bottleneck_dim, in_dim, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = stats_dtype(x)
        h = x
        if self.global_context:
            var, mean = torch.var_mean(xf, dim=-1, correction=1, keepdim=True)
            std = (var + 1e-7).sqrt()
            h = torch.cat([xf, mean.expand_as(xf), std.expand_as(xf)], dim=1).to(x.dtype)
        logits = self.linear2(torch.tanh(self.linear1(h)))
        mean, std = weighted_mean_std(xf, torch.softmax(stats_dtype(logits), dim=-1), eps=1e-7)
        return torch.cat([mean, std], dim=1).to(x.dtype)
