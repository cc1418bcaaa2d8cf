"""Training lists of millions of utterances in a few numpy arrays: no Python object per utterance.

A data dir of 10 M utterances read into dicts and lists of str is 10 M x several Python objects: gigabytes,
minutes of parsing, and, worse, every loader worker that touches one of them writes its reference count, so the
pages the worker shares with the main process after the fork are copied one by one: each worker grows towards a
full copy over the epoch. Here a data dir is its wav.scp bytes as one uint8 array plus offset arrays, the labels
and lengths as integer arrays, and the speakers as one fixed-width byte array: reading `paths[i]` decodes one
string and writes nothing shared, so forked workers stay at what they inherited.

    lists = read_compact(root)             # one data dir: utterances sorted by id, speakers sorted, as DataDir
    lists.paths[i], lists.labels[i], lists.lengths[i], lists.utts[i], lists.speakers
    feats = read_keyed(root / "feats.scp")  # any `key value` list by key: feats["utt"], feats.rows(keys)

Reading is vectorised for the form our preparers and speakerlab-prepare write (`key value` lines, one space, no
blank or comment lines, UTF-8). Anything else (tabs, comments, duplicates, an utterance without a speaker, a
malformed count) is read again by the validating reader of speakerlab.dataio.lists, so every error is its
message with file and line, and every file it accepts is accepted here.

What a read in the fast form found is kept in `<data dir>/.compact/` (the arrays as .npy, then meta.json with the
lists' sizes and times): the next read memory-maps them, and wav.scp itself, instead of parsing, as long as no
list changed. The prepare stage reads once, so training starts map; the mapped pages are the page cache's,
shared by the loader workers and by every rank on the node.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from speakerlab.dataio.lists import DataDir, ListError, load_data_dir, read_table

NEWLINE, SPACE = 10, 32
CHUNK = 1 << 16  # rows gathered at once into fixed-width keys: (CHUNK, width) temporaries stay in cache


class _NotFast(Exception):
    """The file is not in the form the vectorised reader takes: read it with the validating reader."""


class StringView:
    """Strings `(N,)` held as byte ranges `[start, end)` of one uint8 buffer: `view[i] -> str` (with `prefix`).

    The buffer and the offset arrays are plain numpy arrays: indexing them writes nothing, so a forked loader
    worker keeps sharing their pages with the main process."""

    def __init__(self, buf: np.ndarray, start: np.ndarray, end: np.ndarray, prefix: str = ""):
        self.buf, self.start, self.end, self.prefix = buf, start, end, prefix

    def __len__(self) -> int:
        return len(self.start)

    def __getitem__(self, i: int) -> str:
        return self.prefix + self.buf[self.start[i] : self.end[i]].tobytes().decode("utf-8")

    def fixed(self) -> np.ndarray:
        """Every string (prefix included) as one fixed-width `S<width>` array (N,), for vectorised comparisons."""
        keys = _fixed_width(self.buf, self.start, self.end)
        return np.char.add(self.prefix.encode("utf-8"), keys) if self.prefix else keys


class FixedView:
    """Strings `(N,)` held as one fixed-width `S<width>` array (e.g. memory-mapped from a .npy): `view[i] -> str`
    (with `prefix`). As with StringView, reading writes nothing shared."""

    def __init__(self, array: np.ndarray, prefix: str = ""):
        self.array, self.prefix = array, prefix

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> str:
        return self.prefix + self.array[i].decode("utf-8")

    def fixed(self) -> np.ndarray:
        return np.char.add(self.prefix.encode("utf-8"), self.array) if self.prefix else self.array


def as_keys(strings) -> np.ndarray:
    """`strings` as a fixed-width `S<width>` array (N,): a view's own (vectorised), else each one encoded."""
    if isinstance(strings, (StringView, FixedView, JoinedView)):
        return strings.fixed()
    return np.array([s.encode("utf-8") for s in strings], dtype=bytes) if len(strings) else np.array([], "S1")


def _fixed_width(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    lens = end - start
    width = max(int(lens.max()) if len(lens) else 1, 1)
    out = np.zeros((len(lens), width), dtype=np.uint8)
    columns = np.arange(width)
    for a in range(0, len(lens), CHUNK):  # a (chunk, width) gather at a time: memory stays O(N)
        index = start[a : a + CHUNK, None] + columns
        beyond = columns >= lens[a : a + CHUNK, None]
        out[a : a + CHUNK] = np.where(beyond, 0, buf[np.minimum(index, len(buf) - 1)])
    return out.view(f"S{width}").ravel()


def _offsets(values: np.ndarray) -> np.ndarray:
    """The smallest unsigned dtype that holds every offset into a buffer (uint32 below 4 GiB)."""
    return values.astype(np.uint32 if (len(values) == 0 or int(values.max()) < 2**32) else np.int64)


def read_columns(path: Path, mapped: bool = False) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A `key value` file as (bytes, line start, separator, line end) arrays: key i is bytes[start:sep], its
    value bytes[sep + 1:end]; the bytes memory-mapped when `mapped`. Raises _NotFast for anything but one space
    per non-empty line in UTF-8."""
    if not path.is_file() or path.stat().st_size == 0:
        raise _NotFast()
    buf = np.memmap(path, dtype=np.uint8, mode="r") if mapped else np.fromfile(path, dtype=np.uint8)
    if len(buf) == 0 or buf[-1] != NEWLINE:
        raise _NotFast()  # empty, or a last line without newline: the validating reader decides
    step = 1 << 26  # the byte scan in slices: its temporaries stay small
    cuts = np.concatenate([np.flatnonzero(buf[a : a + step] <= SPACE) + a for a in range(0, len(buf), step)])
    kinds = buf[cuts]
    newline = kinds == NEWLINE
    if not (newline | (kinds == SPACE)).all() or (buf.max() >= 128 and not _utf8(buf)):
        raise _NotFast()  # tabs, CRs, control bytes (the validating reader splits on any whitespace), not UTF-8
    ends = cuts[newline]
    if len(cuts) != 2 * len(ends) or newline[::2].any() or not newline[1::2].all():
        raise _NotFast()  # a line without exactly one space
    sep = cuts[::2]
    starts = np.concatenate([[0], ends[:-1] + 1])
    if ((sep - starts) < 1).any() or ((ends - sep) < 2).any() or (buf[starts] == ord("#")).any():
        raise _NotFast()
    return buf, starts, sep, ends


def _utf8(buf: np.ndarray) -> bool:
    try:
        buf.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _sorted_keys(path: Path, mapped: bool = False):
    """(bytes, start, sep, end, the keys S-array sorted, the order sorting them); raises _NotFast on duplicates.
    Files written sorted (ours are) are not sorted again."""
    buf, start, sep, end = read_columns(path, mapped)
    keys = _fixed_width(buf, start, sep)
    if (keys[1:] >= keys[:-1]).all():
        order = np.arange(len(keys))
    else:
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
        raise _NotFast()
    return buf, start, sep, end, keys, order


@dataclass(kw_only=True)
class CompactLists:
    """One data dir's training lists, utterances sorted by id (as DataDir.utts), speakers sorted (DataDir.speakers).

    `buf`: wav.scp's bytes; utterance i is buf[utt_start[i]:sep[i]], its audio path buf[sep[i] + 1:path_end[i]],
    on line `row[i] + 1` of wav.scp. `labels` (N,) int32 index `speakers` (S,) (an `S<width>` array);
    `lengths` (N,) int64 samples from utt2num_samples, or None without one."""

    root: Path
    buf: np.ndarray
    utt_start: np.ndarray
    sep: np.ndarray
    path_end: np.ndarray
    row: np.ndarray
    labels: np.ndarray
    speakers: np.ndarray
    lengths: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.labels)

    def utts(self, prefix: str = "") -> StringView:
        return StringView(self.buf, self.utt_start, self.sep, prefix)

    @property
    def paths(self) -> StringView:
        return StringView(self.buf, self.sep + 1, self.path_end)

    def line(self, i: int) -> int:
        """The wav.scp line of utterance i."""
        return int(self.row[i]) + 1


def read_compact(root) -> CompactLists:
    """`root`'s wav.scp, utt2spk (and utt2num_samples when present) as CompactLists, cross-checked as
    speakerlab.dataio.lists.load_data_dir checks them (whose errors it raises). The arrays of a read in the fast
    form are kept in `root/.compact/` (when it can be written), and memory-mapped by the next read as long as
    the lists have the same sizes and times: the prepare stage reads once, every training start maps."""
    root = Path(root)
    if not root.is_dir():
        raise ListError(f"{root}: data dir does not exist")
    cached = _load_cache(root)
    if cached is not None:
        return cached
    try:
        lists = _read_fast(root)
    except _NotFast:
        return from_data_dir(load_data_dir(root))
    _save_cache(lists)
    return lists


CACHE, CACHE_FORMAT = ".compact", 1
CACHED = ("utt_start", "sep", "path_end", "row", "labels", "speakers", "lengths")
LISTS = ("wav.scp", "utt2spk", "spk2utt", "utt2num_samples")


def _stamp(root: Path) -> dict:
    """What the cache was read from: each list's size and modification time (None when absent)."""
    stats = {n: (root / n).stat() if (root / n).exists() else None for n in LISTS}
    return {"format": CACHE_FORMAT, **{n: s and [s.st_size, s.st_mtime_ns] for n, s in stats.items()}}


def _load_cache(root: Path) -> Optional[CompactLists]:
    meta = root / CACHE / "meta.json"
    try:
        if json.loads(meta.read_text()) != _stamp(root):
            return None
        arrays = {
            n: np.load(root / CACHE / f"{n}.npy", mmap_mode="r") for n in CACHED if (root / CACHE / f"{n}.npy").exists()
        }
    except (OSError, ValueError):
        return None
    buf = np.memmap(root / "wav.scp", dtype=np.uint8, mode="r")
    return CompactLists(root=root, buf=buf, **arrays)


def _save_cache(lists: CompactLists) -> None:
    """Write the arrays (wav.scp itself is mapped, not copied), meta.json last: a cache without it is not read.
    An unwritable data dir is left as it is."""
    folder, stamp = lists.root / CACHE, _stamp(lists.root)
    try:
        folder.mkdir(exist_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)
        for name in CACHED:
            value = getattr(lists, name)
            (folder / f"{name}.npy").unlink(missing_ok=True)
            if value is not None:
                tmp = folder / f"{name}.{os.getpid()}.tmp.npy"
                np.save(tmp, value)
                os.replace(tmp, folder / f"{name}.npy")
        tmp = folder / f"meta.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, folder / "meta.json")
    except OSError:
        pass


def _read_fast(root: Path) -> CompactLists:
    buf, start, sep, end, utts, order = _sorted_keys(root / "wav.scp")
    u_buf, u_start, u_sep, u_end, u_utts, u_order = _sorted_keys(root / "utt2spk")
    if len(u_utts) != len(utts) or (u_utts != utts).any():
        raise _NotFast()  # an utterance without a speaker or the reverse: the validating reader names it
    spk = _fixed_width(u_buf, u_sep[u_order] + 1, u_end[u_order])
    speakers, labels = np.unique(spk, return_inverse=True)
    del spk, u_buf
    if (root / "spk2utt").exists():
        _check_spk2utt(root / "spk2utt", utts, speakers[labels.ravel()])
    lengths = None
    if (root / "utt2num_samples").exists():
        n_buf, n_start, n_sep, n_end, n_utts, n_order = _sorted_keys(root / "utt2num_samples")
        if len(n_utts) != len(utts) or (n_utts != utts).any():
            raise _NotFast()
        try:
            lengths = _fixed_width(n_buf, n_sep[n_order] + 1, n_end[n_order]).astype(np.int64)
        except ValueError:
            raise _NotFast() from None
        if (lengths <= 0).any():
            raise _NotFast()
    return CompactLists(
        root=root,
        buf=buf,
        utt_start=_offsets(start[order]),
        sep=_offsets(sep[order]),
        path_end=_offsets(end[order]),
        row=order.astype(np.int32 if len(order) < 2**31 else np.int64),
        labels=labels.astype(np.int32).ravel(),
        speakers=speakers,
        lengths=lengths,
    )


def _check_spk2utt(path: Path, utts: np.ndarray, spk_of_utt: np.ndarray) -> None:
    """spk2utt (`spk utt utt ...` lines) is the inverse of utt2spk: `utts` sorted, `spk_of_utt` their speakers.
    Raises _NotFast when it is not (or not in the one-space form), for the validating reader to name the line."""
    buf = np.fromfile(path, dtype=np.uint8)
    if len(buf) == 0 or buf[-1] != NEWLINE or (buf == 9).any() or (buf == 13).any():
        raise _NotFast()
    cuts = np.flatnonzero((buf == SPACE) | (buf == NEWLINE))
    start = np.concatenate([[0], cuts[:-1] + 1])
    if ((cuts - start) < 1).any():
        raise _NotFast()  # an empty token: a double space, a blank line
    first = (start == 0) | (buf[np.maximum(start - 1, 0)] == NEWLINE)
    line = np.cumsum(first) - 1
    spk_tokens = np.flatnonzero(first)
    if (buf[start[spk_tokens]] == ord("#")).any():
        raise _NotFast()
    members = np.flatnonzero(~first)
    listed = _fixed_width(buf, start[members], cuts[members])
    if len(listed) != len(utts):
        raise _NotFast()
    if (listed != utts).any():  # not in sorted order (ours are): sort, then compare
        order = np.argsort(listed, kind="stable")
        if (listed[order] != utts).any():
            raise _NotFast()
        members = members[order]
    under = spk_tokens[line[members]]
    if (_fixed_width(buf, start[under], cuts[under]) != spk_of_utt).any():
        raise _NotFast()


def from_data_dir(data: DataDir) -> CompactLists:
    """A DataDir (read by the validating reader) as CompactLists: its wav.scp written out as `utt path` lines."""
    lines = [f"{u} {data.wav[u]}\n".encode("utf-8") for u in data.utts]
    buf = np.frombuffer(b"".join(lines), dtype=np.uint8)
    sizes = np.array([len(b) for b in lines], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    sep = start + np.array([len(u.encode("utf-8")) for u in data.utts], dtype=np.int64)
    speakers = np.array([s.encode("utf-8") for s in data.speakers]) if data.speakers else np.array([], dtype="S1")
    spk2idx = data.spk2idx
    return CompactLists(
        root=data.root,
        buf=buf,
        utt_start=_offsets(start),
        sep=_offsets(sep),
        path_end=_offsets(start + sizes - 1),
        row=np.array([data.wav_line[u] - 1 for u in data.utts], dtype=np.int64),
        labels=np.array([spk2idx[data.utt2spk[u]] for u in data.utts], dtype=np.int32),
        speakers=speakers,
        lengths=np.array([data.num_samples[u] for u in data.utts], dtype=np.int64) if data.num_samples else None,
    )


def missing_files(lists: CompactLists, indices) -> List[Tuple[int, str]]:
    """(wav.scp line, path) of each utterance among `indices` whose audio file does not exist."""
    paths = lists.paths
    return [(lists.line(i), paths[i]) for i in indices if not os.path.isfile(paths[i])]


def subset_data_dir(lists: CompactLists, indices) -> DataDir:
    """The utterances `indices` of `lists` as a DataDir (ids, paths, wav.scp lines): for the checks of
    speakerlab.dataio.lists and .prepare on a sample of a large corpus, with their messages."""
    utts, paths = lists.utts(), lists.paths
    chosen = [(utts[i], paths[i], lists.line(i)) for i in indices]
    return DataDir(
        root=lists.root,
        utts=[u for u, _, _ in chosen],
        wav={u: p for u, p, _ in chosen},
        wav_line={u: n for u, _, n in chosen},
    )


class JoinedView:
    """Several StringViews (or FixedViews) as one: item i of the whole is item i - starts[c] of view c."""

    def __init__(self, views: List[StringView], starts: np.ndarray):
        self.views, self.starts = views, starts

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> str:
        if len(self.views) == 1:
            return self.views[0][i]
        c = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.views[c][i - int(self.starts[c])]

    def fixed(self) -> np.ndarray:
        return np.concatenate([v.fixed() for v in self.views])


class KeyedColumn:
    """A `key value` list (feats.scp, ...) looked up by key: `keys` (N,) sorted fixed-width (`S<width>`),
    `values[i]` the value of key i (a StringView over the file's bytes, memory-mapped). `key in column` and
    `column[key]` search the keys (binary search); `rows(keys)` finds many at once; iterating gives the keys (str,
    sorted). A few arrays, not a dict of N entries: forked loader workers read it without copying it page by page."""

    def __init__(self, path: Path, keys: np.ndarray, values: StringView):
        self.path, self.keys, self.values = path, keys, values

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[str]:
        return (k.decode("utf-8") for k in self.keys)

    def find(self, key: str) -> int:
        """The row of `key`, -1 when absent."""
        b = key.encode("utf-8")
        i = int(np.searchsorted(self.keys, b))
        return i if i < len(self.keys) and self.keys[i] == b else -1

    def __contains__(self, key: str) -> bool:
        return self.find(key) >= 0

    def __getitem__(self, key: str) -> str:
        i = self.find(key)
        if i < 0:
            raise KeyError(key)
        return self.values[i]

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """The row of each of `keys` (an `S` array (M,)) as int64 (M,), -1 where absent."""
        if len(keys) == len(self.keys) and (keys == self.keys).all():
            return np.arange(len(keys))  # the usual case, a store of the very lists: no search
        at = np.searchsorted(self.keys, keys)
        found = at < len(self.keys)
        found[found] = self.keys[at[found]] == keys[found]
        return np.where(found, at, -1)


def read_keyed(path, fallback: Optional[Callable[[Path], Dict[str, str]]] = None) -> KeyedColumn:
    """A `key value` list as a KeyedColumn: vectorised in the one-space form (module doc), the file memory-mapped;
    anything else through `fallback(path) -> {key: value}` (default speakerlab.dataio.lists.read_table, two
    fields per line), whose errors name the file and line."""
    path = Path(path)
    try:
        buf, _, sep, end, keys, order = _sorted_keys(path, mapped=True)
    except _NotFast:
        table = fallback(path) if fallback else {k: f[0] for k, (_, f) in read_table(path).items()}
        pairs = sorted((k.encode("utf-8"), v.encode("utf-8")) for k, v in table.items())
        ends = np.cumsum([len(v) for _, v in pairs], dtype=np.int64)
        starts = ends - np.array([len(v) for _, v in pairs], dtype=np.int64)
        keys = np.array([k for k, _ in pairs], dtype=bytes) if pairs else np.array([], "S1")
        buf = np.frombuffer(b"".join(v for _, v in pairs), dtype=np.uint8)
        return KeyedColumn(path, keys, StringView(buf, starts, ends))
    return KeyedColumn(path, keys, StringView(buf, _offsets(sep[order] + 1), _offsets(end[order])))
