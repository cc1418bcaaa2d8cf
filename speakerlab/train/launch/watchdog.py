"""Stalled-rank watchdog for multi-process runs.

A collective waits for every rank, so one stalled process (stopped, swapped out, a frozen node) hangs
the whole job until the process-group timeout (`hardware.dist_timeout_s`, long, because rank 0's
validation or data checks legitimately keep the others waiting). The watchdog tells "slow" from
"stalled": every rank's thread bumps a counter in the process group's key-value store every few
seconds; a rank whose counter has not moved for `hardware.watchdog_s` (by this rank's clock, so node
clocks need not agree) is not running at all. Then this rank prints which one and exits with
EXIT_STALLED, and torchrun ends the job. A process that is alive but slow keeps its counter moving.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Dict

import torch.distributed as dist

EXIT_STALLED = 4
_KEY = "speakerlab/heartbeat/{}"


class Watchdog:
    """`Watchdog(rank, world_size, timeout_s, log, store=None)`; `start()` then `stop()`.

    It owns its daemon thread rather than being one: a `threading.Thread` subclass that sets an
    attribute named like a Thread member (`_stop`, `_started`, ...) breaks CPython's bookkeeping in
    every process forked while it runs (data-loader workers): `threading._after_fork` calls
    `thread._stop()` on each live thread there."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout_s: float,
        log: Callable[[str], None] = print,
        store=None,
        interval_s: float = 0.0,
    ):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.log = log
        self.store = store if store is not None else dist.distributed_c10d._get_default_store()
        self.interval_s = interval_s or max(0.5, min(5.0, timeout_s / 10))
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="speakerlab-watchdog", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread and wait for it (at most `timeout_s`, a store call's length). Left running, it can be
        inside a store call when the interpreter exits: CPython then ends the daemon thread inside torch's C++
        frames, which aborts the process (`terminate called without an active exception`, exit -6) after a
        run that succeeded, and torchrun reports the whole job failed."""
        self.stopping.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    def _run(self) -> None:
        beats = 0
        last_value: Dict[int, bytes] = {}
        last_change: Dict[int, float] = {}
        others = [r for r in range(self.world_size) if r != self.rank]
        while not self.stopping.wait(self.interval_s):
            beats += 1
            now = time.monotonic()
            try:
                self.store.set(_KEY.format(self.rank), str(beats))
                for r in others:
                    key = _KEY.format(r)
                    value = self.store.get(key) if self.store.check([key]) else b""
                    if last_value.get(r) != value:
                        last_value[r], last_change[r] = value, now
            except Exception:  # the store went away: the job is ending anyway
                return
            stalled = [r for r in others if now - last_change[r] > self.timeout_s]
            if stalled and not self.stopping.is_set():
                message = (
                    f"rank {self.rank}: rank(s) {', '.join(map(str, stalled))} have not run for more than "
                    f"{self.timeout_s:g} s (hardware.watchdog_s): the process is stopped or its machine "
                    "is frozen; ending the job. Re-run the same command to resume from the last checkpoint."
                )
                self.log(message)
                print(message, file=sys.stderr, flush=True)
                os._exit(EXIT_STALLED)
