"""Unpacking corpus archives: .zip / .tar / .tar.gz into a folder, safely.

A member that would land outside the folder (absolute path, `..`, a link pointing out, a device
file) is refused before anything is written for it; a marker file makes re-runs skip the work.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from speakerlab.datasets.download import Archive, DownloadError, UnsafeArchiveError, log
from speakerlab.outputs import output_file, write_text


def _inside(root: Path, rel: str) -> bool:
    target = os.path.realpath(os.path.join(root, rel))
    return target == str(root) or target.startswith(str(root) + os.sep)


def _check_name(archive: Path, root: Path, name: str) -> None:
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or (len(name) > 1 and name[1] == ":") or not _inside(root, name):
        raise UnsafeArchiveError(f"{archive}: refusing member '{name}': it would be written outside {root}")


def _check_tar_member(archive: Path, root: Path, m: tarfile.TarInfo) -> None:
    _check_name(archive, root, m.name)
    if m.isdev() or m.isfifo():
        raise UnsafeArchiveError(f"{archive}: refusing member '{m.name}': device or fifo")
    target = os.path.join(os.path.dirname(m.name), m.linkname)
    if m.issym() and (os.path.isabs(m.linkname) or not _inside(root, target)):
        raise UnsafeArchiveError(f"{archive}: refusing symlink '{m.name}' -> '{m.linkname}' pointing outside {root}")
    if m.islnk():
        _check_name(archive, root, m.linkname)


def extract(archive, dest_dir) -> Path:
    """Unpack a .zip / .tar / .tar.gz into `dest_dir` (created); returns `dest_dir`.

    A `.<archive name>.extracted` marker in `dest_dir` makes a re-run skip it. Tar archives are
    streamed (one decompression pass, which matters for 30+ GB files), each member checked before
    it is written; zip members are all checked first.
    """
    archive, dest = Path(archive), Path(dest_dir)
    marker = dest / f".{archive.name}.extracted"
    if marker.exists():
        log(f"{archive.name}: already extracted into {dest}")
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    log(f"extracting {archive} -> {dest}")
    try:
        _unpack(archive, root)
    except getattr(tarfile, "FilterError", ()) as e:  # the "data" filter's refusals: unsafe, not damaged
        raise UnsafeArchiveError(f"{archive}: refusing a member: {e}") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as e:  # no marker: a re-run unpacks again
        raise DownloadError(
            f"{archive}: truncated or corrupt archive ({e}); delete it and download it again (its md5, where one is "
            f"published, finds a damaged copy at the download step)"
        ) from None
    write_text(marker, f"{archive}\n")
    return dest


def _unpack(archive: Path, root: Path) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                _check_name(archive, root, info.filename)
            zf.extractall(root)
    elif tarfile.is_tarfile(archive):
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        with tarfile.open(archive, "r|*") as tf:
            for m in tf:
                _check_tar_member(archive, root, m)
                tf.extract(m, root, **extra)
    else:  # a zip's directory is at its end: a truncated zip is no zip at all to is_zipfile
        raise DownloadError(f"{archive}: neither a zip nor a tar archive (or one cut short)")


def install(archive: Archive, path, raw_dir) -> Path:
    """Extract step for one Archive: unpack it, or copy a plain file, into `raw_dir/archive.dest`."""
    dest = Path(raw_dir) / archive.dest
    if archive.is_archive:
        return extract(path, dest)
    dest.mkdir(parents=True, exist_ok=True)
    with open(path, "rb") as src, output_file(dest / archive.name, "wb") as f:
        shutil.copyfileobj(src, f)
    return dest
