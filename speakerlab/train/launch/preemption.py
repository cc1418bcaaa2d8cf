"""Stopping every rank of a run after the same step when one of them got a stop signal (speakerlab.stopping: a
scheduler's SIGTERM or SIGUSR1, the user's Ctrl-C; recorded, not died of).

Nothing in progress is cut short: a step, a checkpoint being written, validation or a data-loader start-up each
run to their end. Every optimizer step sums each rank's signals within its one all-reduce (speakerlab.train.step,
with the non-finite guard's flags); they are read on the host on logging and saving steps only
(speakerlab.train.step.settle: no step waits for the host), and `stop_if_requested` sums and reads them before an
epoch's first step and after its last: the decision is common, so all ranks stop after the same step even when
the signal reached one of them.
Then rank 0 writes the mid-epoch checkpoint (the atomic, digest-checked file of every save: `partial_NNN.pt`,
exactly resumable), every rank waits for it at a barrier (so that torchrun, seeing the first process leave, cannot kill
rank 0 mid-write), and all of them exit with the signal's code: 75 (EXIT_PREEMPTED; egs/tools requeues a Slurm job
on it) or 130 for Ctrl-C. Re-running the same command, or the requeued job, resumes exactly there; before, Ctrl-C
lost the steps since the last epoch's checkpoint.
"""

from __future__ import annotations

import signal
from typing import Dict

import torch

from speakerlab import stopping
from speakerlab.checkpoint import latest_checkpoint
from speakerlab.train.build import Run
from speakerlab.train.launch import distributed as dist_utils
from speakerlab.train.state.resume import save_mid_epoch

ON_INTERRUPT = "the run stops at its next logging step and writes a checkpoint that the same command resumes from"


class Preempted(Exception):
    """Every rank stopped after the same step; rank 0 wrote the checkpoint. The message says where; `code` is the
    exit code (speakerlab.stopping.exit_code)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def install() -> Dict[int, object]:
    """speakerlab.stopping.install for a training run: call once the run is built and before the data loader forks
    its workers (they inherit the handler)."""
    return stopping.install(ON_INTERRUPT)


def stop_if_requested(run: Run, step_in_epoch: int) -> None:
    """Raise Preempted, after the checkpoint of this point is written, when any rank got a stop signal.
    Every rank must call it at the same points (it is a collective when distributed): between epochs; the
    training step asks within its own all-reduce."""
    counts = stopping.requested()
    if run.info.enabled:
        flags = torch.tensor(counts, device=run.device)
        torch.distributed.all_reduce(flags)
        counts = flags.tolist()
    stop(run, step_in_epoch, stopping.chosen(counts))


def stop(run: Run, step_in_epoch: int, signum: int) -> None:
    """When `signum` (the same on every rank) is a signal, not 0: rank 0 writes the checkpoint of this point,
    every rank waits for it and raises Preempted."""
    if not signum:
        return
    save_mid_epoch(run, step_in_epoch)
    dist_utils.barrier(run.info)
    name = signal.Signals(signum).name
    code = stopping.exit_code(signum)
    written = latest_checkpoint(run.ckpt_dir) if run.info.is_main else "rank 0's checkpoint"
    message = (
        f"stopped by {name} at step {run.state.step} (epoch {run.state.epoch + 1}, "
        f"{step_in_epoch}/{run.steps_per_epoch} steps): {written} written; exit code {code}, "
        "the same command resumes from it"
    )
    run.monitor.log(message)
    raise Preempted(message, code)
