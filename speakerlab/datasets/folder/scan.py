"""The input of speakerlab-folder (speakerlab.datasets.folder.cli): a folder tree (one subfolder per speaker) or
a CSV list read into `Item`s, and the list-safe speaker and utterance ids given to them (the rules: the command's
docstring, "Ids")."""

from __future__ import annotations

import csv
import hashlib
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import soundfile as sf

from speakerlab.datasets.common import DatasetError, require_dir, require_file
from speakerlab.datasets.download import log

MAX_ID = 64  # characters of a cleaned name kept in an id
SPEAKER_BAD = re.compile(r"[^A-Za-z0-9_]+")
UTT_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def audio_extensions() -> Tuple[str, ...]:
    """File extensions of the formats this soundfile reads (`.wav`, `.flac`, `.ogg`, `.mp3`, ...)."""
    ext = {f".{f.lower()}" for f in sf.available_formats()} | {".wav", ".flac", ".ogg", ".oga", ".opus", ".aif"}
    return tuple(sorted(ext))


@dataclass
class Item:
    """One input file: `path` absolute, `speaker` and `session` as the user named them, `name` the
    utterance part of its id before cleaning."""

    path: str
    speaker: str
    session: str
    name: str


# ---------------------------------------------------------------- input


def scan_tree(root, folder_sessions: bool, exclude: Optional[Path] = None) -> Tuple[List[Item], List[str]]:
    """`root/<speaker>/**/<file>` -> (audio items, report lines of the files left out). Links to folders
    are followed (each real folder once); `exclude` (the output dir) is not entered."""
    root = require_dir(root, "--root takes the folder that holds one folder per speaker")
    exts = audio_extensions()
    items, report, seen = [], [], {}
    skip = os.path.realpath(exclude) if exclude is not None else None
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        st = os.stat(dirpath)
        first = seen.get((st.st_dev, st.st_ino))
        if first is not None or os.path.realpath(dirpath) == skip:
            dirnames[:] = []
            if first is not None:  # its files are the first one's: said, not dropped silently
                report.append(f"{os.path.abspath(dirpath)}: left out: a link to a folder read already ({first})")
            continue
        seen[(st.st_dev, st.st_ino)] = os.path.abspath(dirpath)
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(root).parts
        for f in sorted(filenames):
            path = os.path.join(os.path.abspath(dirpath), f)
            if not rel_dir:
                report.append(f"{path}: left out: not in a speaker folder")
            elif os.path.splitext(f)[1].lower() not in exts:
                report.append(f"{path}: left out: not an audio file (by its extension)")
            else:
                below = [*rel_dir[1:], os.path.splitext(f)[0]]
                session = rel_dir[1] if folder_sessions and len(rel_dir) > 1 else ""
                items.append(Item(path, rel_dir[0], session, "-".join(below)))
    return items, report


def read_csv(path) -> Tuple[List[Item], bool]:
    """`path,speaker[,session]` rows -> (items, whether sessions are given). Malformed rows and a path
    listed twice raise DatasetError naming FILE:LINE."""
    path = require_file(path)
    base = path.parent.resolve()
    items: List[Item] = []
    first_line: Dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
            header = True  # until the first row that is not blank
            for row in reader:
                lineno = reader.line_num
                fields = [x.strip() for x in row]
                if not any(fields):
                    continue
                if header and _is_header(fields[0], base):
                    log(f"{path}:{lineno}: a header row, not a file: {','.join(fields)}")
                    header = False
                    continue
                header = False
                where = f"{path}:{lineno}"
                if len(fields) not in (2, 3):
                    raise DatasetError(f"{where}: expected path,speaker[,session], got {len(fields)} fields: {row!r}")
                if not fields[0] or not fields[1]:
                    raise DatasetError(f"{where}: empty {'path' if not fields[0] else 'speaker'}: {row!r}")
                p = os.path.normpath(os.path.join(base, os.path.expanduser(fields[0])))
                if p in first_line:
                    raise DatasetError(f"{where}: {p} is listed twice (first on line {first_line[p]})")
                first_line[p] = lineno
                session = fields[2] if len(fields) == 3 else ""
                items.append(Item(p, fields[1], session, os.path.splitext(os.path.basename(p))[0]))
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise DatasetError(f"{path}:{reader.line_num}: {e}") from None
    if not items:
        raise DatasetError(f"{path}: no rows")
    return items, any(it.session for it in items)


def _is_header(first: str, base: Path) -> bool:
    """Whether the path field of a CSV's first row is a column name: no such file, and no file extension."""
    p = os.path.join(base, os.path.expanduser(first))
    return not os.path.lexists(p) and not os.path.splitext(first)[1]


# ---------------------------------------------------------------- ids


def safe_ids(names: Dict[str, str], bad: re.Pattern) -> Dict[str, str]:
    """{key: name} -> {key: id}: the name when it has no `bad` character, fits MAX_ID and no other name
    cleans to it; else the cleaned name + `_` + 8 hex digits of the key's SHA-1 (keys are unique)."""
    cleaned = {k: bad.sub("_", n).strip("_")[:MAX_ID] for k, n in names.items()}
    count = Counter(cleaned.values())
    ids = {}
    for k, n in names.items():
        c = cleaned[k]
        ok = c == n and count[c] == 1 and c
        ids[k] = c if ok else f"{c or 'id'}_{hashlib.sha1(k.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}"
    clash = [i for i, n in Counter(ids.values()).items() if n > 1]
    if clash:  # a clean name that equals another's hashed id: astronomically unlikely, but never silent
        raise DatasetError(f"two inputs map to the id {clash[0]!r}; rename one of them")
    return ids


def assign_ids(items: Sequence[Item]) -> Tuple[Dict[str, str], List[str]]:
    """(speaker name -> speaker id, utterance id of each item)."""
    spk_ids = safe_ids({s: s for s in sorted({it.speaker for it in items})}, SPEAKER_BAD)
    utt = [""] * len(items)
    by_spk: Dict[str, List[int]] = defaultdict(list)
    for i, it in enumerate(items):
        by_spk[it.speaker].append(i)
    for spk, idx in by_spk.items():
        parts = safe_ids({items[i].path: items[i].name for i in idx}, UTT_BAD)
        for i in idx:
            utt[i] = f"{spk_ids[spk]}-{parts[items[i].path]}"
    return spk_ids, utt
