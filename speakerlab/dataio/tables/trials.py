"""Trial lists at scale: `enrol test target|nontarget` lines (also `1|0`) -> index arrays.

    index = IdIndex(ids)                       # the ids of an embeddings file, (M,)
    trials = read_trial_list("data/test/trials", index)
    trials.enrol, trials.test                  # (N,) int32 rows of the embeddings matrix
    trials.target                              # (N,) bool
    trials.line                                # (N,) int32 line numbers, for error messages

No Python object is made per line or per token: the file is read in blocks of `block_bytes` (cut at a
newline) into a byte array, token boundaries come from where whitespace starts and stops, and each
token is looked up in `IdIndex` by a 64-bit hash of its bytes (then compared byte for byte, so the
lookup is exact). Memory is the block plus 13 bytes per trial for the result.

Bad input raises `ListError` naming the file and line: a line without exactly three fields, an unknown
label, a trial repeated (same enrol and test), ids without an embedding (each such id with the lines
that name it, up to SHOWN ids), an empty list. Blank lines and lines starting with `#` are skipped, as
in `speakerlab.dataio.tables.lists`.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.dataio.tables.lists import ListError

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant (golden ratio): multiplying spreads the bits
_SHIFT = np.uint64(31)
# MASKS[k] keeps the first k bytes of a native-endian uint64 word (a token ends inside the word).
_MASKS = np.tril(np.full((9, 8), 0xFF, np.uint8), -1).copy().view(np.uint64)[:, 0]
LABELS = ("nontarget", "target", "0", "1")  # index & 1 == 1 for target labels
_EMPTY = np.uint64(2**64 - 1)  # row field of a free hash-table slot
SHOWN = 100  # ids named in a missing-embedding error; the rest are counted
# The least a trial list needs for its EER to tell a better model from a worse one; the score command warns
# below it, speakerlab-folder when a held-out split it makes falls below it. Speakers, not trials, make most of
# an EER's spread (speakerlab.scoring.interval): at 20 speakers its 95% interval is still about +-50% of the
# EER. 600 target trials: Doddington's rule of 30 (30 misses to count on) at an EER of 5%.
MIN_SPEAKERS = 20
MIN_TARGET_TRIALS = 600


def too_few_to_measure(speakers: int, target_trials: int) -> str:
    """What a trial list lacks to measure an EER ('' when it has enough): e.g. 'too few to tell models apart
    by the EER: 3 speakers (20 needed), 45 target trials (600 needed)'; what it has enough of is not named."""
    lacking = [
        f"{have} {what} ({need} needed)"
        for have, what, need in (
            (speakers, "speakers", MIN_SPEAKERS),
            (target_trials, "target trials", MIN_TARGET_TRIALS),
        )
        if have < need
    ]
    return f"too few to tell models apart by the EER: {', '.join(lacking)}" if lacking else ""


def _hash_words(words: np.ndarray) -> np.ndarray:
    """`(n, w)` uint64 -> `(n,)` uint64 hash."""
    h = np.zeros(words.shape[0], np.uint64)
    for j in range(words.shape[1]):
        h ^= words[:, j]
        h *= _MIX
        h ^= h >> _SHIFT
    return h


class IdIndex:
    """Exact lookup of byte tokens in a fixed list of ids: `ids (M,)` -> row 0..M-1, or -1.

    Each id is zero-padded to `width` bytes (a multiple of 8) and stored as `words (M, width // 8)`
    uint64; an open-addressing hash table (twice as many slots as ids, linear probing, the slot from a
    hash of the words) holds each id's words and row. Duplicate ids raise `ListError`.
    """

    def __init__(self, ids: Sequence[str], source: str = "embeddings"):
        raw = [str(i).encode("utf-8") for i in ids]
        if len(set(raw)) != len(raw):
            seen: Dict[bytes, int] = {}
            for i, r in enumerate(raw):
                if r in seen:
                    raise ListError(f"{source}: duplicate id '{r.decode()}' (entries {seen[r]} and {i})")
                seen[r] = i
        self.ids = [r.decode("utf-8") for r in raw]
        self.lengths = np.array([len(r) for r in raw], np.int64)
        self.width = max(8, -(-int(self.lengths.max(initial=1)) // 8) * 8)
        self.chars = np.zeros((len(raw), self.width), np.uint8)  # zero-padded utf-8 bytes, (M, width)
        if raw:
            flat = np.frombuffer(b"".join(raw), np.uint8)
            rows = np.repeat(np.arange(len(raw)), self.lengths)
            cols = np.arange(len(flat)) - np.repeat(np.cumsum(self.lengths) - self.lengths, self.lengths)
            self.chars[rows, cols] = flat
        self.words = self.chars.view(np.uint64)
        self._build(_hash_words(self.words))

    def __len__(self) -> int:
        return len(self.ids)

    def _build(self, h: np.ndarray) -> None:
        bits = max(4, int(np.ceil(np.log2(2 * len(h) + 1))))
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        # One table row per slot: the id's words, then its row (EMPTY when the slot is free); a probe is
        # one gather of a table row, compared word by word (exact: no hash compare needed).
        n_words = self.words.shape[1]
        self._table = np.zeros((1 << bits, n_words + 1), np.uint64)
        self._table[:, -1] = _EMPTY
        pending = np.arange(len(h))
        slot = (h >> self._shift).astype(np.int64)
        # Insert in rounds: in each, the first id wanting a free slot takes it; every other id moves one
        # slot on (its slot is now taken), so no empty slot lies between an id's home and its place.
        while pending.size:
            s = slot[pending]
            free = self._table[s, -1] == _EMPTY
            taken, first = np.unique(s[free], return_index=True)
            winners = pending[free][first]
            self._table[taken, :-1] = self.words[winners]
            self._table[taken, -1] = winners
            lost = np.ones(len(pending), bool)
            lost[np.flatnonzero(free)[first]] = False
            pending = pending[lost]
            slot[pending] = (slot[pending] + 1) & self._mask

    def lookup_words(self, words: np.ndarray) -> np.ndarray:
        """`(n, width // 8)` uint64 zero-padded tokens -> `(n,)` int32 rows, -1 where absent."""
        out = np.full(len(words), -1, np.int32)
        todo = None  # None: all tokens (the first probe needs no subsetting)
        slot = (_hash_words(words) >> self._shift).astype(np.int64)
        while todo is None or todo.size:
            probe = np.take(self._table, slot, axis=0)  # (faster than self._table[slot])
            mine = words if todo is None else words[todo]
            hit = probe[:, 0] == mine[:, 0]
            for j in range(1, mine.shape[1]):
                hit &= probe[:, j] == mine[:, j]
            go_on = ~hit & (probe[:, -1] != _EMPTY)  # a free slot ends the search: absent
            if todo is None:
                out[hit] = probe[hit, -1]
                todo = np.flatnonzero(go_on)
            else:
                out[todo[hit]] = probe[hit, -1]
                todo = todo[go_on]
            slot = (slot[go_on] + 1) & self._mask
        return out

    def _token_words(self, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        n_words = self.width // 8
        # Every byte offset of buf read as a uint64 (unaligned, stride 1): word j of token i is at
        # starts[i] + 8 j; the bytes past its end are masked to zero, as in the padded ids.
        as_u64 = np.ndarray((len(buf) - 7,), np.uint64, buffer=buf, strides=(1,))
        words = np.empty((len(starts), n_words), np.uint64)
        for j in range(n_words):
            np.bitwise_and(as_u64[starts + 8 * j], np.take(_MASKS, np.clip(lengths - 8 * j, 0, 8)), out=words[:, j])
        return words

    def lookup(self, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Tokens `buf[starts[i] : starts[i] + lengths[i]]` -> `(n,)` int32 rows, -1 where absent.

        `buf` is a uint8 array with at least `width` bytes after the last token."""
        out = self.lookup_words(self._token_words(buf, starts, lengths))
        out[lengths > self.width] = -1
        return out

    def lookup_small(self, buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """`lookup` for an index of a few ids (the labels): compare with each id, no hashing."""
        words = self._token_words(buf, starts, lengths)
        out = np.full(len(starts), -1, np.int32)
        for row in range(len(self)):
            hit = words[:, 0] == self.words[row, 0]
            for j in range(1, words.shape[1]):
                hit &= words[:, j] == self.words[row, j]
            out[hit] = row
        out[lengths > self.width] = -1
        return out


@dataclass
class TrialList:
    """A parsed trial list: `enrol`, `test` (N,) int32 rows of `index`, `target` (N,) bool, `line` (N,)."""

    path: Path
    index: IdIndex
    enrol: np.ndarray
    test: np.ndarray
    target: np.ndarray
    line: np.ndarray

    def __len__(self) -> int:
        return len(self.target)


_LABEL_INDEX = IdIndex(LABELS, "labels")


def _line_text(buf: np.ndarray, newlines: np.ndarray, k: int) -> str:
    """Text of line k of a block (`newlines` holds the sentinel at 0 and each line's end)."""
    return bytes(buf[newlines[k] + 1 : newlines[k + 1]]).decode("utf-8", "replace").strip()


def _tokens(core: np.ndarray, path: Path, line0: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A block `core` (a newline sentinel, then lines `line0 + 1...`, the last ending with a newline) ->
    starts and ends of its tokens, three per trial line, and the line number of each trial."""
    sep = np.flatnonzero(core <= 32)
    n = (len(sep) - 1) // 3
    vals = core[sep]
    # Fast path: every line is `a b c` with single separators, no blank or comment line.
    if (
        len(sep) == 3 * n + 1
        and (np.diff(sep) > 1).all()
        and (vals[0::3] == 10).all()
        and (vals[1::3] != 10).all()
        and (vals[2::3] != 10).all()
        and (core[sep[:-1:3] + 1] != ord("#")).all()
    ):
        return sep[:-1] + 1, sep[1:], np.arange(line0 + 1, line0 + n + 1, dtype=np.int32)
    ws = core <= 32
    edges = np.flatnonzero(ws[1:] != ws[:-1]) + 1
    starts, ends = edges[0::2], edges[1::2]
    newlines = np.flatnonzero(core == 10)
    k = np.searchsorted(newlines, starts, side="right") - 1  # line index in the block, 0-based
    first = np.r_[True, k[1:] != k[:-1]]
    comment = k[first & (core[starts] == ord("#"))]
    if comment.size:
        keep = ~np.isin(k, comment)
        starts, ends, k = starts[keep], ends[keep], k[keep]
    if not len(k):  # only blank or comment lines
        return starts, ends, np.zeros(0, np.int32)
    run_start = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[run_start, len(k)])
    if (counts != 3).any():
        bad = int(k[run_start[np.argmax(counts != 3)]])
        raise ListError(
            f"{path}:{line0 + bad + 1}: expected 'enrol test target|nontarget', got {_line_text(core, newlines, bad)!r}"
        )
    return starts, ends, (line0 + k[0::3] + 1).astype(np.int32)


def _blocks(path: Path, block_bytes: int, pad: int):
    """Yield `(buf, n, line0)`: `buf[:n]` is a newline sentinel then whole lines of the file (the last
    ends with a newline) starting after line `line0`; `buf` holds at least `pad` more bytes. Each block is
    a new buffer of about `block_bytes` (larger only for a line longer than that)."""
    line0 = 0
    carry = np.zeros(0, np.uint8)  # an unfinished line, moved to the next block
    with open(path, "rb") as f:
        while True:
            cap = max(block_bytes, 2 * len(carry))
            buf = np.zeros(1 + cap + pad, np.uint8)
            buf[0] = 10
            buf[1 : 1 + len(carry)] = carry
            got = f.readinto(memoryview(buf)[1 + len(carry) : 1 + cap])
            total = len(carry) + got
            if not got:
                if len(carry):
                    buf[1 + total] = 10
                    yield buf, total + 2, line0
                return
            cut = _last_newline(buf, 1 + total)
            if cut < 0:  # no newline yet: a line longer than the block
                carry = buf[1 : 1 + total].copy()
                continue
            carry = buf[cut + 1 : 1 + total].copy()
            yield buf, cut + 1, line0
            line0 += int(np.count_nonzero(buf[1 : cut + 1] == 10))


def _last_newline(buf: np.ndarray, end: int) -> int:
    """Index of the last newline in `buf[1:end]`, or -1."""
    width = 4096
    while True:
        lo = max(1, end - width)
        hits = np.flatnonzero(buf[lo:end] == 10)
        if hits.size:
            return lo + int(hits[-1])
        if lo == 1:
            return -1
        width *= 16


def _missing_error(path: Path, missing: List[Tuple[int, str]], n_lines: int, complete: bool, lacking: str) -> ListError:
    """`missing`: (line, id) in line order; `complete`: it holds every missing token of the file."""
    lines: Dict[str, List[int]] = {}
    for line, tok in missing:
        lines.setdefault(tok, []).append(line)
    rows = []
    for tok, at in list(lines.items())[:SHOWN]:
        also = f" (also line{'s' if len(at) > 2 else ''} {', '.join(map(str, at[1:10]))}" if len(at) > 1 else ""
        also += ", ...)" if len(at) > 10 else (")" if also else "")
        rows.append(f"  {path}:{at[0]}: '{tok}'{also}")
    more = ""
    if len(lines) > SHOWN or not complete:
        count = f"{len(lines) - SHOWN} more ids" if complete else "more ids (the list was not kept past this point)"
        more = f"\n  ... and {count}"
    return ListError(
        f"{path}: {n_lines} trial line(s) name ids {lacking}; each id with the lines naming it:\n"
        + "\n".join(rows)
        + more
    )


def _parse_block(buf: np.ndarray, n: int, line0: int, path: Path, index: IdIndex):
    """One block -> (enrol, test, target, line) arrays, [(line, missing id)...] (bounded), count of lines
    with a missing id."""
    starts, ends, lines = _tokens(buf[:n], path, line0)
    lengths = ends - starts
    lab = _LABEL_INDEX.lookup_small(buf, starts[2::3], lengths[2::3])
    if (lab < 0).any():
        i = int(np.argmax(lab < 0))
        tok = bytes(buf[starts[3 * i + 2] : ends[3 * i + 2]]).decode("utf-8", "replace")
        raise ListError(f"{path}:{lines[i]}: label must be target or nontarget (or 1/0), got {tok!r}")
    ids = [index.lookup(buf, starts[j::3], lengths[j::3]) for j in (0, 1)]
    n_missing = int(np.count_nonzero((ids[0] < 0) | (ids[1] < 0)))
    missing: List[Tuple[int, str]] = []
    for col, rows in enumerate(ids):
        # Keep the text of a bounded number of missing tokens: enough to name SHOWN distinct ids.
        for i in np.flatnonzero(rows < 0)[: 10 * SHOWN]:
            tok = bytes(buf[starts[3 * i + col] : ends[3 * i + col]]).decode("utf-8", "replace")
            missing.append((int(lines[i]), tok))
    return (ids[0], ids[1], (lab & 1).astype(bool), lines), missing, n_missing


def default_threads() -> int:
    """Threads for parsing and scoring: numpy releases the GIL in the array work, so blocks run in parallel."""
    return max(1, min(4, os.cpu_count() or 1))


def read_trial_list(
    path,
    index: IdIndex,
    block_bytes: int = 2 << 20,
    threads: Optional[int] = None,
    lacking: str = "without an embedding",
) -> TrialList:
    """Parse a trial list against the ids of `index` (see the module docstring for the errors).

    Blocks of `block_bytes` are parsed by `threads` threads (default `default_threads()`), at most
    `threads + 1` in memory (2 MB: their temporaries come from the allocator's heap, not fresh pages).
    `lacking` words the error for ids not in the index ("... name ids {lacking}")."""
    path = Path(path)
    if not path.is_file():
        raise ListError(f"{path}: file does not exist")
    threads = threads or default_threads()
    pad = max(index.width, _LABEL_INDEX.width) + 8
    parts: List[Tuple[np.ndarray, ...]] = []
    missing: List[Tuple[int, str]] = []
    n_missing = 0

    def collect(fut) -> None:
        nonlocal n_missing
        arrays, miss, n_miss = fut.result()
        parts.append(arrays)
        missing.extend(miss[: max(0, 10 * SHOWN - len(missing))])
        n_missing += n_miss

    with ThreadPoolExecutor(threads) as pool:
        pending: Deque = deque()
        for buf, n, line0 in _blocks(path, block_bytes, pad):
            pending.append(pool.submit(_parse_block, buf, n, line0, path, index))
            while len(pending) > threads:  # bounds the blocks in memory; results stay in file order
                collect(pending.popleft())
        while pending:
            collect(pending.popleft())
    if missing:
        complete = len(missing) < 10 * SHOWN  # fewer than the cap: no missing token was left out
        raise _missing_error(path, sorted(missing), n_missing, complete, lacking)
    if not parts or not sum(len(p[0]) for p in parts):
        raise ListError(f"{path}: no trials")
    enrol, test, target, line = (np.concatenate(c) for c in zip(*parts))
    _check_duplicates(path, index, enrol, test, line)
    return TrialList(path, index, enrol, test, target, line)


def _check_duplicates(path: Path, index: IdIndex, enrol, test, line) -> None:
    def keys() -> np.ndarray:  # one int64 per trial: (enrol, test) pairs compare as numbers
        key = enrol.astype(np.int64)
        key *= max(1, len(index))
        key += test
        return key

    ordered = keys()
    ordered.sort()  # in place: no second copy of 8 bytes per trial
    if not (ordered[1:] == ordered[:-1]).any():
        return
    del ordered
    key = keys()
    order = np.argsort(key, kind="stable")  # only on the error path: which lines repeat
    dup = np.flatnonzero(key[order][1:] == key[order][:-1])
    i, j = order[dup], order[dup + 1]
    second = int(np.argmin(line[j]))
    a, b = int(enrol[j[second]]), int(test[j[second]])
    raise ListError(
        f"{path}:{line[j[second]]}: duplicate trial '{index.ids[a]} {index.ids[b]}' "
        f"(first on line {line[i[second]]}; {len(dup)} repeated line(s))"
    )
