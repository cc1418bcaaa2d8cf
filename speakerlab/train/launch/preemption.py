"""Stopping cleanly when the scheduler asks: SIGTERM (what schedulers send before a kill) or SIGUSR1
(Slurm's `--signal=USR1@120` ahead of a time limit).

The handlers only record the signal, so nothing in progress is cut short: a step, a checkpoint being
written, validation or a data-loader start-up each run to their end, and a second signal changes
nothing. Every optimizer step sums each rank's signals within its one all-reduce (speakerlab.train.step, with
the non-finite guard's flags); they are read on the host on logging and saving steps only (speakerlab.train.step
.settle: no step waits for the host), and `stop_if_requested` sums and reads them before an epoch's first step
and after its last: the decision is common, so all ranks stop after the same step even when the signal reached
one of them.
Then rank 0 writes the mid-epoch checkpoint (the atomic, digest-checked file of every save: `partial_NNN.pt`,
exactly resumable), every rank waits for it at a barrier (so that torchrun, seeing the first process leave, cannot kill
rank 0 mid-write), and all of them exit with EXIT_PREEMPTED. Re-running the same command, or the job
requeued by egs/tools (`scontrol requeue`), resumes exactly there.
"""

from __future__ import annotations

import signal
from typing import Dict, List, Sequence

import torch

from speakerlab.checkpoint import latest_checkpoint
from speakerlab.train.build import Run
from speakerlab.train.launch import distributed as dist_utils
from speakerlab.train.launch.slurm import EXIT_PREEMPTED
from speakerlab.train.state.resume import save_mid_epoch

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

_received: List[int] = []  # signal numbers, in the order they came


class Preempted(Exception):
    """Every rank stopped after the same step; rank 0 wrote the checkpoint. The message says where."""


def _record(signum, frame) -> None:
    _received.append(signum)


def install() -> Dict[int, object]:
    """Record SIGTERM and SIGUSR1 instead of dying of them; returns the handlers they had (for `restore`).
    Call from the main thread once the run is built (a signal during set-up ends the process at once:
    no step has run, nothing is lost) and before the data loader forks its workers: they inherit the
    handler, so a signal sent to a whole process tree does not kill a worker under its loader."""
    _received.clear()
    return {sig: signal.signal(sig, _record) for sig in SIGNALS}


def restore(handlers: Dict[int, object]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def requested() -> List[float]:
    """Per signal of SIGNALS, 1.0 when this process got it: the training step sums them over the ranks in its one
    all-reduce (speakerlab.train.step), as `stop_if_requested` does between epochs."""
    return [float(sig in _received) for sig in SIGNALS]


def chosen(counts: Sequence[float]) -> int:
    """The signal every rank stops by, from `requested()` summed over the ranks (0: none): the largest number."""
    return max((int(sig) for sig, n in zip(SIGNALS, counts) if n > 0), default=0)


def stop_if_requested(run: Run, step_in_epoch: int) -> None:
    """Raise Preempted, after the checkpoint of this point is written, when any rank got a stop signal.
    Every rank must call it at the same points (it is a collective when distributed): between epochs; the
    training step asks within its own all-reduce."""
    counts = requested()
    if run.info.enabled:
        flags = torch.tensor(counts, device=run.device)
        torch.distributed.all_reduce(flags)
        counts = flags.tolist()
    stop(run, step_in_epoch, chosen(counts))


def stop(run: Run, step_in_epoch: int, signum: int) -> None:
    """When `signum` (the same on every rank) is a signal, not 0: rank 0 writes the checkpoint of this point,
    every rank waits for it and raises Preempted."""
    if not signum:
        return
    save_mid_epoch(run, step_in_epoch)
    dist_utils.barrier(run.info)
    name = signal.Signals(signum).name
    written = latest_checkpoint(run.ckpt_dir) if run.info.is_main else "rank 0's checkpoint"
    message = (
        f"stopped by {name} at step {run.state.step} (epoch {run.state.epoch + 1}, "
        f"{step_in_epoch}/{run.steps_per_epoch} steps): {written} written; exit code {EXIT_PREEMPTED}, "
        "the same command resumes from it"
    )
    run.monitor.log(message)
    raise Preempted(message)
