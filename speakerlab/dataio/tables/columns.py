"""Kaldi `key value` lists (wav.scp, utt2spk, feats.scp, ...) read vectorised into a few numpy arrays, and the
string views over them: no Python object per line, so a list of 10 M lines costs its bytes and a few offset arrays
and a forked loader worker reading it copies nothing (speakerlab.dataio.tables.compact says why that matters).

    buf, start, sep, end = read_columns(path)   # key i is buf[start[i]:sep[i]], its value buf[sep[i] + 1:end[i]]
    feats = read_keyed(root / "feats.scp")      # by key: feats["utt"], "utt" in feats, feats.rows(keys)
    view = StringView(buf, start, sep)          # view[i] -> str; view.fixed() -> an S<width> array

The vectorised form is the one our preparers write: `key value` lines, one space, no blank or comment lines,
UTF-8. Anything else raises NotFast, and callers read the file again with the validating readers of
speakerlab.dataio.tables.lists, whose errors name the file and line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from speakerlab.dataio.tables.lists import read_table

NEWLINE, SPACE = 10, 32
CHUNK = 1 << 16  # rows gathered at once into fixed-width keys: (CHUNK, width) temporaries stay in cache


class NotFast(Exception):
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
        keys = fixed_width(self.buf, self.start, self.end)
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


def as_keys(strings) -> np.ndarray:
    """`strings` as a fixed-width `S<width>` array (N,): a view's own (vectorised), else each one encoded."""
    if isinstance(strings, (StringView, FixedView, JoinedView)):
        return strings.fixed()
    return np.array([s.encode("utf-8") for s in strings], dtype=bytes) if len(strings) else np.array([], "S1")


def fixed_width(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    lens = end - start
    width = max(int(lens.max()) if len(lens) else 1, 1)
    out = np.zeros((len(lens), width), dtype=np.uint8)
    columns = np.arange(width)
    for a in range(0, len(lens), CHUNK):  # a (chunk, width) gather at a time: memory stays O(N)
        index = start[a : a + CHUNK, None] + columns
        beyond = columns >= lens[a : a + CHUNK, None]
        out[a : a + CHUNK] = np.where(beyond, 0, buf[np.minimum(index, len(buf) - 1)])
    return out.view(f"S{width}").ravel()


def offsets(values: np.ndarray) -> np.ndarray:
    """The smallest unsigned dtype that holds every offset into a buffer (uint32 below 4 GiB)."""
    return values.astype(np.uint32 if (len(values) == 0 or int(values.max()) < 2**32) else np.int64)


def read_columns(path: Path, mapped: bool = False) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A `key value` file as (bytes, line start, separator, line end) arrays: key i is bytes[start:sep], its
    value bytes[sep + 1:end]; the bytes memory-mapped when `mapped`. Raises NotFast for anything but one space
    per non-empty line in UTF-8."""
    if not path.is_file() or path.stat().st_size == 0:
        raise NotFast()
    buf = np.memmap(path, dtype=np.uint8, mode="r") if mapped else np.fromfile(path, dtype=np.uint8)
    if len(buf) == 0 or buf[-1] != NEWLINE:
        raise NotFast()  # empty, or a last line without newline: the validating reader decides
    step = 1 << 26  # the byte scan in slices: its temporaries stay small
    cuts = np.concatenate([np.flatnonzero(buf[a : a + step] <= SPACE) + a for a in range(0, len(buf), step)])
    kinds = buf[cuts]
    newline = kinds == NEWLINE
    if not (newline | (kinds == SPACE)).all() or (buf.max() >= 128 and not _utf8(buf)):
        raise NotFast()  # tabs, CRs, control bytes (the validating reader splits on any whitespace), not UTF-8
    ends = cuts[newline]
    if len(cuts) != 2 * len(ends) or newline[::2].any() or not newline[1::2].all():
        raise NotFast()  # a line without exactly one space
    sep = cuts[::2]
    starts = np.concatenate([[0], ends[:-1] + 1])
    if ((sep - starts) < 1).any() or ((ends - sep) < 2).any() or (buf[starts] == ord("#")).any():
        raise NotFast()
    return buf, starts, sep, ends


def _utf8(buf: np.ndarray) -> bool:
    try:
        buf.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sorted_keys(path: Path, mapped: bool = False):
    """(bytes, start, sep, end, the keys S-array sorted, the order sorting them); raises NotFast on duplicates.
    Files written sorted (ours are) are not sorted again."""
    buf, start, sep, end = read_columns(path, mapped)
    keys = fixed_width(buf, start, sep)
    if (keys[1:] >= keys[:-1]).all():
        order = np.arange(len(keys))
    else:
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
        raise NotFast()
    return buf, start, sep, end, keys, order


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
    anything else through `fallback(path) -> {key: value}` (default speakerlab.dataio.tables.lists.read_table, two
    fields per line), whose errors name the file and line."""
    path = Path(path)
    try:
        buf, _, sep, end, keys, order = sorted_keys(path, mapped=True)
    except NotFast:
        table = fallback(path) if fallback else {k: f[0] for k, (_, f) in read_table(path).items()}
        pairs = sorted((k.encode("utf-8"), v.encode("utf-8")) for k, v in table.items())
        ends = np.cumsum([len(v) for _, v in pairs], dtype=np.int64)
        starts = ends - np.array([len(v) for _, v in pairs], dtype=np.int64)
        keys = np.array([k for k, _ in pairs], dtype=bytes) if pairs else np.array([], "S1")
        buf = np.frombuffer(b"".join(v for _, v in pairs), dtype=np.uint8)
        return KeyedColumn(path, keys, StringView(buf, starts, ends))
    return KeyedColumn(path, keys, StringView(buf, offsets(sep[order] + 1), offsets(end[order])))
