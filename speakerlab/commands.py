"""What every speakerlab-* console script shares: its parser, so that `--help` reads the same everywhere
(descriptions keep their line breaks, every option has help, and that help ends with the option's default),
and how it ends (`run_command`: 0, or one line `error: ...` and exit code 2 for what a user can cause, never
a traceback).

    ap = CommandParser(prog="speakerlab-x", description="What the command does.")

Sub-commands (`ap.add_subparsers().add_parser(...)`) are CommandParsers too (argparse makes them of the
parent's class). tests/test_cli.py runs every script's `--help` and holds them to this.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Callable, Sequence, Tuple, Type

# The torch-free install (runtime/pyproject.toml) and the full one, as its messages name them.
RUNTIME_DISTRIBUTION = "speakerlab-recipes-runtime"
TORCH_HINT = "install the full speakerlab-recipes from its clone (pip install -e .) in an environment with torch"


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions as written; `(default: X)` after an option's help, unless it has no default (None, off,
    empty) or its help already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default = action.default
        none = default is None or default is False or (isinstance(default, (list, tuple, str)) and not default)
        if none or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """argparse.ArgumentParser with the HelpFormatter."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def run_command(work: Callable[[], object], errors: Tuple[Type[BaseException], ...]) -> int:
    """`work()` -> 0; one of `errors` (the bad-input errors of the command's layer) -> its message as
    `error: ...` on stderr, 2."""
    try:
        work()
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def require_torch(what: str, instead: str = ""):
    """The torch module; where it is not installed (the torch-free install), an ImportError saying that `what`
    needs it, and what to do `instead` or how to get it, in one line (run_command prints it as `error: ...`)."""
    try:
        import torch
    except ImportError:
        do = f"{instead}, or {TORCH_HINT}" if instead else TORCH_HINT
        raise ImportError(f"{what} needs torch, which this environment lacks: {do}") from None
    return torch


def require_packages(what: str, names: Sequence[str], install: str) -> None:
    """Nothing where the packages `names` are installed; else an ImportError in one line naming those missing, what
    needs them and how to `install` them (run_command prints it as `error: ...`). Called before the work, not where
    the import finally happens (after a training, an export's last step)."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{what} needs {', '.join(missing)}, which this environment lacks: {install}")


def needs_torch() -> None:
    """The console script, in the torch-free install, of every command that trains or loads a PyTorch model:
    one line naming the command (whatever its arguments, --help too), exit 2."""
    command = os.path.basename(sys.argv[0])
    print(
        f"error: {command} needs torch; this is {RUNTIME_DISTRIBUTION}, the torch-free install (speakerlab-embed "
        f"--onnx, speakerlab-diarize --onnx --vad energy, speakerlab-der); {TORCH_HINT}",
        file=sys.stderr,
    )
    sys.exit(2)
