"""Stopping cleanly when the scheduler asks: SIGTERM (what schedulers send before a kill) or SIGUSR1
(Slurm's `--signal=USR1@120` ahead of a time limit); and when the user does: SIGINT (Ctrl-C).

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

Ctrl-C is the same stop with another exit code, EXIT_INTERRUPTED (130, the shell's code for it), which no
wrapper requeues: a user who stops a run means it, and without this the steps since the last epoch's checkpoint
were lost. A second Ctrl-C is not recorded: it raises KeyboardInterrupt, as Ctrl-C always does, for the user who
will not wait for the step to end (that loses the steps since the last checkpoint, as any crash does).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Dict, List, Sequence

import torch

from speakerlab.checkpoint import latest_checkpoint
from speakerlab.train.build import Run
from speakerlab.train.launch import distributed as dist_utils
from speakerlab.train.launch.slurm import EXIT_INTERRUPTED, EXIT_PREEMPTED
from speakerlab.train.state.resume import save_mid_epoch

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

_received: List[int] = []  # signal numbers, in the order they came
_owner: List[int] = []  # the pid that installed the handlers (a data-loader worker inherits them, and stays quiet)


class Preempted(Exception):
    """Every rank stopped after the same step; rank 0 wrote the checkpoint. The message says where; `code` is the
    exit code (EXIT_PREEMPTED, or EXIT_INTERRUPTED for Ctrl-C)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _record(signum, frame) -> None:
    if signum == signal.SIGINT:
        if signal.SIGINT in _received:
            raise KeyboardInterrupt
        if _owner == [os.getpid()] and os.environ.get("RANK", "0") == "0":
            print(
                "SIGINT (Ctrl-C): the run stops at its next logging step and writes a checkpoint that the same command "
                "resumes from; Ctrl-C again stops at once and loses the steps since the last checkpoint",
                file=sys.stderr,
                flush=True,
            )
    _received.append(signum)


def install() -> Dict[int, object]:
    """Record SIGTERM, SIGUSR1 and a first SIGINT instead of dying of them; returns the handlers they had (for
    `restore`). Call from the main thread once the run is built (a signal during set-up ends the process at once:
    no step has run, nothing is lost) and before the data loader forks its workers: they inherit the
    handler, so a signal sent to a whole process group (Ctrl-C in a terminal) does not kill a worker under its
    loader."""
    _received.clear()
    _owner[:] = [os.getpid()]
    return {sig: signal.signal(sig, _record) for sig in SIGNALS}


def restore(handlers: Dict[int, object]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def requested() -> List[float]:
    """Per signal of SIGNALS, 1.0 when this process got it: the training step sums them over the ranks in its one
    all-reduce (speakerlab.train.step), as `stop_if_requested` does between epochs."""
    return [float(sig in _received) for sig in SIGNALS]


def chosen(counts: Sequence[float]) -> int:
    """The signal every rank stops by, from `requested()` summed over the ranks (0: none): the largest number (a
    scheduler's SIGTERM or SIGUSR1 before Ctrl-C's SIGINT, so that a pre-empted job is still requeued)."""
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
    code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED
    written = latest_checkpoint(run.ckpt_dir) if run.info.is_main else "rank 0's checkpoint"
    message = (
        f"stopped by {name} at step {run.state.step} (epoch {run.state.epoch + 1}, "
        f"{step_in_epoch}/{run.steps_per_epoch} steps): {written} written; exit code {code}, "
        "the same command resumes from it"
    )
    run.monitor.log(message)
    raise Preempted(message, code)
