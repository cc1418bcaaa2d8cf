"""Training lists of millions of utterances in a few numpy arrays: no Python object per utterance.

A data dir of 10 M utterances read into dicts and lists of str is 10 M x several Python objects: gigabytes,
minutes of parsing, and, worse, every loader worker that touches one of them writes its reference count, so the
pages the worker shares with the main process after the fork are copied one by one: each worker grows towards a
full copy over the epoch. Here a data dir is its wav.scp bytes as one uint8 array plus offset arrays, the labels
and lengths as integer arrays, and the speakers as one fixed-width byte array: reading `paths[i]` decodes one
string and writes nothing shared, so forked workers stay at what they inherited.

    lists = read_compact(root)             # one data dir: utterances sorted by id, speakers sorted, as DataDir
    lists.paths[i], lists.labels[i], lists.lengths[i], lists.utts[i], lists.speakers

Reading is vectorised for the form our preparers and speakerlab-prepare write (`key value` lines, one space, no
blank or comment lines, UTF-8). Anything else (tabs, comments, duplicates, an utterance without a speaker, a
malformed count) is read again by the validating reader of speakerlab.dataio.tables.lists, so every error is its
message with file and line, and every file it accepts is accepted here.

What a read in the fast form found is kept in `<data dir>/.compact/` (the arrays as .npy, then meta.json with the
lists' sizes and times): the next read memory-maps them, and wav.scp itself, instead of parsing, as long as no
list changed. The prepare stage reads once, so training starts map; the mapped pages are the page cache's,
shared by the loader workers and by every rank on the node.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from speakerlab.dataio.tables.columns import NEWLINE, SPACE, NotFast, StringView, fixed_width, offsets, sorted_keys
from speakerlab.dataio.tables.lists import DataDir, ListError, load_data_dir
from speakerlab.outputs import folder_problem, output_file, write_text


@dataclass(kw_only=True)
class CompactLists:
    """One data dir's training lists, utterances sorted by id (as DataDir.utts), speakers sorted (DataDir.speakers).

    `buf`: wav.scp's bytes; utterance i is buf[utt_start[i]:sep[i]], its audio path buf[sep[i] + 1:path_end[i]],
    on line `row[i] + 1` of wav.scp. `labels` (N,) int32 index `speakers` (S,) (an `S<width>` array); an
    unlabelled data dir (no utt2spk, or its labels dropped by `without_labels`) has no speakers and every label
    UNLABELLED; `lengths` (N,) int64 samples from utt2num_samples, or None without one."""

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

    @property
    def labelled(self) -> bool:
        return len(self.speakers) > 0


UNLABELLED = -1  # the label of every utterance of an unlabelled data dir


def no_speakers() -> np.ndarray:
    return np.array([], dtype="S1")


def without_labels(lists: CompactLists) -> CompactLists:
    """The same lists with no speaker: a labelled data dir trained on as unlabelled (config data.labels)."""
    return dataclasses.replace(lists, labels=np.full(len(lists), UNLABELLED, dtype=np.int32), speakers=no_speakers())


def read_compact(root) -> CompactLists:
    """`root`'s wav.scp, utt2spk (when present: without it the lists are unlabelled) and utt2num_samples (when
    present) as CompactLists, cross-checked as
    speakerlab.dataio.tables.lists.load_data_dir checks them (whose errors it raises). The arrays of a read in the fast
    form are kept in `root/.compact/` (when it can be written), and memory-mapped by the next read as long as
    the lists have the same sizes and times: the prepare stage reads once, every training start maps."""
    root = Path(root)
    if not root.is_dir():
        raise ListError(folder_problem(root, writable=False) or f"{root}: data dir does not exist")
    cached = _load_cache(root)
    if cached is not None:
        return cached
    try:
        lists = _read_fast(root)
    except NotFast:
        return from_data_dir(load_data_dir(root, need_speakers=(root / "utt2spk").exists()))
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
                with output_file(folder / f"{name}.npy", "wb", fsync=False) as f:  # a cache: checked when read
                    np.save(f, value)
        write_text(folder / "meta.json", json.dumps(stamp))
    except OSError:
        pass


def _read_fast(root: Path) -> CompactLists:
    buf, start, sep, end, utts, order = sorted_keys(root / "wav.scp")
    if (root / "utt2spk").exists():
        speakers, labels = _read_speakers(root, utts)
    else:
        speakers, labels = no_speakers(), np.full(len(utts), UNLABELLED)
    lengths = None
    if (root / "utt2num_samples").exists():
        n_buf, n_start, n_sep, n_end, n_utts, n_order = sorted_keys(root / "utt2num_samples")
        if len(n_utts) != len(utts) or (n_utts != utts).any():
            raise NotFast()
        try:
            lengths = fixed_width(n_buf, n_sep[n_order] + 1, n_end[n_order]).astype(np.int64)
        except ValueError:
            raise NotFast() from None
        if (lengths <= 0).any():
            raise NotFast()
    return CompactLists(
        root=root,
        buf=buf,
        utt_start=offsets(start[order]),
        sep=offsets(sep[order]),
        path_end=offsets(end[order]),
        row=order.astype(np.int32 if len(order) < 2**31 else np.int64),
        labels=labels.astype(np.int32).ravel(),
        speakers=speakers,
        lengths=lengths,
    )


def _read_speakers(root: Path, utts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(speakers (S,) sorted, labels (N,) indexing them) of utt2spk, for `utts` (sorted wav.scp ids)."""
    u_buf, u_start, u_sep, u_end, u_utts, u_order = sorted_keys(root / "utt2spk")
    if len(u_utts) != len(utts) or (u_utts != utts).any():
        raise NotFast()  # an utterance without a speaker or the reverse: the validating reader names it
    spk = fixed_width(u_buf, u_sep[u_order] + 1, u_end[u_order])
    speakers, labels = np.unique(spk, return_inverse=True)
    del spk, u_buf
    if (root / "spk2utt").exists():
        _check_spk2utt(root / "spk2utt", utts, speakers[labels.ravel()])
    return speakers, labels


def _check_spk2utt(path: Path, utts: np.ndarray, spk_of_utt: np.ndarray) -> None:
    """spk2utt (`spk utt utt ...` lines) is the inverse of utt2spk: `utts` sorted, `spk_of_utt` their speakers.
    Raises NotFast when it is not (or not in the one-space form), for the validating reader to name the line."""
    buf = np.fromfile(path, dtype=np.uint8)
    if len(buf) == 0 or buf[-1] != NEWLINE or (buf == 9).any() or (buf == 13).any():
        raise NotFast()
    cuts = np.flatnonzero((buf == SPACE) | (buf == NEWLINE))
    start = np.concatenate([[0], cuts[:-1] + 1])
    if ((cuts - start) < 1).any():
        raise NotFast()  # an empty token: a double space, a blank line
    first = (start == 0) | (buf[np.maximum(start - 1, 0)] == NEWLINE)
    line = np.cumsum(first) - 1
    spk_tokens = np.flatnonzero(first)
    if (buf[start[spk_tokens]] == ord("#")).any():
        raise NotFast()
    members = np.flatnonzero(~first)
    listed = fixed_width(buf, start[members], cuts[members])
    if len(listed) != len(utts):
        raise NotFast()
    if (listed != utts).any():  # not in sorted order (ours are): sort, then compare
        order = np.argsort(listed, kind="stable")
        if (listed[order] != utts).any():
            raise NotFast()
        members = members[order]
    under = spk_tokens[line[members]]
    if (fixed_width(buf, start[under], cuts[under]) != spk_of_utt).any():
        raise NotFast()


def from_data_dir(data: DataDir) -> CompactLists:
    """A DataDir (read by the validating reader) as CompactLists: its wav.scp written out as `utt path` lines."""
    lines = [f"{u} {data.wav[u]}\n".encode("utf-8") for u in data.utts]
    buf = np.frombuffer(b"".join(lines), dtype=np.uint8)
    sizes = np.array([len(b) for b in lines], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    sep = start + np.array([len(u.encode("utf-8")) for u in data.utts], dtype=np.int64)
    speakers = np.array([s.encode("utf-8") for s in data.speakers]) if data.speakers else no_speakers()
    spk2idx = data.spk2idx
    return CompactLists(
        root=data.root,
        buf=buf,
        utt_start=offsets(start),
        sep=offsets(sep),
        path_end=offsets(start + sizes - 1),
        row=np.array([data.wav_line[u] - 1 for u in data.utts], dtype=np.int64),
        labels=np.array([spk2idx.get(data.utt2spk.get(u), UNLABELLED) for u in data.utts], dtype=np.int32),
        speakers=speakers,
        lengths=np.array([data.num_samples[u] for u in data.utts], dtype=np.int64) if data.num_samples else None,
    )


def missing_files(lists: CompactLists, indices) -> List[Tuple[int, str]]:
    """(wav.scp line, path) of each utterance among `indices` whose audio file does not exist."""
    paths = lists.paths
    return [(lists.line(i), paths[i]) for i in indices if not os.path.isfile(paths[i])]


def subset_data_dir(lists: CompactLists, indices) -> DataDir:
    """The utterances `indices` of `lists` as a DataDir (ids, paths, wav.scp lines): for the checks of
    speakerlab.dataio.tables.lists and .prepare on a sample of a large corpus, with their messages."""
    utts, paths = lists.utts(), lists.paths
    chosen = [(utts[i], paths[i], lists.line(i)) for i in indices]
    return DataDir(
        root=lists.root,
        utts=[u for u, _, _ in chosen],
        wav={u: p for u, p, _ in chosen},
        wav_line={u: n for u, _, n in chosen},
    )
