"""Cosine classifier with additive angular margin (AAM softmax) over speaker classes."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class AAMSoftmax(nn.Module):
    """`(B, D)` embeddings + `(B,)` labels -> scalar loss and `(B, S)` cosine logits.

    logit_j = scale * cos(theta_j), with the target's angle widened to theta_y + margin. The margin
    is a buffer set each step by the margin schedule (`set_margin`), so it is part of the
    checkpoint. Where theta_y + margin would pass pi the penalised logit would rise again; there the
    usual linear extension cos(theta) - margin * sin(margin) keeps it monotonic.
    """

    def __init__(self, embedding_size: int, num_classes: int, scale: float = 32.0, margin: float = 0.2):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.xavier_uniform_(self.weight)
        self.scale = scale
        self.register_buffer("margin", torch.tensor(float(margin)))

    def set_margin(self, margin: float) -> None:
        self.margin.fill_(float(margin))

    def forward(self, emb: torch.Tensor, labels: torch.Tensor):
        # Fp32 for the cosine and the softmax, autocast or not: in bf16 (8 bits of mantissa) the
        # margin's effect on cos would be lost in rounding.
        with torch.autocast(device_type=emb.device.type, enabled=False):
            cos = F.linear(F.normalize(emb.float(), dim=1), F.normalize(self.weight.float(), dim=1))
        cos = cos.clamp(-1.0, 1.0)
        m = self.margin
        sin = torch.sqrt((1.0 - cos * cos).clamp(min=0.0))
        penalised = cos * torch.cos(m) - sin * torch.sin(m)
        penalised = torch.where(cos > torch.cos(math.pi - m), penalised, cos - m * torch.sin(m))
        one_hot = F.one_hot(labels, cos.shape[1]).bool()
        logits = self.scale * torch.where(one_hot, penalised, cos)
        return F.cross_entropy(logits, labels), cos
