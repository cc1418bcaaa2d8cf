"""Speaker classifier heads on the hypersphere: AAM softmax (optionally with sub-centers and the inter-top-k
penalty) and SphereFace2.

Both map `(B, D)` embeddings and `(B,)` labels to a scalar loss and `(B, S)` cosine logits, and take
the margin of the schedule through `set_margin` (a buffer, so it is part of the checkpoint). The formulas are
functions of the cosines (`angular_target`, `widened`, `hardest`, `sphereface2_terms`), so that the head sharded
over ranks (speakerlab.train.losses.sharded) computes exactly these on its share of the classes.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def fp32(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32, or float64 when it is: the heads compute in at least fp32 (tests compare in float64)."""
    return x if x.dtype == torch.float64 else x.float()


def angular_target(cos: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """cos(theta + m) of cosines `cos` (any shape); past theta = pi - m, where it would rise again, the linear
    extension cos(theta) - m sin(m) keeps it monotonic."""
    sin = torch.sqrt((1.0 - cos * cos).clamp(min=0.0))
    penalised = cos * torch.cos(m) - sin * torch.sin(m)
    return torch.where(cos > torch.cos(math.pi - m), penalised, cos - m * torch.sin(m))


def widened(cos: torch.Tensor, mp: torch.Tensor) -> torch.Tensor:
    """cos(theta - mp): a hard negative's cosine raised by the inter-top-k margin `mp` (any shape)."""
    sin = torch.sqrt((1.0 - cos * cos).clamp(min=0.0))
    return cos * torch.cos(mp) + sin * torch.sin(mp)


def hardest(cos: torch.Tensor, target: torch.Tensor, k: int, threshold=None) -> torch.Tensor:
    """`(B, S)` bool: each row's `k` largest non-target cosines (`target` `(B, S)` bool); with `threshold` `(B,)`,
    the non-target cosines >= it (the k-th largest over all shards of the classes)."""
    negatives = cos.masked_fill(target, -2.0)
    if threshold is not None:
        return negatives >= threshold[:, None]
    top = torch.topk(negatives, min(k, cos.shape[1]), dim=1).indices
    return torch.zeros_like(target).scatter_(1, top, True) & ~target


def sphereface2_terms(cos, target, margin, scale: float, bias, lam: float, t: int) -> torch.Tensor:
    """`(B, S)` per-class terms of the SphereFace2 loss (see SphereFace2): lam softplus(-z) on the target, (1 - lam)
    softplus(z) elsewhere, z = scale (g(cos) -+ m) + bias, in the dtype of `cos`."""
    g = 2.0 * ((cos + 1.0) * 0.5).pow(t) - 1.0
    # -m on the target, +m elsewhere: both sides of every decision boundary keep a margin.
    z = scale * (g + torch.where(target, -margin, margin)) + bias
    # softplus(x) = log(1 + exp(x)), computed without overflow for large logits.
    return torch.where(target, lam * F.softplus(-z), (1.0 - lam) * F.softplus(z))


class _SphereHead(nn.Module):
    """What both heads share: a `(S x K, D)` weight of speaker directions (K sub-centers per speaker, rows of one
    speaker together), `scale`, the `margin` buffer and the fp32 cosines `(B, D) -> (B, S)` of the embeddings with
    it (a speaker's: its nearest sub-center's)."""

    def __init__(self, embedding_size: int, num_classes: int, scale: float, margin: float, subcenters: int = 1):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes * subcenters, embedding_size))
        nn.init.xavier_uniform_(self.weight)
        self.scale, self.subcenters = scale, subcenters
        self.register_buffer("margin", torch.tensor(float(margin)))

    def set_margin(self, margin: float) -> None:
        self.margin.fill_(float(margin))

    def set_step(self, step: int) -> None:
        """The optimizer step about to run (the sharded head draws its sampled classes from it)."""

    def cosines(self, emb: torch.Tensor) -> torch.Tensor:
        """`(B, D)` -> `(B, S)` in [-1, 1], in fp32 autocast or not: in bf16 (8 bits of mantissa) the
        margin's effect on the cosine would be lost in rounding."""
        with torch.autocast(device_type=emb.device.type, enabled=False):
            cos = F.linear(F.normalize(fp32(emb), dim=1), F.normalize(fp32(self.weight), dim=1))
        if self.subcenters > 1:
            cos = cos.view(cos.shape[0], -1, self.subcenters).amax(dim=2)
        return cos.clamp(-1.0, 1.0)

    def loss_and_top1(self, emb: torch.Tensor, labels: torch.Tensor):
        """(scalar loss, `(B,)` the class of the largest cosine): what the training step needs."""
        loss, cos = self(emb, labels)
        return loss, cos.argmax(dim=1)


class AAMSoftmax(_SphereHead):
    """`(B, D)` embeddings + `(B,)` labels -> scalar loss and `(B, S)` cosine logits.

    logit_j = scale * cos(theta_j), with the target's angle widened to theta_y + margin. The margin
    is a buffer set each step by the margin schedule (`set_margin`), so it is part of the
    checkpoint. Where theta_y + margin would pass pi the penalised logit would rise again; there the
    usual linear extension cos(theta) - margin * sin(margin) keeps it monotonic.

    The variant of WeSpeaker's large recipes (ArcMarginProduct_intertopk_subcenter; Zhao et al., "Multi-query
    multi-head attention pooling and inter-topk penalty for speaker verification", ICASSP 2022, and Deng et al.,
    "Sub-center ArcFace", ECCV 2020): `subcenters` K directions per speaker, its cosine the largest of them (a
    noisy utterance pulls only its nearest sub-center); `inter_topk` k > 0: the k non-target speakers of largest
    cosine get cos(theta - mp) instead, mp = `inter_topk_margin` x margin / `final_margin` (it rises with the
    margin schedule to inter_topk_margin, as WeSpeaker's rises to its mp with the margin reaching 0.2).
    """

    def __init__(
        self,
        embedding_size: int,
        num_classes: int,
        scale: float = 32.0,
        margin: float = 0.2,
        subcenters: int = 1,
        inter_topk: int = 0,
        inter_topk_margin: float = 0.06,
        final_margin: float = 0.2,
    ):
        super().__init__(embedding_size, num_classes, scale, margin, subcenters)
        self.inter_topk = inter_topk
        self.topk_ratio = inter_topk_margin / final_margin if inter_topk and final_margin > 0 else 0.0

    def logits(self, cos: torch.Tensor, target: torch.Tensor, threshold=None) -> torch.Tensor:
        """`(B, S)` scaled logits of cosines `cos` with `target` `(B, S)` bool (the hard-negative `threshold` `(B,)`
        given by the sharded head)."""
        m = self.margin
        out = torch.where(target, angular_target(cos, m), cos)
        if self.topk_ratio > 0:  # at margin 0, mp is 0 and widened() leaves the cosine as it is
            hard = hardest(cos, target, self.inter_topk, threshold)
            out = torch.where(hard, widened(cos, m * self.topk_ratio), out)
        return self.scale * out

    def forward(self, emb: torch.Tensor, labels: torch.Tensor):
        cos = self.cosines(emb)
        target = F.one_hot(labels, cos.shape[1]).bool()
        return F.cross_entropy(self.logits(cos, target), labels), cos


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
            target = F.one_hot(labels, cos.shape[1]).bool()
            terms = sphereface2_terms(cos, target, self.margin, self.scale, fp32(self.bias), self.lam, self.t)
            loss = terms.sum(dim=1).mean()
        return loss, cos
