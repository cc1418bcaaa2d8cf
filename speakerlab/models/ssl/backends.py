"""Back-ends over every hidden layer of a self-supervised encoder: `L` hidden states `(B, T, D)` -> `(B, E)`.

LayerSum      learnable softmax weights over the layers -> (B, T, D)
MHFA          multi-head factorised attentive pooling (Peng et al., SLT 2022): keys and values are two
              layer sums, each compressed to `compression_dim`; `heads` attention distributions over
              time from the keys pool the values; the heads' outputs, concatenated, -> linear -> E
ECAPABackend  a layer sum, mean-normalised over time, into ECAPA-TDNN (speakerlab.models.ecapa_tdnn)
MFA           layer-wise adapters (linear, LayerNorm, ReLU, linear, per layer) concatenated over the
              layers -> attentive statistics pooling -> linear -> E (WeSpeaker's w2v-BERT recipe)
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from speakerlab.models.ecapa_tdnn import ECAPATDNN
from speakerlab.models.pooling import ASTP


class LayerSum(nn.Module):
    """`L` hidden states `(B, T, D)` -> their softmax-weighted sum `(B, T, D)` (weights start equal)."""

    def __init__(self, num_states: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_states))

    def forward(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        w = torch.softmax(self.weights, dim=0)
        return sum(w[i] * h for i, h in enumerate(hidden))


class MHFA(nn.Module):
    """Multi-head factorised attentive pooling: `L` x `(B, T, D)` -> `(B, embedding_size)`."""

    def __init__(
        self, num_states: int, dim: int, heads: int = 64, compression_dim: int = 128, embedding_size: int = 256
    ):
        super().__init__()
        self.keys, self.values = LayerSum(num_states), LayerSum(num_states)
        self.compress_k, self.compress_v = nn.Linear(dim, compression_dim), nn.Linear(dim, compression_dim)
        self.attention = nn.Linear(compression_dim, heads)
        self.out = nn.Linear(heads * compression_dim, embedding_size)

    def forward(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        k = self.compress_k(self.keys(hidden))  # (B, T, C)
        v = self.compress_v(self.values(hidden))  # (B, T, C)
        att = torch.softmax(self.attention(k).float(), dim=1).to(v.dtype)  # (B, T, H): over time, per head
        pooled = torch.einsum("bth,btc->bhc", att, v)  # (B, H, C)
        return self.out(pooled.flatten(1))


class ECAPABackend(nn.Module):
    """A layer sum, minus its mean over time, into ECAPA-TDNN: `L` x `(B, T, D)` -> `(B, embedding_size)`."""

    def __init__(self, num_states: int, dim: int, channels: int = 512, embedding_size: int = 192):
        super().__init__()
        self.layers = LayerSum(num_states)
        widths = (channels, channels, channels, channels, 3 * channels)
        self.ecapa = ECAPATDNN(dim, embedding_size, widths)

    def forward(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        x = self.layers(hidden)
        return self.ecapa(x - x.mean(dim=1, keepdim=True))


class MFA(nn.Module):
    """Layer-wise adapters + attentive statistics pooling: `L` x `(B, T, D)` -> `(B, embedding_size)`."""

    def __init__(self, num_states: int, dim: int, adapter_dim: int = 128, embedding_size: int = 256):
        super().__init__()
        self.adapters = nn.ModuleList(
            nn.Sequential(
                nn.Linear(dim, adapter_dim), nn.LayerNorm(adapter_dim), nn.ReLU(), nn.Linear(adapter_dim, adapter_dim)
            )
            for _ in range(num_states)
        )
        width = adapter_dim * num_states
        self.pool = ASTP(width, adapter_dim, global_context=False)
        self.out = nn.Linear(2 * width, embedding_size)

    def forward(self, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
        x = torch.cat([adapter(h) for adapter, h in zip(self.adapters, hidden)], dim=-1)  # (B, T, a * L)
        return self.out(self.pool(x.transpose(1, 2)))
