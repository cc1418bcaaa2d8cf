"""Pooling layers shared by the model families: frame-level features -> one utterance vector."""
from __future__ import annotations

import torch
import torch.nn as nn


class TSTP(nn.Module):
    """Temporal statistics pooling for 2-D conv trunks (ResNet / ERes2Net).

    `(B, C, F, T) -> (B, 2 * C * F)`: mean and std (unbiased, + 1e-8 under the root) over time,
    each flattened over (C, F), then concatenated.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1).flatten(start_dim=1)
        std = torch.sqrt(torch.var(x, dim=-1, unbiased=True) + 1e-8).flatten(start_dim=1)
        return torch.cat([mean, std], dim=1)
