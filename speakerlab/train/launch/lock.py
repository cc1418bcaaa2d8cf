"""One run per exp dir: `<exp>/.lock` holds the host and pid of the run that uses it.

The lock is a file created exclusively (O_EXCL), so two starts cannot both take it, and it works on
any filesystem. A lock whose process is gone (same host, pid not running) is stale: it is reported
and taken over. A lock from another host cannot be checked and is an error naming it, unless it was
taken by an earlier start of the same job (a torchrun restart of its processes, a requeued Slurm
job: `job_start`), whose rank 0 may have run on a node that is gone.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Tuple


class ExpDirLocked(RuntimeError):
    """Another live run holds the exp dir; the message names it."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def job_start(env: Mapping[str, str]) -> Optional[Tuple[str, int, int]]:
    """(job id, Slurm requeues, torchrun restarts) of this process, or None outside a job: the id is
    torchrun's rendezvous id (the Slurm job id under egs/tools' Slurm launch) or SLURM_JOB_ID."""
    job = env.get("TORCHELASTIC_RUN_ID", "none")
    job = job if job != "none" else env.get("SLURM_JOB_ID", "")
    if not job:
        return None
    return job, int(env.get("SLURM_RESTART_COUNT") or 0), int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)


class ExpDirLock:
    def __init__(self, exp_dir: Path, log: Callable[[str], None] = print):
        self.path = Path(exp_dir) / ".lock"
        self.log = log
        self.held = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        start = job_start(os.environ)
        job = f" job={start[0]}:{start[1]}:{start[2]}" if start else ""
        me = f"{socket.gethostname()} {os.getpid()} {time.strftime('%Y-%m-%d %H:%M:%S')}{job}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._clear_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me)
            self.held = True
            return
        raise ExpDirLocked(f"{self.path.parent} is in use: {self.path} could not be taken")

    def _clear_if_stale(self) -> None:
        text = self.path.read_text(errors="replace").split()
        host, pid = (text[0], int(text[1])) if len(text) >= 2 and text[1].isdigit() else ("?", -1)
        since = " ".join(text[2:4])
        if host == socket.gethostname() and pid > 0 and not _alive(pid):
            self.log(f"removing the stale lock {self.path} of process {pid} (started {since}), which is gone")
            self.path.unlink(missing_ok=True)
            return
        theirs = next((t[4:] for t in text[4:] if t.startswith("job=")), "").rsplit(":", 2)
        ours = job_start(os.environ)
        earlier = len(theirs) == 3 and theirs[1].isdigit() and theirs[2].isdigit()
        if earlier and ours and theirs[0] == ours[0] and (int(theirs[1]), int(theirs[2])) < ours[1:]:
            self.log(f"removing the lock {self.path} of process {pid} on {host}, an earlier start of job {ours[0]}")
            self.path.unlink(missing_ok=True)
            return
        where = "this machine" if host == socket.gethostname() else f"host {host}"
        raise ExpDirLocked(
            f"{self.path.parent} is in use by process {pid} on {where} (since {since}); "
            f"wait for it to finish, or use another --exp-dir. If that run is gone, delete {self.path}"
        )

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
