"""How a command ends: its work done -> exit code 0; a known bad-input error -> one line `error: ...` on
stderr and exit code 2, never a traceback (what a user can cause is reported, not raised)."""

from __future__ import annotations

import sys
from typing import Callable, Tuple, Type

from speakerlab.dataio.lists import ListError


def run_command(work: Callable[[], object], errors: Tuple[Type[BaseException], ...] = (ListError,)) -> int:
    """`work()` -> 0; one of `errors` -> its message as `error: ...` on stderr, 2."""
    try:
        work()
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
