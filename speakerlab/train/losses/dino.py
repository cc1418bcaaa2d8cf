"""DINO, self-distillation without labels (loss.name dino; the settings: speakerlab.objectives.DinoSettings).

    objective = DinoObjective(settings, model, embedding_size)   # the run's `classifier`: head, teacher, centre
    loss = objective.loss(student_logits, teacher_logits, unit_embeddings, mean_embeddings)

The student is the embedding model plus `DinoHead`; the teacher the same pair, an EMA of the student
(speakerlab.train.losses.teacher), that only sees the global crops. For each teacher crop i and student crop
j != i: cross-entropy between softmax((teacher_i - centre) / teacher_temp) and softmax(student_j /
student_temp), averaged over the pairs. The centre is a running mean (center_momentum per optimizer step) of the
teacher's outputs over the whole global batch: it keeps one prototype from winning every crop; the sharp teacher
temperature keeps the outputs from going uniform. Both are the collapse guards of the DINO paper; KoLeo
(koleo_weight) optionally spreads the student's unit embeddings within a micro-batch, and RDINO's regularisers
(diversity_weight, redundancy_weight) act on the student's embeddings averaged over the global crops: a hinge that
keeps each dimension's std across the micro-batch at 1 or more, and the squared off-diagonal covariances / D.
A contrastive term (contrastive_weight: InfoNCE between the global crops of the micro-batch, `info_nce`) joins
the distillation (C3-DINO) or replaces it (distill_weight 0: SimCLR, with no teacher, prototypes or local crops).

The objective's state (head, teacher, centre) is a module: the checkpoint keeps it as the classifier, so a
resumed run continues with the same teacher and centre; this step's sums (centre, statistics) are not saved: a
checkpoint is written between steps.
"""

from __future__ import annotations

import copy
from typing import Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from speakerlab.objectives import DinoSettings
from speakerlab.train.losses.teacher import copy_into, ema_update, teacher_momentum_at, teacher_temp_at

STATS = ("teacher_entropy", "teacher_kl", "embedding_spread", "diversity_loss", "redundancy_loss", "contrastive_loss")


class DinoHead(nn.Module):
    """Projection head `(B, D) -> (B, K)`: an MLP to a bottleneck, L2-normalised (`project`, `(B, D) -> (B,
    bottleneck)`), then a weight-normalised linear layer onto the K prototypes whose norm is fixed at 1 (only their
    directions train); no prototypes without self-distillation (distill_weight 0)."""

    def __init__(self, in_dim: int, s: DinoSettings):
        super().__init__()
        dims = [in_dim] + [s.hidden_dim] * (s.head_layers - 1) + [s.bottleneck_dim] if s.head_layers else []
        layers: List[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < s.head_layers - 1:
                layers += [nn.BatchNorm1d(b)] if s.head_batchnorm else []
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers) if s.head_layers else nn.Identity()  # 0: SimCLR on the embedding
        self.prototypes = None
        if s.distill_weight == 0:
            return
        self.prototypes = nn.utils.parametrizations.weight_norm(nn.Linear(s.bottleneck_dim, s.prototypes, bias=False))
        norm = self.prototypes.parametrizations.weight.original0
        norm.data.fill_(1.0)
        norm.requires_grad_(False)

    @property
    def directions(self) -> nn.Parameter:
        """The prototypes' direction weights (K, bottleneck): what freeze_prototypes_epochs holds still."""
        return self.prototypes.parametrizations.weight.original1

    def project(self, emb: Tensor) -> Tensor:
        return F.normalize(self.mlp(emb), dim=-1)

    def forward(self, emb: Tensor) -> Tensor:
        return self.prototypes(self.project(emb))


def koleo(unit: Tensor, eps: float = 1e-8) -> Tensor:
    """Kozachenko-Leonenko spreading term of unit vectors `(B, D) -> ()`: minus the mean log distance of each to
    its nearest neighbour (large when some are close)."""
    dist = torch.cdist(unit, unit)
    dist = dist + torch.eye(len(unit), device=unit.device, dtype=unit.dtype) * 4.0  # never its own neighbour
    return -torch.log(dist.min(dim=1).values + eps).mean()


def info_nce(views: Tensor, temp: float) -> tuple:
    """InfoNCE of unit vectors `views (V, B, d)`: V crops of each of B utterances. Every crop's positives are the
    other crops of its utterance, its negatives the crops of the others; the loss is minus the mean log-probability
    of the positives under a softmax over all other crops at `temp` (SimCLR's NT-Xent for V = 2): `()`."""
    v, b, _ = views.shape
    flat = views.reshape(v * b, -1)
    sim = flat @ flat.T / temp
    self_pair = torch.eye(v * b, dtype=torch.bool, device=flat.device)
    sim = sim.masked_fill(self_pair, float("-inf"))
    owner = torch.arange(b, device=flat.device).repeat(v)
    positive = (owner[:, None] == owner[None, :]) & ~self_pair
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    return -(log_prob.masked_fill(~positive, 0.0).sum(dim=1) / (v - 1)).mean()


@torch.no_grad()
def nearest_is_own(views: Tensor) -> Tensor:
    """`views (V, B, d)` as in info_nce -> `(B,)` bool: the nearest other crop to each utterance's first crop is
    one of its own."""
    v, b, _ = views.shape
    flat = views.reshape(v * b, -1)
    rows = torch.arange(b, device=flat.device)
    sim = flat[:b] @ flat.T
    sim[rows, rows] = float("-inf")  # not itself
    return sim.argmax(dim=1) % b == rows


def spread(unit: Tensor) -> Tensor:
    """Per-dimension std across the batch of unit embeddings `(B, D)`, x sqrt(D): ~1 spread over the sphere,
    0 when all are alike."""
    return unit.float().std(dim=0).mean() * unit.shape[1] ** 0.5


def diversity(emb: Tensor, eps: float = 1e-4) -> Tensor:
    """RDINO's diversity regularisation of embeddings `(B, D) -> ()`: the mean over dimensions of max(0, 1 - std),
    the std across the batch; 1 when all rows are alike, 0 when every dimension varies by 1 or more."""
    return F.relu(1.0 - torch.sqrt(emb.var(dim=0) + eps)).mean()


def redundancy(emb: Tensor) -> Tensor:
    """RDINO's redundancy elimination of embeddings `(B, D) -> ()`: the sum of the squared off-diagonal entries of
    their covariance across the batch, / D; 0 when the dimensions are uncorrelated."""
    centred = emb - emb.mean(dim=0)
    cov = centred.T @ centred / max(len(emb) - 1, 1)
    return (cov.pow(2).sum() - cov.diagonal().pow(2).sum()) / emb.shape[1]


class DinoObjective(nn.Module):
    """The head, the teacher (a copy of `model` and of the head, no gradient) and the centre of one run.

    `set_step(step)` sets the schedules of the step (after `set_clock(total_steps, steps_per_epoch)`);
    `loss(...)` gives the loss of a micro-batch and adds to this step's sums; `end_step(updated, model)`
    moves the centre and the teacher once per optimizer step, with the sums of every micro-batch and rank."""

    def __init__(self, s: DinoSettings, model: nn.Module, embedding_size: int):
        super().__init__()
        self.s = s
        self.head = DinoHead(embedding_size, s)
        self.distill = s.distill_weight > 0  # else no teacher: a contrastive run alone
        teacher = {"model": copy.deepcopy(model), "head": copy.deepcopy(self.head)} if self.distill else {}
        self.teacher = nn.ModuleDict(teacher)
        self.teacher.requires_grad_(False)
        self.register_buffer("center", torch.zeros(1, s.prototypes))
        self.register_buffer("started", torch.zeros(()))  # 1 once the teacher was copied from the student
        # This step's sums: teacher outputs (K), rows; the statistics since they were last read (STATS, then the
        # micro-batches they sum over).
        self.register_buffer("step_sums", torch.zeros(s.prototypes + 1), persistent=False)
        self.register_buffer("stat_sums", torch.zeros(len(STATS) + 1), persistent=False)
        self.step, self.total, self.steps_per_epoch = 0, 1, 1
        self.temp, self.momentum, self.frozen = s.teacher_temp_start, s.teacher_momentum, True
        self.last: Dict[str, float] = {}  # the statistics as last read
        self.checked = False  # `started` was read by this process
        if self.distill:
            self.head.directions.register_hook(lambda g: torch.zeros_like(g) if self.frozen else g)

    def set_clock(self, total_steps: int, steps_per_epoch: int) -> None:
        self.total, self.steps_per_epoch = total_steps, steps_per_epoch

    def set_margin(self, margin: float) -> None:
        """No margin: the training step sets one on every objective."""

    def set_step(self, step: int) -> None:
        s = self.s
        self.step = step
        self.temp = teacher_temp_at(
            step, self.steps_per_epoch, s.teacher_temp_start, s.teacher_temp, s.teacher_temp_warmup_epochs
        )
        self.momentum = teacher_momentum_at(step, self.total, s.teacher_momentum)
        self.frozen = step < s.freeze_prototypes_epochs * self.steps_per_epoch

    def start(self, model: nn.Module) -> None:
        """At the first step (after train.init or from scratch), the teacher is the student. The buffer (in the
        checkpoint) is read once per process: reading a device tensor waits for the device."""
        if self.checked:
            return
        if not self.started and self.distill:
            copy_into(self.teacher["model"], model)
            copy_into(self.teacher["head"], self.head)
            self.started.fill_(1.0)
        self.checked = True

    def loss(
        self, student: List[Tensor], teacher: List[Tensor], unit: Tensor, emb: Tensor, views: Optional[Tensor] = None
    ) -> Tensor:
        """`student`: logits `(B, K)` of every crop, global ones first; `teacher`: of the global crops (both empty
        without distillation); `unit`: the student's unit embeddings of the first global crop `(B, D)`; `emb`: the
        student's embeddings averaged over the global crops `(B, D)` (RDINO's terms); `views`: the head's unit
        projections of the global crops `(global_crops, B, bottleneck)` (the contrastive term). Returns the loss
        `()`."""
        s = self.s
        zero = unit.new_zeros(())
        loss, entropy, kl, contrast = zero, zero, zero, zero
        if self.distill:
            t = [F.softmax((x.float() - self.center) / self.temp, dim=-1) for x in teacher]
            logs = [F.log_softmax(x.float() / s.student_temp, dim=-1) for x in student]
            pairs = [(i, j) for i in range(len(t)) for j in range(len(logs)) if i != j]
            distill = sum(-(t[i] * logs[j]).sum(dim=-1).mean() for i, j in pairs) / len(pairs)
            with torch.no_grad():
                outputs = torch.cat(teacher).float()
                self.step_sums[:-1] += outputs.sum(dim=0)
                self.step_sums[-1] += len(outputs)
                entropy = torch.stack([-(p * torch.log(p.clamp_min(1e-12))).sum(dim=-1).mean() for p in t]).mean()
                # Each teacher crop meets the same number of student crops: the mean cross-entropy is its entropy
                # plus the mean KL(teacher || student).
                kl = distill.detach() - entropy
            loss = s.distill_weight * distill
        if s.contrastive_weight > 0:
            contrast = info_nce(views.float(), s.contrastive_temp)
            loss = loss + s.contrastive_weight * contrast
        # RDINO's terms are logged in every run (they show collapse too); they take gradient when weighted
        with torch.set_grad_enabled(torch.is_grad_enabled() and s.diversity_weight > 0):
            div = diversity(emb.float())
        with torch.set_grad_enabled(torch.is_grad_enabled() and s.redundancy_weight > 0):
            red = redundancy(emb.float())
        with torch.no_grad():
            stats = [entropy, kl, spread(unit), div.detach(), red.detach(), contrast.detach(), torch.ones_like(kl)]
            self.stat_sums += torch.stack(stats)
        if s.koleo_weight > 0:
            loss = loss + s.koleo_weight * koleo(unit.float())
        if s.diversity_weight > 0:
            loss = loss + s.diversity_weight * div
        if s.redundancy_weight > 0:
            loss = loss + s.redundancy_weight * red
        return loss

    @torch.no_grad()
    def end_step(self, updated: bool, model: nn.Module) -> None:
        """The centre and the teacher move once per optimizer step (when the step was taken), from the teacher
        outputs of the whole global batch (summed over the ranks)."""
        sums = self.step_sums.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
        self.step_sums.zero_()
        if not updated or not self.distill:
            return
        m = self.s.center_momentum
        self.center.mul_(m).add_(sums[:-1].unsqueeze(0) / sums[-1].clamp_min(1.0), alpha=1.0 - m)
        ema_update(
            [*self.teacher["model"].parameters(), *self.teacher["head"].parameters()],
            [*model.parameters(), *self.head.parameters()],
            self.momentum,
        )

    def scalars(self) -> Dict[str, float]:
        """The collapse signals since they were last read, over every rank: teacher entropy and KL, embedding
        spread, centre norm; and the schedules. Reading is a host sync: the log does it every few steps."""
        sums = self.stat_sums.clone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
        self.stat_sums.zero_()
        *totals, count = sums.tolist()
        if count:  # micro-batches since the last read (none: nothing new to say)
            self.last = {name: total / count for name, total in zip(STATS, totals)}
        return {
            **self.last,
            "center_norm": float(self.center.norm()),
            "teacher_temp": self.temp,
            "teacher_momentum": self.momentum,
        }

    def collapse_problem(self) -> Optional[str]:
        """Why the run's embeddings are collapsed (the last read spread below dino.collapse_spread), or None."""
        value = self.last.get("embedding_spread")
        if value is None or value >= self.s.collapse_spread:
            return None
        return (
            f"the embeddings collapsed: their spread is {value:.3g} (below dino.collapse_spread "
            f"{self.s.collapse_spread:g}: every utterance gets nearly the same embedding, so verification is "
            "chance); see docs/selfsup.md on collapse (teacher temperature, centering, KoLeo, LR)"
        )
