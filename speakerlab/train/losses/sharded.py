"""The margin heads sharded over the ranks of a run, with optional class sampling (Partial FC): a classifier of a
million speakers in 1/W of the memory per rank.

Rank r of W holds the rows of speakers [lo_r, hi_r) (contiguous, sizes differing by at most one). A step:

    1. every rank's `(B, D)` embeddings and labels are gathered: `(N, D)`, N = W x B, on every rank;
    2. each rank computes the cosines of all N embeddings with its own speakers only, `(N, S/W)`, and the
       margins on them (the target's, applied by the rank that holds it; inter-top-k: the k-th largest
       non-target cosine over all ranks, from each rank's own top k);
    3. AAM: the softmax's row max (all_reduce MAX) and sum of exponentials (all_reduce SUM) and the target
       logit (all_reduce SUM), so every rank has the cross entropy of all N rows; SphereFace2: the per-row sum
       of its per-class terms (all_reduce SUM); the loss is the mean over the N rows, the same on every rank;
    4. backward: each rank's logits get their exact gradient (softmax - one-hot) / N from the stored
       statistics, hence its rows' weight gradient; the embedding gradients the ranks' classes contribute are
       summed (all_reduce) and each rank keeps its own B rows, times W, since DDP then averages the embedding
       model's gradients over the W ranks.

The full `(N, S)` logit matrix and the `(S, D)` weight never exist on one rank. At `sample_rate` 1 the loss
and every gradient are those of the full head (speakerlab.train.losses.margin) on the global batch; with DDP the
classifier rows are left out of its gradient averaging (each rank's are its own) and the gradient norm for
clipping is the global one (`clip_grad_norm`), so the ranks stay in step.

Partial FC (An et al., "Partial FC: Training 10 million identities on a single machine", ICCVW 2021):
with `sample_rate` p < 1 each rank keeps, per micro-batch, a fixed number of its shard's S_r speakers (`_columns`:
about p x S_r; the batch's labels held there always), the others drawn uniformly on the device from (train.seed,
step, micro-batch, rank); the softmax (or SphereFace2's sum, its sampled negative terms scaled by the inverse of
their sampled fraction to keep their expected total) runs over those. Accuracy is then measured among the
sampled classes.

Checkpoints hold the full head (speakerlab.train.losses.sharded_state: rank 0 gathers the rows and the optimizer's
per-row state): the same file as the unsharded head's, so resume on another number of ranks (each takes its rows),
checkpoint averaging, large-margin fine-tuning and train.init read it as they read any. The rows start as the plain
head's (the same draws from torch's generator): the same start on any number of ranks, and on one process the
whole run of the plain head for the same seed.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.config import LossSettings
from speakerlab.train.launch.torch_private import require
from speakerlab.train.losses.margin import AAMSoftmax, SphereFace2, fp32, sphereface2_terms

INIT_BLOCK = 65536  # rows drawn at a time at the start (memory only: the values do not depend on it)


def shard_range(num_classes: int, rank: int, world: int) -> Tuple[int, int]:
    """[lo, hi) of the speakers rank `rank` of `world` holds: contiguous, sizes differing by at most one."""
    size, extra = divmod(num_classes, world)
    lo = rank * size + min(rank, extra)
    return lo, lo + size + (rank < extra)


def _world() -> Tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def draw_seed(*numbers: int) -> int:
    """A 63-bit seed of a tuple of non-negative integers (FNV-1a over their decimal digits): the same on every
    machine and Python (hash() of a tuple is not)."""
    value = 0xCBF29CE484222325
    for byte in ",".join(map(str, numbers)).encode():
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value >> 1


class _GatherRows(torch.autograd.Function):
    """`(B, D)` of every rank -> `(W x B, D)` on every rank (B equal: padded by the caller); backward: the sum
    over ranks of the gradient of this rank's rows, times W (DDP averages what the model receives)."""

    @staticmethod
    def forward(ctx, x):
        rank, world = _world()
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        ctx.rank, ctx.world, ctx.rows = rank, world, x.shape[0]
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[ctx.rank * ctx.rows : (ctx.rank + 1) * ctx.rows] * ctx.world


class _SumOverRanks(torch.autograd.Function):
    """The sum of a tensor over ranks; backward passes the gradient to each rank's own part unchanged (the loss,
    the same on every rank, depends on each part through the sum)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward times `factor` (a parameter shared by all ranks, averaged by DDP, whose true
    gradient is the sum of the ranks' parts)."""

    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _ShardedCrossEntropy(torch.autograd.Function):
    """Mean cross entropy over the valid rows of logits whose classes are spread over the ranks.

    logits `(N, C)` this rank's classes; col `(N,)` the target's column here, -1 where another rank holds it
    (or the row is padding); valid `(N,)` bool. Forward: the global row max, sum of exponentials and target
    logit by all_reduce. Backward: (softmax - one-hot) / n_valid of this rank's columns, from the forward's
    statistics: no collective."""

    @staticmethod
    def forward(ctx, logits, col, valid):
        world = _world()[1]
        if logits.shape[1]:
            top = logits.detach().amax(dim=1)
        else:
            top = torch.full((logits.shape[0],), -math.inf, device=logits.device, dtype=logits.dtype)
        if world > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
        exp = torch.exp(logits.detach() - top[:, None])
        total = exp.sum(dim=1)
        held = col >= 0
        at = logits.detach().gather(1, col.clamp(min=0)[:, None]).squeeze(1) if logits.shape[1] else top
        target = torch.where(held, at - top, torch.zeros_like(total))
        if world > 1:
            dist.all_reduce(total)
            dist.all_reduce(target)
        n = valid.sum().clamp(min=1)
        ctx.save_for_backward(exp / total[:, None], col, valid, n)
        return ((torch.log(total) - target) * valid).sum() / n

    @staticmethod
    def backward(ctx, grad):
        softmax, col, valid, n = ctx.saved_tensors
        out = softmax.clone()
        if out.shape[1]:  # minus the one-hot of the targets held here
            out.scatter_add_(1, col.clamp(min=0)[:, None], -(col >= 0).to(out.dtype)[:, None])
        out *= (valid[:, None] * grad / n).to(out.dtype)
        return out, None, None


class _Sharded:
    """What the sharded AAM and SphereFace2 heads share (a mixin over speakerlab.train.losses.margin's heads): the
    shard, the gathering, the sampled columns, the cosines and the top-1 over all ranks."""

    def __init__(self, embedding_size: int, num_classes: int, *, sample_rate: float = 1.0, seed: int = 0, **head):
        state = torch.get_rng_state()  # the base head's placeholder row must not move torch's generator
        super().__init__(embedding_size, 1, **head)  # the head's own settings, then this rank's rows
        torch.set_rng_state(state)
        self._shard(num_classes, sample_rate, seed)

    def describe(self) -> str:
        """The log line of a sharded head: its shard, and the class sampling when there is one."""
        where = f"classifier sharded over {self.world} process{'es' if self.world > 1 else ''}"
        rows = f"speakers {self.lo}-{self.hi - 1} of {self.num_classes} here"
        if self.sample_rate >= 1.0:
            return f"{where} ({rows}); every speaker in each step's softmax"
        kept = f"each other speaker kept with probability {self.sample_rate:g} per micro-batch"
        return f"{where} ({rows}); sampled: {kept}"

    def loss_and_top1(self, emb: torch.Tensor, labels: torch.Tensor):
        emb, labels, valid, own = self._gather(emb, labels)
        cols = self._columns(labels)
        cos = self._cosines(emb, cols)
        target, col = self._targets(labels, cols, cos.shape[1])
        return self._loss(cos, target, col, valid, cols), self._top1(cos, cols, own)

    def _shard(self, num_classes: int, sample_rate: float, seed: int) -> None:
        self.rank, self.world = _world()
        self.num_classes, self.lo, self.hi = num_classes, *shard_range(num_classes, self.rank, self.world)
        self.sample_rate, self.seed, self.step, self.micro = sample_rate, seed, 0, 0
        self.rows: Optional[int] = None  # each rank's micro-batch rows are padded to this (the batch plan's)
        k, dim = self.subcenters, self.weight.shape[1]
        total, first, last = num_classes * k, self.lo * k, self.hi * k
        # As the plain head's xavier_uniform_ of the full (S x K, D) weight: the same bound, the same draws from
        # torch's generator in the same order (its CPU uniform_ draws element by element, so blocks of rows give
        # the values of one draw), every rank drawing all rows and keeping its own: for the same seed the rows of
        # the plain head on any number of ranks, and the generator left where the plain head leaves it.
        bound = math.sqrt(3.0) * math.sqrt(2.0 / float(dim + total))
        rows = []
        for start in range(0, total, INIT_BLOCK):
            drawn = torch.empty(min(INIT_BLOCK, total - start), dim).uniform_(-bound, bound)
            rows.append(drawn[max(first - start, 0) : max(min(last - start, len(drawn)), 0)])
        self.weight = nn.Parameter(torch.cat(rows) if rows else torch.zeros(0, dim))

    def set_step(self, step: int) -> None:
        self.step, self.micro = step, 0

    def forward(self, emb: torch.Tensor, labels: torch.Tensor):
        return self.loss_and_top1(emb, labels)

    def _gather(self, emb: torch.Tensor, labels: torch.Tensor):
        """(embeddings `(N, D)` fp32, labels `(N,)` (-1: padding), valid `(N,)`, this rank's rows `[a, b)`).

        Each rank's rows are padded to `rows` (set by the training run: its micro-batch size; a rank may have dropped
        unreadable rows) so that no rank needs the others' sizes; without it, the largest size, gathered."""
        emb = fp32(emb)
        if self.world == 1:
            return emb, labels, torch.ones_like(labels, dtype=torch.bool), (0, emb.shape[0])
        if self.rows is not None and emb.shape[0] <= self.rows:
            most = self.rows
        else:
            sizes = [torch.zeros(1, dtype=torch.int64, device=emb.device) for _ in range(self.world)]
            dist.all_gather(sizes, torch.tensor([emb.shape[0]], device=emb.device))
            most = int(max(s.item() for s in sizes))
        pad = most - emb.shape[0]
        emb = F.pad(emb, (0, 0, 0, pad))
        labels = F.pad(labels, (0, pad), value=-1)
        parts = [torch.empty_like(labels) for _ in range(self.world)]
        dist.all_gather(parts, labels)
        all_labels = torch.cat(parts)
        own = (self.rank * most, self.rank * most + most - pad)
        return _GatherRows.apply(emb), all_labels, all_labels >= 0, own

    def _columns(self, labels: torch.Tensor) -> Optional[torch.Tensor]:
        """This rank's speakers in the softmax of this micro-batch (indices into its shard, ascending), or None: all.

        `labels (N,)`, -1 for padding. A fixed number, k = min(S_r, max(ceil(p x S_r), N)) of the S_r held here,
        drawn on the device: every positive held here (N rows hold at most N), then the others uniformly at random
        from a generator seeded by (train.seed, step, micro-batch, rank). No host read: k is known beforehand."""
        if self.sample_rate >= 1.0 or not self.training:
            return None
        n = self.hi - self.lo
        k = min(n, max(math.ceil(self.sample_rate * n), labels.shape[0]))
        gen = torch.Generator(device=labels.device).manual_seed(draw_seed(self.seed, self.step, self.micro, self.rank))
        score = torch.rand(n, generator=gen, device=labels.device)
        held = (labels >= self.lo) & (labels < self.hi)
        positive = torch.where(held, 2.0, 0.0).to(score.dtype)  # above any draw: positives are always kept
        score = score.scatter_reduce(0, (labels - self.lo).clamp(0, max(n - 1, 0)), positive, reduce="amax")
        self.micro += 1
        return torch.topk(score, k).indices.sort().values

    def _cosines(self, emb: torch.Tensor, cols: Optional[torch.Tensor]) -> torch.Tensor:
        """`(N, D)` -> `(N, C)` cosines with this rank's (sampled) speakers, fp32, each its nearest sub-center."""
        weight = fp32(self.weight)
        if cols is not None:
            weight = weight.view(-1, self.subcenters, weight.shape[1])[cols].reshape(-1, weight.shape[1])
        with torch.autocast(device_type=emb.device.type, enabled=False):
            cos = F.linear(F.normalize(emb, dim=1), F.normalize(weight, dim=1))
        if self.subcenters > 1:
            cos = cos.view(cos.shape[0], -1, self.subcenters).amax(dim=2)
        return cos.clamp(-1.0, 1.0)

    def _targets(self, labels: torch.Tensor, cols: Optional[torch.Tensor], width: int):
        """(target `(N, C)` bool, its column `(N,)`, -1 where another rank holds the row's speaker)."""
        local = labels - self.lo
        held = (labels >= self.lo) & (labels < self.hi)
        if cols is None:
            col = torch.where(held, local, torch.full_like(local, -1))
        else:
            position = torch.full((self.hi - self.lo,), -1, dtype=torch.long, device=labels.device)
            position[cols] = torch.arange(len(cols), device=labels.device)
            col = torch.where(held, position[local.clamp(0, self.hi - self.lo - 1)], torch.full_like(local, -1))
        target = torch.arange(width, device=labels.device)[None, :] == col[:, None]  # col -1 matches no column
        return target, col

    def _top1(self, cos: torch.Tensor, cols: Optional[torch.Tensor], own: Tuple[int, int]) -> torch.Tensor:
        """The speaker of the largest cosine over all ranks, for this rank's rows `(b,)`."""
        cos = cos.detach()
        if cos.shape[1]:
            value, index = cos.max(dim=1)
            index = (index if cols is None else cols[index]) + self.lo
        else:
            value = torch.full((cos.shape[0],), -math.inf, device=cos.device)
            index = torch.zeros(cos.shape[0], dtype=torch.long, device=cos.device)
        if self.world > 1:  # every row's best over the ranks' shards
            mine = torch.stack([value.double(), index.double()])
            parts = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(parts, mine)
            both = torch.stack(parts)  # (W, 2, N)
            best = both[:, 0].argmax(dim=0)
            index = both[best, 1, torch.arange(cos.shape[0], device=cos.device)].long()
        return index[own[0] : own[1]]

    def _threshold(self, cos: torch.Tensor, target: torch.Tensor, k: int) -> torch.Tensor:
        """`(N,)` the k-th largest non-target cosine over all ranks (inter-top-k)."""
        negatives = cos.detach().masked_fill(target, -2.0)
        top = torch.topk(negatives, min(k, negatives.shape[1]), dim=1).values
        top = F.pad(top, (0, k - top.shape[1]), value=-2.0)
        if self.world > 1:
            parts = [torch.empty_like(top) for _ in range(self.world)]
            dist.all_gather(parts, top.contiguous())
            top = torch.cat(parts, dim=1)
        return torch.topk(top, k, dim=1).values[:, -1]

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        """A full head's rows (a checkpoint: any number of ranks wrote it) are cut to this rank's shard."""
        key = prefix + "weight"
        rows = self.num_classes * self.subcenters
        if key in state_dict and state_dict[key].shape[0] == rows != self.weight.shape[0]:
            state_dict = dict(state_dict)
            state_dict[key] = state_dict[key][self.lo * self.subcenters : self.hi * self.subcenters]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)


class ShardedAAM(_Sharded, AAMSoftmax):
    """AAMSoftmax (sub-centers, inter-top-k) over this rank's speakers: `(B, D)`, `(B,)` -> (loss, `(B,)` top-1)."""

    def _loss(self, cos, target, col, valid, cols):
        threshold = self._threshold(cos, target, self.inter_topk) if self.topk_ratio > 0 else None
        return _ShardedCrossEntropy.apply(self.logits(cos, target, threshold), col, valid)


class ShardedSphereFace2(_Sharded, SphereFace2):
    """SphereFace2 over this rank's speakers: `(B, D)`, `(B,)` -> (loss, `(B,)` top-1)."""

    def _loss(self, cos, target, col, valid, cols):
        bias = _ScaleGrad.apply(fp32(self.bias), float(self.world)) if self.world > 1 else fp32(self.bias)
        terms = sphereface2_terms(cos, target, self.margin, self.scale, bias, self.lam, self.t)
        if cols is not None:  # the sampled negatives stand for all: their expected sum is the full one's
            positives = target.any(dim=0).sum()  # all of them sampled: k - P of the S_r - P others were
            others = self.hi - self.lo - positives
            fraction = (len(cols) - positives).clamp(min=1) / others.clamp(min=1)
            terms = torch.where(target, terms, terms / fraction)
        rows = terms.sum(dim=1)
        if self.world > 1:
            rows = _SumOverRanks.apply(rows)
        return (rows * valid).sum() / valid.sum().clamp(min=1)


Sharded = (ShardedAAM, ShardedSphereFace2)


def make_head(loss: LossSettings, embedding_size: int, num_classes: int, seed: int) -> nn.Module:
    """The classifier head of the loss section: sharded over the ranks with `loss.shard_classes` or a
    `loss.sample_rate` below 1, else the plain head; margin 0 (the schedule sets it)."""
    common = dict(scale=loss.scale, margin=0.0)
    if loss.name == "sphereface2":
        kind, args = (ShardedSphereFace2, SphereFace2), dict(lam=loss.sphereface2_lambda, t=loss.sphereface2_t)
    else:
        kind = (ShardedAAM, AAMSoftmax)
        args = dict(
            subcenters=loss.subcenters,
            inter_topk=loss.inter_topk,
            inter_topk_margin=loss.inter_topk_margin,
            final_margin=loss.margin,
        )
    if loss.shard_classes or loss.sample_rate < 1.0:
        return kind[0](embedding_size, num_classes, sample_rate=loss.sample_rate, seed=seed, **common, **args)
    return kind[1](embedding_size, num_classes, **common, **args)


def keep_out_of_ddp(net: nn.Module) -> None:
    """A sharded classifier's rows are each rank's own: DDP must neither broadcast nor average them."""
    names = [f"{name}.weight" for name, m in net.named_modules() if isinstance(m, Sharded)]
    if names:  # checked on one process too: the same config fails at start-up, not once it scales out
        require("ddp_ignore")
    if names and _world()[1] > 1:
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, names)


def clip_grad_norm(
    params: List[torch.Tensor], max_norm: float, head: nn.Module, agree: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over `params` with a sharded head's rows counted over all ranks: the norm
    of the whole gradient (a 0-dim tensor), the same on every rank (the replicated parameters' gradients are
    already averaged), so every rank scales alike. `agree(x) -> x summed over the ranks` is the training step's
    one all-reduce, called once: with this rank's rows' squared norm (a sharded head on several ranks, before the
    clipping), else with zero after it (a signal during the clipping is in that step's all-reduce)."""
    if not isinstance(head, Sharded) or head.world == 1:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        agree(torch.zeros((), dtype=torch.float64, device=norm.device))
        return norm
    grads = [p.grad for p in params if p.grad is not None]
    shard = [p.grad for p in params if p is head.weight and p.grad is not None]
    rest = [g for g in grads if all(g is not s for s in shard)]
    zero = torch.zeros((), dtype=torch.float64, device=head.weight.device)
    own = agree(sum((torch.linalg.vector_norm(g).double() ** 2 for g in shard), zero))
    total = torch.sqrt(own + sum((torch.linalg.vector_norm(g).double() ** 2 for g in rest), zero))
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
