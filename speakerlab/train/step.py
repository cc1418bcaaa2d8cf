"""One optimizer step, read top-down: the schedules of the step, then per micro-batch the loader batch through the
input pipeline to features, the forward and backward, then clipping, the non-finite guard and the update.

    result = train_step(run, batches)    # StepResult: its loss, accuracy and gradient norm on the device
    signal = settle(run, result)         # on logging and saving steps only: the guard's verdicts, stop signals

No host sync in a step: whether the update is taken is decided on the device (a non-finite step is skipped
there), and read on the host by `settle`. The epochs, checkpoints and the command around it are
speakerlab.train.loop's.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from speakerlab import stopping
from speakerlab.train.build import Run
from speakerlab.train.optim.freeze import apply_freeze
from speakerlab.train.optim.schedules import lr_at, margin_at
from speakerlab.train.optim.stability import TrainingStopped, batch_culprits, step_unless


@dataclass
class StepResult:
    """What one optimizer step reports. Its tensors stay on the device (read on logging steps only:
    speakerlab.train.loop)."""

    updated: torch.Tensor  # 0-dim bool: False when the step was not finite and its update skipped
    loss: torch.Tensor
    accuracy: torch.Tensor
    grad_norm: torch.Tensor
    lr: float
    margin: float
    data_wait_s: float
    signals: torch.Tensor  # per stop signal, the ranks that got it (speakerlab.stopping.SIGNALS)


def set_schedules(run: Run) -> tuple:
    """LR, margin and freeze (speakerlab.train.optim.freeze) of the current global step (functions of the step alone:
    hardware-independent). Each optimizer group gets the LR x its `lr_scale` (speakerlab.train.optim.groups)."""
    o, loss = run.cfg.optim, run.cfg.loss
    total = run.cfg.train.epochs * run.steps_per_epoch
    lr = lr_at(run.state.step, total, int(o.warmup_epochs * run.steps_per_epoch), o.lr, o.min_lr)
    margin = margin_at(
        run.state.step, run.steps_per_epoch, loss.margin, loss.margin_start_epoch, loss.margin_warmup_epochs
    )
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    run.raw.classifier.set_margin(margin)
    run.raw.classifier.set_step(run.state.step)  # a sampled (Partial FC) head draws its classes from it
    apply_freeze(run)
    return lr, margin


def drop_unreadable(run: Run, batch: dict, feats: torch.Tensor, labels: torch.Tensor, index: torch.Tensor):
    """Rows whose audio failed to read (data.on_bad_audio: skip) leave the micro-batch: `(B, T, F), (B,),
    (B,) -> (B', T, F), (B',), (B',)` (feats may hold C copies of the rows, copy-major: `(C x B, ...)`). Each is
    named in the log and counted; past data.max_bad_audio, or when no row is left, training stops (a lost mount
    must not quietly train on nothing)."""
    bad = batch.get("bad") or []
    if not any(bad):
        return feats, labels, index
    for why in filter(None, bad):
        run.state.bad_reads += 1
        line = f"skipped an unreadable training utterance ({run.state.bad_reads} so far): {why}"
        if run.info.is_main:
            run.monitor.log(line)
        else:  # the monitor writes on rank 0 only
            print(f"rank {run.info.rank}: {line}", file=sys.stderr, flush=True)
    limit = run.cfg.data.max_bad_audio
    if run.state.bad_reads > limit:
        raise TrainingStopped(
            f"{run.state.bad_reads} training reads failed, more than data.max_bad_audio ({limit}); "
            f"the last: {[b for b in bad if b][-1]}"
        )
    keep = torch.tensor([not b for b in bad])
    if not keep.any():
        raise TrainingStopped(f"no utterance of a micro-batch could be read, e.g. {bad[0]}")
    rows = keep.repeat(len(feats) // len(keep))  # DINO's waves: one augmented copy of each row per crop
    return feats[rows.to(feats.device)], labels[keep.to(labels.device)], index[keep]


def train_step(run: Run, batches: Iterator) -> StepResult:
    """One optimizer step over `accumulation` micro-batches of `batches`.

    Each micro-batch: loader batch -> fp32 features `(B, T, F)` -> loss / accumulation, backward. Under DDP
    gradients are all-reduced on the last micro-batch only. Then unscale, clip, agree and update. Beyond DDP's
    gradients the step makes one small all-reduce (`agree`: the guard's flags, pre-emption's and a sharded head's
    squared norm) and no host read: the verdict is the same on every rank (DDP's gradients and the agreed norm)
    and skips a non-finite update on the device."""
    cfg, accum = run.cfg, run.plan.accumulation
    lr, margin = set_schedules(run)
    loss_sum = torch.zeros((), device=run.device)
    hits = torch.zeros((), device=run.device)
    seen, wait, pending = 0, 0.0, []
    for micro in range(accum):
        t0 = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - t0
        feats, labels = run.inputs(batch)  # on the device: speed, augmentation, fbank, mean norm
        feats, labels, index = drop_unreadable(run, batch, feats, labels, batch["index"])
        pending.append((index, run.guard.nonfinite_rows(feats)))
        last = micro == accum - 1
        with contextlib.nullcontext() if last or not run.info.enabled else run.net.no_sync():
            loss, top1 = run.net(feats, labels)
            run.scaler.scale(loss / accum).backward()
        loss_sum += loss.detach().float() / accum
        hits += (top1 == labels).sum()
        seen += labels.numel()
    run.scaler.unscale_(run.optimizer)
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else math.inf
    params = [p for p in run.raw.parameters() if p.requires_grad]
    flags = []  # the step's one all-reduce, made within the clipping (speakerlab.train.losses.sharded)

    def agree(shard_sq: torch.Tensor) -> torch.Tensor:
        flags.append(agreed_flags(run, loss_sum, shard_sq))
        return flags[0][0]

    grad_norm = run.raw.clip_grad_norm(params, max_norm, agree)
    bad = (flags[0][1] > 0) | run.guard.nonfinite(grad_norm)  # some rank's loss, or the whole gradient's norm
    run.guard.defer(run.state.step, bad, loss_sum, grad_norm, pending)
    # Not scaler.step: the gradients are unscaled already and the verdict is ours (it covers the scaler's own
    # found_inf: a non-finite gradient makes the norm non-finite); scaler.update() reads its own found_inf.
    step_unless(run.optimizer, bad)
    run.raw.end_step(~bad)  # a self-supervised objective's teacher and centre
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.state.step += 1
    accuracy = hits.float() / max(seen, 1)
    return StepResult(~bad, loss_sum, accuracy, grad_norm, lr, margin, wait, flags[0][2:])


def settle(run: Run, last: Optional[StepResult]) -> int:
    """On a logging or saving step, on every rank: the guard's verdicts of the steps since the last settle (their
    skips logged, TrainingStopped past train.max_consecutive_skips, before anything is written) and the stop
    signals of `last`'s all-reduce (signals stay recorded: the last step's flags hold every one so far), in one
    host read. Returns the signal every rank stops by (speakerlab.stopping.chosen), else 0."""
    signals = run.guard.settle(
        lambda pending: batch_culprits(pending, run.loader.dataset.paths, run.info),
        lambda: run.precision.use_scaler and run.scaler.get_scale() >= 1.0,
        None if last is None else last.signals,
    )
    return stopping.chosen(signals)


def agreed_flags(run: Run, loss: torch.Tensor, shard_sq: torch.Tensor) -> torch.Tensor:
    """The step's one collective, a float64 vector on the device summed over the ranks: a sharded head's squared
    row norm (`shard_sq`, 0 otherwise), the ranks whose loss is not finite, the ranks that got each stop signal
    (speakerlab.stopping.SIGNALS). Python numbers enter through `torch.full`: no host copy."""
    signals = [torch.full((), flag, dtype=torch.float64, device=run.device) for flag in stopping.requested()]
    flags = torch.stack([shard_sq.double(), run.guard.nonfinite(loss).double(), *signals])
    if run.info.enabled:
        # Not async_op: the update's verdict needs the sum before the optimizer step, and on NCCL a plain
        # all_reduce is ordered on the device's stream already (the host does not wait for it; gloo's does).
        torch.distributed.all_reduce(flags)
    return flags
