"""Speaker classifier heads on the hypersphere: AAM softmax and SphereFace2.

Both map `(B, D)` embeddings and `(B,)` labels to a scalar loss and `(B, S)` cosine logits, and take
the margin of the schedule through `set_margin` (a buffer, so it is part of the checkpoint).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class _SphereHead(nn.Module):
    """What both heads share: a `(S, D)` weight of speaker directions, `scale`, the `margin` buffer and
    the fp32 cosines `(B, D) -> (B, S)` of the embeddings with it."""

    def __init__(self, embedding_size: int, num_classes: int, scale: float, margin: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_size))
        nn.init.xavier_uniform_(self.weight)
        self.scale = scale
        self.register_buffer("margin", torch.tensor(float(margin)))

    def set_margin(self, margin: float) -> None:
        self.margin.fill_(float(margin))

    def cosines(self, emb: torch.Tensor) -> torch.Tensor:
        """`(B, D)` -> `(B, S)` in [-1, 1], in fp32 autocast or not: in bf16 (8 bits of mantissa) the
        margin's effect on the cosine would be lost in rounding."""
        with torch.autocast(device_type=emb.device.type, enabled=False):
            cos = F.linear(F.normalize(emb.float(), dim=1), F.normalize(self.weight.float(), dim=1))
        return cos.clamp(-1.0, 1.0)


class AAMSoftmax(_SphereHead):
    """`(B, D)` embeddings + `(B,)` labels -> scalar loss and `(B, S)` cosine logits.

    logit_j = scale * cos(theta_j), with the target's angle widened to theta_y + margin. The margin
    is a buffer set each step by the margin schedule (`set_margin`), so it is part of the
    checkpoint. Where theta_y + margin would pass pi the penalised logit would rise again; there the
    usual linear extension cos(theta) - margin * sin(margin) keeps it monotonic.
    """

    def __init__(self, embedding_size: int, num_classes: int, scale: float = 32.0, margin: float = 0.2):
        super().__init__(embedding_size, num_classes, scale, margin)

    def forward(self, emb: torch.Tensor, labels: torch.Tensor):
        cos = self.cosines(emb)
        m = self.margin
        sin = torch.sqrt((1.0 - cos * cos).clamp(min=0.0))
        penalised = cos * torch.cos(m) - sin * torch.sin(m)
        penalised = torch.where(cos > torch.cos(math.pi - m), penalised, cos - m * torch.sin(m))
        one_hot = F.one_hot(labels, cos.shape[1]).bool()
        logits = self.scale * torch.where(one_hot, penalised, cos)
        return F.cross_entropy(logits, labels), cos


class SphereFace2(_SphereHead):
    """SphereFace2 (Wen et al., "SphereFace2: Binary Classification is All You Need for Deep Face
    Recognition", ICLR 2022) with the additive cosine margin ("C"), in the speaker-verification form
    WeSpeaker trains: `(B, D)` embeddings + `(B,)` labels -> scalar loss and `(B, S)` cosines.

    Instead of one softmax over S speakers, S independent binary (one-vs-all) classifiers share one
    bias b. With `g(c) = 2 ((c + 1) / 2) ** t - 1` (the similarity adjustment that reshapes the
    cosine distribution), class j's logit is

        z_j = scale * (g(cos_j) - m) + b   for the target j = y,
        z_j = scale * (g(cos_j) + m) + b   for every other class,

    and the loss per sample is `lam * softplus(-z_y) + (1 - lam) * sum_{j != y} softplus(z_j)`,
    averaged over the batch: `lam` balances the one positive against the S - 1 negatives. The paper
    also divides both terms by `scale`; WeSpeaker does not (which amounts to a `scale`-times larger
    learning rate), and neither does this head, so WeSpeaker's learning rates carry over.
    Defaults (scale 32, lam 0.7, t 3, margin 0.2, bias initialised at 0) are WeSpeaker's VoxCeleb
    SphereFace2 settings; the margin given here is the schedule's final value.
    """

    def __init__(self, embedding_size: int, num_classes: int, scale=32.0, margin=0.2, lam=0.7, t: int = 3):
        if not 0.0 < lam < 1.0:
            raise ValueError(f"lam must be in (0, 1), got {lam}")
        if t < 1:
            raise ValueError(f"t must be >= 1, got {t}")
        super().__init__(embedding_size, num_classes, scale, margin)
        # Shape (1,) (WeSpeaker stores (1, 1)): 1-D, so build_optimizer exempts it from weight decay
        # like every other bias; decay would pull the shared threshold toward 0 for no reason.
        self.bias = nn.Parameter(torch.zeros(1))
        self.lam, self.t = lam, t

    def forward(self, emb: torch.Tensor, labels: torch.Tensor):
        # Fp32 throughout, autocast or not (the cosines are fp32 already): the S - 1 negative terms are summed.
        with torch.autocast(device_type=emb.device.type, enabled=False):
            cos = self.cosines(emb)
            g = 2.0 * ((cos + 1.0) * 0.5).pow(self.t) - 1.0
            target = F.one_hot(labels, cos.shape[1]).bool()
            # -m on the target, +m elsewhere: both sides of every decision boundary keep a margin.
            shift = torch.where(target, -self.margin, self.margin)
            z = self.scale * (g + shift) + self.bias.float()
            # softplus(x) = log(1 + exp(x)), computed without overflow for large logits.
            per_class = torch.where(target, self.lam * F.softplus(-z), (1.0 - self.lam) * F.softplus(z))
            loss = per_class.sum(dim=1).mean()
        return loss, cos
