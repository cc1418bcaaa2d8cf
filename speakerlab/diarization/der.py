"""`speakerlab-der`: diarization error rate of RTTMs against a reference, with pyannote.metrics.

    speakerlab-der --ref data/conv/rttm --hyp estimated=exp/diar/hyp.rttm --hyp oracle_count=exp/diar/oracle.rttm \
        --uem data/conv/uem --out exp/diar/der.json

For each system and each of the four conditions (collar 0.25 s and 0 s; overlapped speech scored or
skipped) it prints the DER and its parts, in % of the scored reference speech: missed speech, false alarm
and speaker confusion (pyannote.metrics' `DiarizationErrorRate`, accumulated over every recording of the
reference: sums of durations, not a mean of per-file rates). A collar of c seconds leaves c on each side
of every reference boundary unscored. A reference recording a system has no turns for counts as all
missed. The scored region of a recording is its `--uem` entry, else 0 to the last turn of either side.
It also says how many recordings got the reference's number of speakers, and, where overlap is scored, the
missed overlapped speech: the missed speech within the stretches where the reference has two or more speakers, in
% of the reference speech there (speaker time: a stretch of two speakers counts twice; the same collar). A system
that gives one speaker per instant misses about half of it.

Exit codes: 0 done; 2 bad input (a message naming the file and line).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.rttm import Interval, Turn, read_rttm, read_uem
from speakerlab.inference.common import warn_stderr
from speakerlab.outputs import OutputError, check_path_output, is_special, write_lines

CONDITIONS = ((0.25, False), (0.25, True), (0.0, False), (0.0, True))  # (collar, skip overlap)
PARTS = ("missed detection", "false alarm", "confusion")


def _pyannote():
    try:
        from pyannote.core import Annotation, Segment, Timeline
        from pyannote.metrics.diarization import DiarizationErrorRate
    except ImportError as e:
        raise ImportError(
            f"DER scoring needs pyannote.metrics ({e}): pip install -e '.[diarization]' in the speakerlab clone "
            "(the torch-free install: pip install './runtime[diarization]')"
        ) from None
    return Annotation, Segment, Timeline, DiarizationErrorRate


def annotation(reco: str, turns: Sequence[Turn]):
    Annotation, Segment, _, _ = _pyannote()
    out = Annotation(uri=reco)
    for i, t in enumerate(turns):
        if t.end > t.start:
            out[Segment(t.start, t.end), str(i)] = t.speaker
    return out


def der(
    ref: Dict[str, List[Turn]],
    hyp: Dict[str, List[Turn]],
    uem: Optional[Dict[str, List[Interval]]] = None,
    collar: float = 0.25,
    skip_overlap: bool = False,
) -> Dict[str, float]:
    """DER and its parts over every reference recording: {'der', 'missed detection', 'false alarm',
    'confusion'} as fractions of 'total' (scored reference speech, seconds)."""
    _, Segment, Timeline, DiarizationErrorRate = _pyannote()
    metric = DiarizationErrorRate(collar=collar, skip_overlap=skip_overlap)
    sums = dict.fromkeys(("total", *PARTS), 0.0)
    for reco, turns in sorted(ref.items()):
        theirs = hyp.get(reco, [])
        if uem is not None and reco in uem:
            scored = uem[reco]
        else:
            scored = [(0.0, max((t.end for t in [*turns, *theirs]), default=0.0))]
        detail = metric(
            annotation(reco, turns),
            annotation(reco, theirs),
            uem=Timeline([Segment(s, e) for s, e in scored if e > s], uri=reco),
            detailed=True,
        )
        for key in sums:
            sums[key] += detail[key]
    total = max(sums["total"], 1e-9)
    return {"der": sum(sums[p] for p in PARTS) / total, **{p: sums[p] / total for p in PARTS}, "total": sums["total"]}


def overlap_missed(
    ref: Dict[str, List[Turn]], hyp: Dict[str, List[Turn]], uem: Optional[Dict[str, List[Interval]]], collar: float
) -> Tuple[float, float]:
    """(missed speech within the reference's overlapped stretches as a fraction of the reference speech there,
    that speech in seconds): the DER's missed detection scored on those stretches alone (module docstring)."""
    _, Segment, Timeline, DiarizationErrorRate = _pyannote()
    metric = DiarizationErrorRate(collar=collar)
    missed = total = 0.0
    for reco, turns in sorted(ref.items()):
        theirs = hyp.get(reco, [])
        scored = uem[reco] if uem is not None and reco in uem else [(0.0, max(t.end for t in [*turns, *theirs]))]
        region = annotation(reco, turns).get_overlap().crop(Timeline([Segment(s, e) for s, e in scored if e > s]))
        if not region:
            continue
        detail = metric(annotation(reco, turns), annotation(reco, theirs), uem=region, detailed=True)
        missed, total = missed + detail["missed detection"], total + detail["total"]
    return missed / max(total, 1e-9), total


def count_agreement(ref: Dict[str, List[Turn]], hyp: Dict[str, List[Turn]]) -> Tuple[int, float]:
    """(recordings whose speaker count equals the reference's, mean |count error|)."""
    errors = [abs(len({t.speaker for t in hyp.get(r, [])}) - len({t.speaker for t in ts})) for r, ts in ref.items()]
    return sum(e == 0 for e in errors), sum(errors) / max(len(errors), 1)


def score(ref_path, systems: Sequence[Tuple[str, str]], uem_path=None) -> dict:
    """{system: {'conditions': [...], 'count_right', 'count_error', 'recordings'}} for `(name, rttm)` systems."""
    ref = read_rttm(ref_path)
    if not ref:
        raise ListError(f"{ref_path}: no SPEAKER lines")
    uem = read_uem(uem_path) if uem_path else None
    unscored = [] if uem is None else sorted(set(ref) - set(uem))
    if unscored:  # scoring them whole would not be what the UEM says, leaving them out not what the user asked
        raise ListError(
            f"{uem_path}: no entry for recording '{unscored[0]}' of the reference ({len(unscored)} lack one)"
        )
    out = {}
    for name, path in systems:
        hyp = read_rttm(path)
        extra = sorted(set(hyp) - set(ref))
        if extra:
            raise ListError(f"{path}: recording '{extra[0]}' is not in the reference {ref_path}")
        silent = sorted(set(ref) - set(hyp))
        if silent:  # a system finds no speech in a recording, or its RTTM is of part of the set: say which
            warn_stderr(
                f"{path}: no turns for {len(silent)} of the reference's {len(ref)} recordings (scored as missed "
                f"speech), e.g. '{silent[0]}'"
            )
        right, error = count_agreement(ref, hyp)
        conditions = [
            {"collar": collar, "skip_overlap": skip, **der(ref, hyp, uem, collar, skip)} for collar, skip in CONDITIONS
        ]
        if conditions[0]["total"] <= 0:  # DER is a share of the scored reference speech: of none it is undefined
            where = f"{uem_path} (UEM) on {ref_path}" if uem_path else str(ref_path)
            raise ListError(f"{where}: no reference speech in the scored regions: the DER is undefined")
        for c in conditions:
            if not c["skip_overlap"]:
                c["overlap_missed"], c["overlap_total"] = overlap_missed(ref, hyp, uem, c["collar"])
        out[name] = {"rttm": str(path), "recordings": len(ref), "count_right": right, "count_error": error}
        out[name]["conditions"] = conditions
    return out


def table(results: dict) -> List[str]:
    """The printed lines: one per system and condition."""
    lines = [
        f"{'system':<22} {'collar':>6} {'overlap':>8} {'DER%':>7} {'miss%':>7} {'FA%':>6} {'conf%':>6} "
        f"{'speech s':>9} {'ovl miss%':>9}  speaker count right"
    ]
    for name, r in results.items():
        for c in r["conditions"]:
            lines.append(
                f"{name:<22} {c['collar']:>6.2f} {'skipped' if c['skip_overlap'] else 'scored':>8} "
                f"{100 * c['der']:>7.2f} {100 * c['missed detection']:>7.2f} {100 * c['false alarm']:>6.2f} "
                f"{100 * c['confusion']:>6.2f} {c['total']:>9.1f} "
                f"{100 * c['overlap_missed'] if 'overlap_missed' in c else float('nan'):>9.2f}  "
                f"{r['count_right']}/{r['recordings']} (mean |error| {r['count_error']:.2f})"
            )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = CommandParser(
        prog="speakerlab-der",
        description="DER (missed, false alarm, confusion) of RTTMs against a reference, with pyannote.metrics.",
    )
    ap.add_argument("--ref", required=True, help="reference RTTM")
    ap.add_argument(
        "--hyp",
        action="append",
        required=True,
        metavar="[NAME=]RTTM",
        help="a system's RTTM (repeatable); NAME defaults to the file's stem",
    )
    ap.add_argument("--uem", help="NIST UEM: the scored part of each recording (none: 0 to the last turn)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    systems = [tuple(h.split("=", 1)) if "=" in h else (Path(h).stem, h) for h in args.hyp]
    names = [name for name, _ in systems]
    if "" in names:
        ap.error("--hyp =RTTM: give the system a name, NAME=RTTM, or the RTTM alone (its stem names it)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        ap.error(f"two --hyp are named '{twice[0]}': give them names, NAME=RTTM")

    def work() -> None:
        if args.out and not is_special(args.out):  # a device takes the JSON through (as /dev/stdout); a folder cannot
            check_path_output(args.out)
        results = score(args.ref, systems, args.uem)
        print("\n".join(table(results)))
        if args.out:
            write_lines(args.out, [json.dumps(results, indent=1)])

    return run_command(work, (ListError, ImportError, OSError, OutputError))


if __name__ == "__main__":
    sys.exit(main())
