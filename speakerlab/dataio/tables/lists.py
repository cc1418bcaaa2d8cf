"""Kaldi-style data lists: wav.scp, utt2spk, spk2utt, utt2num_samples (trial lists: `speakerlab.dataio.tables.trials`).

Every reader validates as it reads and raises `ListError` naming the file and line number:
malformed lines, duplicate ids, utterances without a speaker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from speakerlab.outputs import folder_problem, output_file


class ListError(ValueError):
    """A data list is malformed; the message starts with `file:line:`."""


def rerun_features(command: str, data) -> str:
    """What to do when what the features stage wrote no longer matches the lists: every recipe's stage 2."""
    return f"re-run the features stage (recipe stage 2: {command} --data {data})"


def _lines(path: Path):
    if not path.exists():
        raise ListError(f"{path}: file does not exist")
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise ListError(
                    f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start} of the line); lists must be UTF-8"
                ) from None
            if line and not line.startswith("#"):
                yield lineno, line


def read_table(path, min_fields: int = 2, max_fields: Optional[int] = 2) -> Dict[str, Tuple[int, List[str]]]:
    """`id field...` lines -> {id: (line number, fields)}; duplicate ids and bad field counts raise."""
    path = Path(path)
    table: Dict[str, Tuple[int, List[str]]] = {}
    for lineno, line in _lines(path):
        parts = line.split()
        if len(parts) < min_fields or (max_fields is not None and len(parts) > max_fields):
            want = f"{min_fields}" if max_fields == min_fields else f"{min_fields}..{max_fields or 'n'}"
            raise ListError(f"{path}:{lineno}: expected {want} fields, got {len(parts)}: {line!r}")
        key = parts[0]
        if key in table:
            raise ListError(f"{path}:{lineno}: duplicate id '{key}' (first on line {table[key][0]})")
        table[key] = (lineno, parts[1:])
    return table


def read_wav_scp(path) -> Dict[str, Tuple[int, str]]:
    """wav.scp -> {utt: (line number, audio path)}. Kaldi pipe commands are not supported."""
    path = Path(path)
    out = {}
    for utt, (lineno, fields) in read_table(path, 2, None).items():
        target = " ".join(fields)
        if target.endswith("|"):
            raise ListError(f"{path}:{lineno}: pipe commands are not supported, convert '{utt}' to a wav/flac file")
        if len(fields) != 1:
            raise ListError(f"{path}:{lineno}: expected '<utt> <path>', got {len(fields) + 1} fields")
        out[utt] = (lineno, target)
    return out


def read_utt2spk(path) -> Dict[str, Tuple[int, str]]:
    """utt2spk -> {utt: (line number, speaker)}."""
    return {u: (n, f[0]) for u, (n, f) in read_table(path, 2, 2).items()}


def read_spk2utt(path) -> Dict[str, Tuple[int, List[str]]]:
    """spk2utt -> {spk: (line number, [utt, ...])}."""
    return read_table(path, 2, None)


def read_utt2num_samples(path) -> Dict[str, int]:
    """utt2num_samples -> {utt: samples}; non-integer or non-positive counts raise."""
    path = Path(path)
    out = {}
    for utt, (lineno, fields) in read_table(path, 2, 2).items():
        try:
            n = int(fields[0])
        except ValueError:
            n = -1
        if n <= 0:
            raise ListError(f"{path}:{lineno}: sample count must be a positive integer, got {fields[0]!r}")
        out[utt] = n
    return out


@dataclass
class DataDir:
    """A validated Kaldi data dir: utterance ids (sorted), audio paths, speakers.

    `spk2idx` maps speaker ids (sorted) to class indices 0..S-1.
    """

    root: Path
    utts: List[str]
    wav: Dict[str, str]
    wav_line: Dict[str, int]
    utt2spk: Dict[str, str] = field(default_factory=dict)
    num_samples: Dict[str, int] = field(default_factory=dict)

    @property
    def speakers(self) -> List[str]:
        return sorted(set(self.utt2spk.values()))

    @property
    def spk2idx(self) -> Dict[str, int]:
        return {s: i for i, s in enumerate(self.speakers)}

    def check_audio_exists(self) -> None:
        """Report every listed audio file that does not exist (all of them, with line numbers)."""
        scp = self.root / "wav.scp"
        missing = [(self.wav_line[u], self.wav[u]) for u in self.utts if not os.path.isfile(self.wav[u])]
        if missing:
            shown = "\n".join(f"  {scp}:{n}: {p}" for n, p in missing[:50])
            more = f"\n  ... and {len(missing) - 50} more" if len(missing) > 50 else ""
            raise ListError(f"{len(missing)} audio file(s) listed in {scp} do not exist:\n{shown}{more}")


def load_data_dir(root, need_speakers: bool = True, derived: bool = True) -> DataDir:
    """Read and cross-check `root/wav.scp`, `utt2spk` (and `spk2utt`, `utt2num_samples` if present).

    Every utterance in wav.scp must have a speaker (when `need_speakers`) and every utt2spk entry must
    be in wav.scp; spk2utt, when present, must be the inverse of utt2spk. `derived=False` reads neither spk2utt nor
    utt2num_samples: the prepare stage, which writes them from the lists, reads the lists it writes them from.
    """
    root = Path(root)
    if not root.is_dir():
        raise ListError(folder_problem(root, writable=False) or f"{root}: data dir does not exist")
    wav = read_wav_scp(root / "wav.scp")
    data = DataDir(
        root=root,
        utts=sorted(wav),
        wav={u: p for u, (n, p) in wav.items()},
        wav_line={u: n for u, (n, p) in wav.items()},
    )
    if need_speakers or (root / "utt2spk").exists():
        u2s = read_utt2spk(root / "utt2spk")
        for utt, (lineno, _) in u2s.items():
            if utt not in wav:
                raise ListError(f"{root / 'utt2spk'}:{lineno}: utterance '{utt}' is not in wav.scp")
        for utt in data.utts:
            if utt not in u2s:
                raise ListError(f"{root / 'wav.scp'}:{wav[utt][0]}: utterance '{utt}' has no speaker in utt2spk")
        data.utt2spk = {u: s for u, (n, s) in u2s.items()}
        if derived and (root / "spk2utt").exists():
            check_spk2utt(root / "spk2utt", data.utt2spk)
    if derived and (root / "utt2num_samples").exists():
        data.num_samples = read_utt2num_samples(root / "utt2num_samples")
        for utt in data.utts:
            if utt not in data.num_samples:
                raise ListError(
                    f"{root / 'utt2num_samples'}: no entry for '{utt}' of wav.scp (the lists changed since the length "
                    f"index was written); {rerun_features('speakerlab-prepare', root)}"
                )
    return data


def check_spk2utt(path: Path, utt2spk: Dict[str, str]) -> None:
    """ListError naming `path` (and its line) unless spk2utt is the inverse of `utt2spk`."""
    seen = set()
    for spk, (lineno, utts) in read_spk2utt(path).items():
        for utt in utts:
            if utt2spk.get(utt) != spk:
                raise ListError(f"{path}:{lineno}: '{utt}' under speaker '{spk}' but utt2spk says {utt2spk.get(utt)!r}")
            seen.add(utt)
    if len(seen) != len(utt2spk):
        missing = sorted(set(utt2spk) - seen)[0]
        raise ListError(f"{path}: utterance '{missing}' of utt2spk is missing")


def write_table(path, rows: Iterable[Tuple[str, object]]) -> None:
    """Write `key value` lines (value lists are space-joined), atomically; a file of the same lines is kept as it
    is, its modification time too (a rerun of a preparing stage does not make shards or feature stores stale)."""
    with output_file(path, keep_same=True) as f:
        for key, value in rows:
            value = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            f.write(f"{key} {value}\n")


def group_by_speaker(utts: Iterable[str], utt2spk: Dict[str, str]) -> Dict[str, List[str]]:
    """spk2utt's content: {speaker: its utterances, in the order of `utts`}."""
    spk2utt: Dict[str, List[str]] = {}
    for u in utts:
        spk2utt.setdefault(utt2spk[u], []).append(u)
    return spk2utt


def write_lists(root: Path, utts: List[str], wav: Dict[str, str], utt2spk: Dict[str, str]) -> int:
    """Write `root/{wav.scp,utt2spk,spk2utt}` of `utts` in that order; returns the number of speakers. The lists an
    earlier run left there and that these replace are rewritten or removed (`utt2num_samples`, the index stage's, is
    rebuilt by it), never left to disagree: a data dir written again over itself is whole."""
    root.mkdir(parents=True, exist_ok=True)
    write_table(root / "wav.scp", ((u, wav[u]) for u in utts))
    write_table(root / "utt2spk", ((u, utt2spk[u]) for u in utts))
    spk2utt = group_by_speaker(utts, utt2spk)
    write_table(root / "spk2utt", sorted(spk2utt.items()))
    (root / "utt2num_samples").unlink(missing_ok=True)
    return len(spk2utt)
