"""Stop signals recorded instead of dying of them, for the commands that train: a scheduler's SIGTERM (sent before
a kill) or SIGUSR1 (Slurm's `--signal=USR1@120` ahead of a time limit), and the user's Ctrl-C (SIGINT). The
command reads `requested()` at the points where it can stop (after a step), writes its checkpoint and exits with
`exit_code(signal)`: EXIT_PREEMPTED (75, on which egs/tools requeues a Slurm job) or EXIT_INTERRUPTED (130, the
shell's code for Ctrl-C, which nothing requeues: a user who stops a run means it). The same command resumes.

The handler only records, so nothing in progress is cut short (a step, a checkpoint being written), and a second
SIGTERM or SIGUSR1 changes nothing. A second Ctrl-C is not recorded: it raises KeyboardInterrupt, as Ctrl-C always
does, for the user who will not wait (that loses the steps since the last checkpoint, as any crash does).
speakerlab-train (speakerlab.train.launch.preemption: every rank stops after the same step) and
speakerlab-segmentation-train use it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Dict, List, Sequence

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# sysexits.h's EX_TEMPFAIL, "a temporary failure, try again later": stopped by a scheduler's signal, checkpoint written.
EXIT_PREEMPTED = 75
EXIT_INTERRUPTED = 130  # 128 + SIGINT: stopped by Ctrl-C, checkpoint written. Never requeued.

_received: List[int] = []  # signal numbers, in the order they came
_owner: List[int] = []  # the pid that installed the handlers (a data-loader worker inherits them, and stays quiet)
_said: List[str] = []  # the line a first Ctrl-C prints


def _record(signum, frame) -> None:
    if signum == signal.SIGINT:
        if signal.SIGINT in _received:
            raise KeyboardInterrupt
        if _owner == [os.getpid()] and os.environ.get("RANK", "0") == "0":
            say(
                f"SIGINT (Ctrl-C): {_said[0]}; Ctrl-C again stops at once and loses the steps since the last checkpoint"
            )
    _received.append(signum)


def say(line: str) -> None:
    """`line` on stderr, unless its reader is gone: Ctrl-C in a terminal also ends a `... | tee log` the command's
    output goes through, and a stopping command must reach its checkpoint, not die of a write."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def install(on_interrupt: str) -> Dict[int, object]:
    """Record SIGTERM, SIGUSR1 and a first SIGINT instead of dying of them; a first SIGINT prints `on_interrupt`
    (what the command does now). Returns the handlers they had (for `restore`). Call from the main thread once the
    work is set up (a signal before ends the process at once: nothing is lost) and before a data loader forks its
    workers: they inherit the handler, so a signal sent to a whole process group (Ctrl-C in a terminal) does not
    kill a worker under its loader. A signal the process was started ignoring stays ignored: a shell script's
    background job (`cmd &`) is started with SIGINT ignored so that Ctrl-C in the terminal leaves it running."""
    _received.clear()
    _owner[:] = [os.getpid()]
    _said[:] = [on_interrupt]
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    return {sig: signal.signal(sig, _record) for sig in SIGNALS if before[sig] != signal.SIG_IGN}


def restore(handlers: Dict[int, object]) -> None:
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def requested() -> List[float]:
    """Per signal of SIGNALS, 1.0 when this process got it (a distributed run sums them over its ranks)."""
    return [float(sig in _received) for sig in SIGNALS]


def chosen(counts: Sequence[float]) -> int:
    """The signal to stop by, from `requested()` (or its sum over ranks; 0: none): the largest number, so that a
    scheduler's SIGTERM or SIGUSR1 wins over Ctrl-C's SIGINT and a pre-empted job is still requeued."""
    return max((int(sig) for sig, n in zip(SIGNALS, counts) if n > 0), default=0)


def exit_code(signum: int) -> int:
    """The exit code of a command stopped by `signum` after its checkpoint."""
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED
