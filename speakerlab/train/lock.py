"""One run per exp dir: `<exp>/.lock` holds the host and pid of the run that uses it.

The lock is a file created exclusively (O_EXCL), so two starts cannot both take it, and it works on
any filesystem. A lock whose process is gone (same host, pid not running) is stale: it is reported
and taken over. A lock from another host cannot be checked and is an error naming it.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Callable


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


class ExpDirLock:
    def __init__(self, exp_dir: Path, log: Callable[[str], None] = print):
        self.path = Path(exp_dir) / ".lock"
        self.log = log
        self.held = False

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()} {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
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
        where = "this machine" if host == socket.gethostname() else f"host {host}"
        raise ExpDirLocked(
            f"{self.path.parent} is in use by process {pid} on {where} (since {since}); "
            f"wait for it to finish, or use another --exp-dir. If that run is gone, delete {self.path}"
        )

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
