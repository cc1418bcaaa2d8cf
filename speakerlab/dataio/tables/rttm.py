"""The files of diarization: RTTM (who spoke when), Kaldi `segments` (where speech is), `reco2num_spk`
(speakers per recording) and NIST UEM (the scored part of each recording).

    turns = read_rttm("ref.rttm")            # {recording: [Turn(start, end, speaker), ...]} in file order
    speech = read_speech("ref.rttm")         # {recording: [(start, end), ...]}: the union of its turns
    speech = read_speech("data/segments")    # or Kaldi `<segment> <recording> <start> <end>` lines
    write_lines("hyp.rttm", rttm_lines("conv0001", turns))   # speakerlab.outputs.write_lines
    write_lines("uem", uem_lines("conv0001", [(0.0, 61.5)]))

RTTM lines: `SPEAKER <recording> <channel> <onset> <duration> <NA> <NA> <speaker> <NA> <NA>`, times in
seconds; only SPEAKER lines are read (other types, e.g. SPKR-INFO, are skipped). Every reader raises
`ListError` naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

from speakerlab.dataio.tables.lists import ListError, read_table

Interval = Tuple[float, float]


@dataclass(frozen=True)
class Turn:
    """One speaker talking from `start` to `end` (seconds)."""

    start: float
    end: float
    speaker: str


def _number(token: str, what: str, where: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ListError(f"{where}: {what} must be a number, got {token!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ListError(f"{where}: {what} must be a finite number >= 0, got {token!r}")
    return value


def _text_lines(path: Path):
    """(line number, fields) of the non-empty, non-comment lines; ListError if missing or not text."""
    if not path.is_file():
        raise ListError(f"{path}: file does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ListError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            yield lineno, fields


def read_rttm(path) -> Dict[str, List[Turn]]:
    """RTTM -> {recording: [Turn, ...]} in file order. A SPEAKER line needs 8 fields or more."""
    path = Path(path)
    out: Dict[str, List[Turn]] = {}
    for lineno, f in _text_lines(path):
        where = f"{path}:{lineno}"
        if f[0] != "SPEAKER":
            continue
        if len(f) < 8:
            raise ListError(f"{where}: an RTTM SPEAKER line has at least 8 fields, got {len(f)}: {' '.join(f)!r}")
        start = _number(f[3], "the onset", where)
        duration = _number(f[4], "the duration", where)
        out.setdefault(f[1], []).append(Turn(start, start + duration, f[7]))
    return out


def rttm_lines(recording: str, turns: Iterable[Turn]) -> List[str]:
    """RTTM SPEAKER lines of one recording (times to the millisecond), without newlines."""
    return [f"SPEAKER {recording} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {t.speaker} <NA> <NA>" for t in turns]


def uem_lines(recording: str, regions: Iterable[Interval]) -> List[str]:
    """NIST UEM lines `<recording> 1 <start> <end>` of one recording's scored regions (seconds, to the millisecond)."""
    return [f"{recording} 1 {start:.3f} {end:.3f}" for start, end in regions]


def merge_intervals(intervals: Iterable[Interval]) -> List[Interval]:
    """The union of `(start, end)` intervals, sorted and disjoint (touching ones joined)."""
    out: List[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def read_speech(path) -> Dict[str, List[Interval]]:
    """Speech regions per recording from an RTTM (the union of its turns) or a Kaldi `segments` file
    (`<segment> <recording> <start> <end>`); the first line tells which (SPEAKER, or 8 fields or more, the first an
    upper-case RTTM type such as SPKR-INFO: RTTM; a short SPEAKER line is then an error naming it)."""
    path = Path(path)
    first = next(_text_lines(path), None)
    if first is not None and (first[1][0] == "SPEAKER" or (len(first[1]) >= 8 and first[1][0].isupper())):
        return {r: merge_intervals((t.start, t.end) for t in ts) for r, ts in read_rttm(path).items()}
    regions: Dict[str, List[Interval]] = {}
    for seg, (lineno, f) in read_table(path, 4, 4).items():
        where = f"{path}:{lineno}"
        start, end = _number(f[1], "the start", where), _number(f[2], "the end", where)
        if end <= start:
            raise ListError(f"{where}: segment '{seg}' ends ({end}) before it starts ({start})")
        regions.setdefault(f[0], []).append((start, end))
    return {r: merge_intervals(v) for r, v in regions.items()}


def read_reco2num_spk(path) -> Dict[str, int]:
    """`<recording> <number of speakers>` lines -> {recording: n}; n must be an integer >= 1."""
    out = {}
    for reco, (lineno, f) in read_table(path, 2, 2).items():
        if not f[0].isdigit() or int(f[0]) < 1:
            raise ListError(
                f"{path}:{lineno}: the number of speakers of '{reco}' must be an integer >= 1, got {f[0]!r}"
            )
        out[reco] = int(f[0])
    return out


def read_uem(path) -> Dict[str, List[Interval]]:
    """NIST UEM `<recording> <channel> <start> <end>` lines -> {recording: [(start, end), ...]}."""
    path = Path(path)
    out: Dict[str, List[Interval]] = {}
    for lineno, f in _text_lines(path):
        where = f"{path}:{lineno}"
        if len(f) != 4:
            raise ListError(f"{where}: a UEM line is '<recording> <channel> <start> <end>', got {' '.join(f)!r}")
        start, end = _number(f[2], "the start", where), _number(f[3], "the end", where)
        if end <= start:  # dropped, it left its recording nothing scored: a DER of 0 % over 0 s
            raise ListError(f"{where}: the region of '{f[0]}' ends ({end}) before it starts ({start})")
        out.setdefault(f[0], []).append((start, end))
    return {r: merge_intervals(v) for r, v in out.items()}
