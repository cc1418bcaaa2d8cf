"""Fetching and unpacking corpus archives: one copy of each mechanism, shared by every corpus.

* `download`     resumable HTTP(S) (or file://) transfer into `<dest>.part`: a Range request picks
                 up where an earlier attempt or run stopped, failures are retried with exponential
                 backoff, and the md5 is checked before the file is renamed into place;
* `verify_md5`   chunked md5 with a `<file>.md5ok` marker, so a verified file is never hashed again;
* `join_parts`   concatenation of split archives (`vox2_dev_aac_parta*`, `train.tar.gz-part-*`);
* `fetch_archives` / `locate`: the download step of the corpus CLIs. A file's URL is
                 `<base URL>/<name>` unless a mirror (`<mirror>/<name>`) or a per-file URL is given;
                 with an archive dir nothing is downloaded: whole archives or their parts are taken
                 from there (parts are joined into the download dir).
Unpacking is in `archives.py`.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.error import HTTPError, URLError
from urllib.request import HTTPBasicAuthHandler, HTTPPasswordMgrWithDefaultRealm, Request, build_opener

from speakerlab.outputs import check_path_output, write_text

CHUNK = 1 << 22  # 4 MiB reads for hashing, copying and downloading
PROGRESS_EVERY_S = 30.0


class DownloadError(RuntimeError):
    """A file could not be fetched, found, joined or extracted; the message names it."""


class ChecksumError(DownloadError):
    """A file's md5 differs from the published one."""


class UnsafeArchiveError(DownloadError):
    """An archive member would be written outside the extraction folder."""


class _Truncated(OSError):
    """The server closed the connection before Content-Length bytes arrived (retried)."""


@dataclass(frozen=True)
class Part:
    """One file of a split archive, with its published md5 when there is one."""

    name: str
    md5: Optional[str] = None


@dataclass(frozen=True)
class Archive:
    """A published file: an archive to unpack, or a plain file (trial list) to copy.

    `name` is the whole file as the extract step uses it; `parts`, when given, are downloaded and
    joined in order into `name`. `md5` is that of the whole file (None: none is published). `dest`
    is the folder under the raw dir that the extract step unpacks (or copies) it into.
    """

    name: str
    md5: Optional[str]
    base_url: str
    parts: Tuple[Part, ...] = ()
    dest: str = "."

    def files(self) -> Tuple[Part, ...]:
        """What is downloaded: the parts, or the whole file."""
        return self.parts or (Part(self.name, self.md5),)

    @property
    def is_archive(self) -> bool:
        return self.name.endswith((".zip", ".tar", ".tar.gz", ".tgz"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] datasets: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- md5


def md5sum(path) -> str:
    """Hex md5 of a file, read in CHUNK-sized pieces (archives are far larger than memory)."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _marker(path: Path, marker_dir=None) -> Path:
    return Path(marker_dir or path.parent) / (path.name + ".md5ok")


def _stamp(path: Path, md5: str) -> str:
    st = path.stat()
    return f"{md5.lower()} {st.st_size} {st.st_mtime_ns}\n"


def _write_marker(path: Path, md5: str, marker_dir=None) -> None:
    try:
        write_text(_marker(path, marker_dir), _stamp(path, md5))
    except OSError:  # unwritable: the file is simply hashed again next time
        pass


def is_verified(path, md5: Optional[str], marker_dir=None) -> bool:
    """True when `path` has a marker for `md5` (beside it, or in `marker_dir`) and has not changed
    (size, mtime) since it was written."""
    path = Path(path)
    marker = _marker(path, marker_dir)
    if md5 is None or not path.is_file() or not marker.is_file():
        return False
    return marker.read_text() == _stamp(path, md5)


def verify_md5(path, md5: Optional[str], marker_dir=None) -> None:
    """Raise ChecksumError naming `path` unless its md5 is `md5` (None: nothing to check).

    The `.md5ok` marker goes beside the file, or into `marker_dir` (used for files of a user's
    archive dir, which is never written to)."""
    path = Path(path)
    if md5 is None or is_verified(path, md5, marker_dir):
        return
    log(f"checking md5 of {path}")
    got = md5sum(path)
    if got != md5.lower():
        raise ChecksumError(
            f"{path}: md5 {got} does not match the published {md5}; the file is corrupt or "
            f"not the published release (delete it and download again, or pass --skip-md5)"
        )
    _write_marker(path, md5, marker_dir)


# ---------------------------------------------------------------- download


def make_opener(user: Optional[str] = None, password: Optional[str] = None):
    """A urllib opener; with `user`, it answers HTTP basic-auth challenges (e.g. the VoxCeleb host)."""
    if not user:
        return build_opener()
    mgr = HTTPPasswordMgrWithDefaultRealm()
    mgr.add_password(None, "https://", user, password or "")
    mgr.add_password(None, "http://", user, password or "")
    return build_opener(HTTPBasicAuthHandler(mgr))


def _transfer(opener, url: str, part: Path, timeout: float) -> None:
    """One attempt: append the rest of `url` to `part` (or rewrite it if the server ignores Range)."""
    have = part.stat().st_size if part.exists() else 0
    req = Request(url, headers={"User-Agent": "speakerlab-datasets/1"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = opener.open(req, timeout=timeout)
    except HTTPError as e:
        if e.code == 416 and have:  # "range not satisfiable": nothing is left to send
            return
        raise
    with resp:
        status = getattr(resp, "status", None)
        content_range = resp.headers.get("Content-Range", "") if resp.headers else ""
        # Append only to a 206 that starts where the part ends; anything else is the whole file.
        append = have > 0 and status == 206 and content_range.startswith(f"bytes {have}-")
        length = resp.headers.get("Content-Length") if resp.headers else None
        expected = int(length) if length and length.isdigit() else None
        written, last = 0, time.monotonic()
        with open(part, "ab" if append else "wb") as f:
            for block in iter(lambda: resp.read(CHUNK), b""):
                f.write(block)
                written += len(block)
                if time.monotonic() - last > PROGRESS_EVERY_S:
                    last = time.monotonic()
                    total = f" of {(expected + (have if append else 0)) / 2**20:.0f}" if expected else ""
                    log(f"{part.name[:-5]}: {((have if append else 0) + written) / 2**20:.0f}{total} MiB")
    if expected is not None and written < expected:
        raise _Truncated(f"connection closed after {written} of {expected} bytes")


def _retryable(e: BaseException) -> bool:
    if isinstance(e, HTTPError):
        return e.code >= 500 or e.code in (408, 429)
    if isinstance(e, URLError) and isinstance(e.reason, FileNotFoundError):
        return False
    if isinstance(e, PermissionError) or getattr(e, "errno", None) == errno.ENOSPC:
        return False  # local problems: waiting will not fix them
    return isinstance(e, (OSError, http.client.HTTPException))


def download(
    url: str,
    dest,
    md5: Optional[str] = None,
    *,
    retries: int = 5,
    backoff_s: float = 2.0,
    timeout_s: float = 60.0,
    opener=None,
    sleep: Callable[[float], None] = time.sleep,
) -> Path:
    """Fetch `url` into `dest` and return `dest`.

    An existing `dest` is only checked (md5). Data accumulates in `<dest>.part`, so a broken
    transfer resumes with a Range request, in this run or a later one. Failures are retried up to
    `retries` times in a row, waiting backoff_s * 2**(n-1) before the n-th retry; an attempt that
    added data resets the count, so a long download over a flaky link keeps going while a dead
    one gives up. With `md5`, a mismatching download is deleted and ChecksumError names the file:
    `dest` only ever holds a verified file.
    """
    dest = Path(dest)
    check_path_output(dest)
    if dest.exists():
        verify_md5(dest, md5)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    opener = opener or build_opener()
    failures = 0
    while True:
        before = part.stat().st_size if part.exists() else 0
        log(f"{dest.name}: " + (f"resuming at {before / 2**20:.1f} MiB from {url}" if before else f"downloading {url}"))
        try:
            _transfer(opener, url, part, timeout_s)
            break
        except Exception as e:  # noqa: BLE001 - classified just below
            if not _retryable(e):
                raise DownloadError(f"{dest.name}: cannot download {url}: {e}") from e
            failures = 1 if part.exists() and part.stat().st_size > before else failures + 1
            if failures > retries:
                raise DownloadError(
                    f"{dest.name}: {url} failed {failures} times in a row ({e}); {part} is kept, re-run to resume"
                ) from e
            delay = backoff_s * 2 ** (failures - 1)
            log(f"{dest.name}: {e}; retrying in {delay:.0f} s")
            sleep(delay)
    # A corrupt download is deleted: resuming corrupt data can never succeed.
    got = md5sum(part) if md5 is not None else None
    deleted = "the download was deleted (re-run, or pass --skip-md5 if the publisher changed the file)"
    return _settle(part, dest, md5, got, f"the download from {url}", deleted)


def join_parts(parts: Sequence[Path], dest, md5: Optional[str] = None) -> Path:
    """Concatenate `parts` in order into `dest` (hashing as it copies); returns `dest`."""
    dest = Path(dest)
    check_path_output(dest)
    if dest.exists():
        verify_md5(dest, md5)
        return dest
    log(f"joining {len(parts)} parts into {dest}")
    tmp = dest.with_name(dest.name + ".joining")
    h = hashlib.md5()
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(CHUNK), b""):
                    h.update(block)
                    out.write(block)
    names = ", ".join(str(p) for p in parts)
    return _settle(tmp, dest, md5, h.hexdigest(), f"the joined parts ({names})", "a part is corrupt or missing")


def _settle(tmp: Path, dest: Path, md5: Optional[str], got: Optional[str], source: str, consequence: str) -> Path:
    """A finished `tmp` becomes `dest` (with its md5 marker) when its md5 `got` is the published `md5`, or
    none is published; else `tmp` is deleted and ChecksumError names `dest`, `source` and `consequence`."""
    if md5 is not None and got != md5.lower():
        tmp.unlink()
        raise ChecksumError(f"{dest}: md5 {got} of {source} does not match the published {md5}; {consequence}")
    os.replace(tmp, dest)
    if md5 is not None:
        _write_marker(dest, md5)
    return dest


def url_for(name: str, base_url: str, mirror: Optional[str] = None, urls: Optional[Dict[str, str]] = None) -> str:
    """URL of file `name`: an explicit `urls[name]`, else `<mirror>/<name>`, else `<base_url>/<name>`."""
    if urls and name in urls:
        return urls[name]
    return f"{(mirror or base_url).rstrip('/')}/{name}"


def fetch_archives(
    archives: Sequence[Archive],
    download_dir,
    *,
    archive_dir=None,
    mirror: Optional[str] = None,
    urls: Optional[Dict[str, str]] = None,
    check_md5: bool = True,
    keep_parts: bool = False,
    jobs: int = 4,
    opener=None,
    retries: int = 5,
    sleep: Callable[[float], None] = time.sleep,
) -> List[Path]:
    """Make every archive available as one verified file; returns their paths.

    Without `archive_dir`: download (in `jobs` threads) into `download_dir`, join split archives
    there and, unless `keep_parts`, delete the joined parts. With `archive_dir`: nothing is
    downloaded; a whole archive found there is verified in place, parts found there are joined
    into `download_dir`, and anything missing is an error naming what was looked for.
    """
    download_dir = Path(download_dir)
    download_dir.mkdir(parents=True, exist_ok=True)
    md5_of = (lambda m: m) if check_md5 else (lambda m: None)
    done: Dict[str, Path] = {}
    todo: List[Tuple[Archive, Part]] = []
    for a in archives:
        joined = download_dir / a.name
        check_path_output(joined)  # a device or a pipe there is never read as the archive nor renamed over
        if archive_dir is not None and (Path(archive_dir) / a.name).exists():
            done[a.name] = Path(archive_dir) / a.name
        elif joined.exists():
            done[a.name] = joined
        elif archive_dir is not None:
            if not a.parts or not all((Path(archive_dir) / p.name).exists() for p in a.parts):
                wanted = a.name + (f" or all of {', '.join(p.name for p in a.parts)}" if a.parts else "")
                raise DownloadError(f"{a.name}: not found in --archive-dir {archive_dir} (looked for {wanted})")
        else:
            todo.extend((a, p) for p in a.files())

    def fetch(item):
        a, p = item
        return download(
            url_for(p.name, a.base_url, mirror, urls),
            download_dir / p.name,
            md5_of(p.md5),
            retries=retries,
            opener=opener,
            sleep=sleep,
        )

    errors = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for fut in [pool.submit(fetch, item) for item in todo]:
            try:
                fut.result()
            except DownloadError as e:
                errors.append(str(e))
    if errors:
        raise DownloadError("; ".join(errors))
    out = []
    for a in archives:
        if a.name in done:
            verify_md5(done[a.name], md5_of(a.md5), download_dir)
            out.append(done[a.name])
            continue
        if not a.parts:
            out.append(download_dir / a.name)
            continue
        src = Path(archive_dir) if archive_dir is not None else download_dir
        parts = [src / p.name for p in a.parts]
        if archive_dir is not None:  # downloads were verified as they arrived; these were not
            for p, path in zip(a.parts, parts):
                verify_md5(path, md5_of(p.md5), download_dir)
        out.append(join_parts(parts, download_dir / a.name, md5_of(a.md5)))
        if archive_dir is None and not keep_parts:
            for path in parts:
                path.unlink(missing_ok=True)
                _marker(path).unlink(missing_ok=True)
    return out


def locate(archive: Archive, download_dir, archive_dir=None) -> Path:
    """The archive file for the extract step: in `archive_dir` first, then `download_dir`."""
    for d in ([archive_dir] if archive_dir is not None else []) + [download_dir]:
        if (Path(d) / archive.name).is_file():
            return Path(d) / archive.name
    where = " or ".join(str(d) for d in ([archive_dir] if archive_dir is not None else []) + [download_dir])
    raise DownloadError(f"{archive.name}: not found in {where}; run the download step first")
