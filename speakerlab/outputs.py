"""The one writer of speakerlab's output files: whole or not at all, and never over something that is not a file.

    with output_file("exp/scores/test.txt") as f:        # text; mode="wb" for bytes (torch.save, np.savez, ...)
        f.write(...)
    with output_path("model.onnx") as tmp:               # for writers that need a path (onnx external data, ...)
        onnx.save(model, tmp)

A regular target (or one that does not exist yet) is written to a hidden temporary file beside it, flushed to disk
and renamed over it when the block ends without an error: a reader never sees half a file, and a crash or a full
disk leaves what was there before. A symbolic link is followed, so the link stays and the file it points at is
replaced. A target that exists and is not a regular file (a character device such as /dev/null, a FIFO, a terminal,
/dev/stdout on a pipe) is never renamed over: running as root, a rename would replace the machine's /dev/null with a
plain file. `output_file` writes such a target straight through (bytes as a stream that cannot seek, so that zip
writers such as np.savez and torch.save write on instead of seeking back); `output_path` refuses it in one line,
because the writers that take a path may add suffixes or seek. `-` means standard output where a command's output
is text (`output_file(path, allow_stdout=True)`). A folder as the target is an OutputError naming it; a command whose
output is a folder of files checks it with `check_folder_output` before its work (a device, a pipe or a file there is
refused in one line: `folder_problem`) and writes each file in it through `output_file`. tests/test_outputs_devices.py
runs every command that writes a file with its output on a character device. An output that is one of the command's
own input files is refused before the work (`check_not_input`): writing it would replace what the command reads.
A command that writes one file at the end of long work checks it first (`check_file_output`: a folder there, or a
file on its way), so that a refused output costs nothing.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
from pathlib import Path
from typing import IO, Iterable, Iterator, Optional, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]


class OutputError(ValueError):
    """An output path that cannot be written as asked (a folder, a device for a path-taking writer, ...)."""


def _kind(path: Path) -> str:
    """'missing', 'file', 'dir' or 'special' (character/block device, FIFO, socket), links followed."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # the latter: a parent is a file
        return "missing"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "special"


def _resolved(path: PathLike) -> Tuple[Path, str]:
    """(where to write, `_kind`): the kind of `path` itself, links followed by stat (/dev/stdout on a pipe links to
    'pipe:[N]', which no path names, yet stats as a FIFO), and for anything but a device its real path, where a file
    is renamed into place."""
    kind = _kind(Path(path))
    return (Path(path) if kind == "special" else Path(os.path.realpath(path))), kind


def is_special(path: PathLike) -> bool:
    """Whether `path` exists and is neither a regular file nor a folder (a device, a FIFO, ...)."""
    return _kind(Path(path)) == "special"


def _temporary(real: Path) -> Path:
    return real.with_name(f".{real.name}.tmp{os.getpid()}")


class _Unseekable:
    """A device or a pipe opened to write bytes, as a stream that cannot seek and tells what it was given. /dev/null
    accepts a seek and then tells 0, which misleads writers that seek back to finish a header (the zip archives of
    np.savez and torch.save) into negative sizes; a writer that sees a stream it cannot seek writes straight on."""

    def __init__(self, f: IO[bytes]):
        self._f, self._written = f, 0

    def write(self, data) -> int:
        n = self._f.write(data)  # a buffered writer takes it all and says how many bytes that was
        self._written += n
        return n

    def tell(self) -> int:
        return self._written

    def seekable(self) -> bool:
        return False

    def seek(self, *args):
        raise io.UnsupportedOperation("seek: a device or a pipe")

    def __getattr__(self, name):
        return getattr(self._f, name)


def _commit(tmp: Path, real: Path) -> None:
    os.replace(tmp, real)


def same_bytes(a: PathLike, b: PathLike) -> bool:
    """Whether the files `a` and `b` hold the same bytes (`b` may be missing); files of other sizes are not read."""
    a, b = Path(a), Path(b)
    if not b.is_file() or a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for block in iter(lambda: fa.read(1 << 20), b""):
            if block != fb.read(len(block)):
                return False
    return True


@contextlib.contextmanager
def output_file(
    path: PathLike,
    mode: str = "w",
    *,
    allow_stdout: bool = False,
    encoding: str = "utf-8",
    errors: str = "strict",
    newline: Optional[str] = None,
    fsync: bool = True,
    keep_same: bool = False,
) -> Iterator[IO]:
    """Open `path` to write it whole: yields a file object (`mode` "w" text or "wb" bytes).

    `-` with `allow_stdout` (text modes only) is sys.stdout, flushed and left open. A device or FIFO is opened and
    written straight through. Anything else goes through a temporary file renamed over the target at the end (with
    an fsync first unless `fsync=False`, for large folders of small files that are checked later anyway). With
    `keep_same`, a target whose bytes the new file repeats is left as it is, its modification time too: what is
    judged fresh by it (shards, feature stores of a list) is not rebuilt by a rerun that changed nothing. `errors`
    and `newline` are open()'s, for text modes."""
    if mode not in ("w", "wb"):
        raise ValueError(f"output_file mode must be 'w' or 'wb', got {mode!r}")
    if str(path) == "-":
        if not allow_stdout or mode != "w":
            raise OutputError("'-' (standard output) is not an output this command can write: give a file path")
        yield sys.stdout
        sys.stdout.flush()
        return
    real, kind = _resolved(path)
    if kind == "dir":
        raise OutputError(f"{path} is a folder, not a file: give the path of the file to write")
    text = {"encoding": encoding, "errors": errors, "newline": newline} if mode == "w" else {}
    if kind == "special":
        with open(real, mode, **text) as f:
            yield f if mode == "w" else _Unseekable(f)
        return
    _check_parent(path, real)
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(real)
    try:
        with open(tmp, mode, **text) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if not (keep_same and same_bytes(tmp, real)):
            _commit(tmp, real)
    finally:
        tmp.unlink(missing_ok=True)


def check_path_output(path: PathLike) -> Path:
    """`path` resolved, for a writer that takes a path (`output_path`): a folder, a device or a pipe there is an
    OutputError naming it. Commands call it before their work, so that a refused output costs nothing."""
    real, kind = _resolved(path)
    if kind == "dir":
        raise OutputError(f"{path} is a folder, not a file: give the path of the file to write")
    if kind == "special":
        raise OutputError(f"{path} is not a regular file (a device or a pipe): this output is written only to a file")
    _check_parent(path, real)
    return real


def _check_parent(path: PathLike, real: Path) -> None:
    """An OutputError when the folder of `real` cannot be made or written (a file on the way, say): before the
    work, not as an OS error when the output is written."""
    problem = folder_problem(real.parent)
    if problem:
        raise OutputError(f"{path} cannot be written: {problem}")


def check_file_output(path: PathLike, *, allow_stdout: bool = False) -> None:
    """What `output_file` would refuse about `path` at the end of a command's work, as an OutputError before it: a
    folder there, or a parent that cannot be a folder (a file on the way). A device or a pipe is fine (written
    through); `-` where `allow_stdout`."""
    if str(path) == "-":
        if allow_stdout:
            return
        raise OutputError("'-' (standard output) is not an output this command can write: give a file path")
    kind = _kind(Path(path))
    if kind == "dir":
        raise OutputError(f"{path} is a folder, not a file: give the path of the file to write")
    if kind == "missing":
        _check_parent(path, Path(path))


def check_not_input(outputs: Iterable[PathLike], inputs: Iterable[Optional[PathLike]]) -> None:
    """An OutputError naming both when one of `outputs` is one of the command's existing input files (the same file,
    links followed; a device such as /dev/null may be both): writing it would replace what the command reads.
    Commands call it before their work."""
    files = [Path(i) for i in inputs if i is not None and _kind(Path(i)) == "file"]
    for out in outputs:
        if _kind(Path(out)) != "file":
            continue
        same = next((i for i in files if os.path.samefile(out, i)), None)
        if same is not None:
            alias = "" if str(same) == str(out) else f" (as {same})"
            raise OutputError(f"{out}: an input of this command{alias}; writing an output there would replace it")


def folder_problem(path: PathLike, writable: bool = True) -> Optional[str]:
    """Why `path` cannot be (or become) a folder this process writes in (`writable`) or reads, or None: it is a
    device, a pipe or a file, so is a parent, or the nearest existing parent is not writable. Nothing is created."""
    path = Path(path)
    kind = _kind(path)
    if kind in ("special", "file"):
        return f"{path} is {'a device or a pipe' if kind == 'special' else 'a file'}, not a folder"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder (so {path} cannot be made)"
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable (so {path} cannot be written)"
    return None


def check_folder_output(path: PathLike) -> Path:
    """`path`, for a command whose output is a folder of files: an OutputError saying why it cannot be one
    (`folder_problem`: a device, a pipe or a file there, ...); a folder or nothing is fine (the caller creates it).
    Commands call it before their work."""
    problem = folder_problem(path)
    if problem:
        raise OutputError(f"{problem}: this command writes a folder of files there")
    return Path(path)


@contextlib.contextmanager
def output_path(path: PathLike, suffix: str = "") -> Iterator[Path]:
    """A temporary path beside `path` (ending in `suffix`, for writers that choose the format by name) for a writer
    that takes a path; renamed over `path` when the block ends without an error, removed otherwise. A target that
    exists and is not a regular file is refused (`check_path_output`), before anything is written."""
    real = check_path_output(path)
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(real).with_name(_temporary(real).name + suffix)
    try:
        yield tmp
        _commit(tmp, real)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: PathLike, text: str, *, allow_stdout: bool = False) -> None:
    """`text` as the whole content of `path` (see output_file)."""
    with output_file(path, "w", allow_stdout=allow_stdout) as f:
        f.write(text)


def write_lines(path: PathLike, lines, *, allow_stdout: bool = False) -> None:
    """Each of `lines` (without newlines) as one line of `path` (see output_file)."""
    with output_file(path, "w", allow_stdout=allow_stdout) as f:
        for line in lines:
            f.write(f"{line}\n")
