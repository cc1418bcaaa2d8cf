"""Your own recordings as Kaldi data dirs: a folder tree (one subfolder per speaker) or a CSV list ->
`train/`, `val/` and `test/` with a speaker-disjoint split, and balanced trial lists for `val/` and `test/`.

    speakerlab-folder --root DIR --data OUT [--test-speakers auto] [--val-speakers auto] [--trials 20000]
    speakerlab-folder --csv FILE --data OUT [...]

Input:
  --root DIR  DIR/<speaker>/**/<file>: the first folder level names the speaker; anything below it is
              free. With --folder-sessions the folder right below the speaker is the session
              (DIR/<speaker>/<session>/**/<file>, e.g. one folder per recording day or video).
  --csv FILE  rows `path,speaker[,session]` (tab-separated when FILE ends in .tsv); relative paths are
              relative to FILE's folder. A first row whose path is no existing file and has no file
              extension (`path,speaker`, `file,spk`) is a header, and the log says so.
Audio: whatever soundfile reads (wav, flac, ogg, mp3, ...), any sample rate and channel count. Every
file is decoded once (--jobs processes) and left out, with its reason, when it is unreadable, empty,
shorter than --min-seconds, holds NaN/inf samples, or is all zeros; files that are not audio by their
extension are left out too. A speaker left with fewer than --min-utts files is left out. Every
left-out file gets a line `<path>: left out: <why>` in OUT/report.txt and the counts are printed:
nothing is dropped silently. WAV and FLAC at --sample-rate, mono, are used where they are; anything
else is converted to 16-bit WAV at --sample-rate (first channel kept: a `kept: ...` report line says
so) under OUT/audio/. A file whose path cannot be written in a list (whitespace, not UTF-8) is linked
from there.

Output under OUT:
  train/, val/, test/  wav.scp, utt2spk, spk2utt, utt2num_samples (+ utt2sess with sessions); val/trials and
                  test/trials (`enrol test target|nontarget`); no val/ when the split has no validation speakers
  sources.csv     utt,set,path,speaker,session: where every utterance came from
  report.txt      every input file that is not used, and why
Ids: a speaker's id is its name when that is made of [A-Za-z0-9_] (64 at most) and no other name
cleans to it; otherwise the cleaned name plus `_` and 8 hex digits of the name's SHA-1. Utterance ids
are `<speaker id>-<path below the speaker folder, / as ->` (CSV: the file name), cleaned the same way
(also `.` and `-` allowed). Spaces, unicode and equal file names in different folders all get
distinct, list-safe ids.

Split: --test-speakers and --val-speakers (the validation speakers, on which training picks its best
epoch): auto (sizes for a measurable EER when the data allows: speakerlab.datasets.split), a count or a
fraction in (0, 1); test at least 2, validation 0 or at least 2; drawn with --seed (the test speakers do
not depend on --val-speakers). Trials: --trials N per held-out split, half target (two utterances of a
speaker; from different sessions when sessions are given) and as many nontarget (two speakers), drawn
without repetition; when fewer target pairs exist all of them are used, with as many nontarget ones. A
held-out split too small to measure an EER (speakerlab.dataio.tables.trials.MIN_SPEAKERS) gets a warning line.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.lists import ListError, write_table
from speakerlab.dataio.tables.trials import too_few_to_measure
from speakerlab.datasets.common import DatasetError, write_data_dir
from speakerlab.datasets.download import log
from speakerlab.datasets.filecheck import check_all, listable
from speakerlab.datasets.folder.scan import UTT_BAD, Item, assign_ids, read_csv, safe_ids, scan_tree
from speakerlab.datasets.split import make_trials, split_speakers
from speakerlab.outputs import OutputError, folder_problem, output_file


def _held_out(least: int):
    """The type of --test-speakers (least 2) and --val-speakers (least 0): auto (None), a count >= least or a
    fraction in (0, 1)."""

    def parse(text: str) -> Optional[float]:
        if text == "auto":
            return None
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not (0 < value < 1 or (value >= least and value == int(value))):
            raise argparse.ArgumentTypeError(f"must be auto, a count >= {least} or a fraction in (0, 1), got {text!r}")
        return value

    return parse


def _counts(lines: Iterable[str]) -> str:
    """'unreadable 2, too short 5' from report lines `<path>: left out: <reason> (...)`."""
    reasons = Counter(line.split(": left out: ", 1)[1].split(" (")[0] for line in lines if ": left out: " in line)
    return ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()))


def prepare(
    out,
    root=None,
    csv_path=None,
    test_speakers: Optional[float] = None,
    val_speakers: Optional[float] = None,
    trials: int = 20000,
    min_seconds: float = 1.0,
    min_utts: int = 2,
    sample_rate: int = 16000,
    folder_sessions: bool = False,
    seed: int = 0,
    jobs: int = 4,
) -> None:
    """Write OUT/{train,val,test} (see the module docstring) from `root` (a folder tree) or `csv_path`."""
    out = Path(out).resolve()
    problem = folder_problem(out)
    if problem is None and not listable(str(out)):
        problem = (
            f"{out} holds whitespace or is not UTF-8: the lists name the converted and linked files under it, "
            "and a Kaldi list cannot hold such a path"
        )
    if problem:
        raise DatasetError(f"--data: {problem}; choose another folder")
    if root is not None:
        items, report = scan_tree(root, folder_sessions, exclude=out)
        sessions_given = folder_sessions
        if not items:
            raise DatasetError(f"{root}: no audio files in speaker folders (expected {root}/<speaker>/<file>)")
    else:
        (items, sessions_given), report = read_csv(csv_path), []
    spk_ids, utt_ids = assign_ids(items)
    audio = out / "audio"
    audio.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = check_all([(it.path, str(audio / u), sample_rate, min_seconds) for it, u in zip(items, utt_ids)], jobs)
    for it, r in zip(items, results):
        if r.problem:
            report.append(f"{it.path}: {r.problem}")
        elif r.note:
            report.append(f"{it.path}: {r.note}")
    kept = _enough_per_speaker(items, results, set(spk_ids), min_utts, report)
    _remove_stale(audio, {results[i].use for i in kept})
    how = Counter(results[i].how for i in kept)
    left = sum(": left out: " in line for line in report)
    log(
        f"{len(kept) + left} files, {len(items)} of them audio, read in {time.time() - t0:.0f} s: {len(kept)} used "
        f"({how['as is']} as they are, {how['converted']} converted to {sample_rate} Hz mono WAV, {how['linked']} "
        f"linked under {audio}), {left} left out ({_counts(report) or 'none'}); see {out / 'report.txt'}"
    )
    _write_lines(out / "report.txt", sorted(report))
    by_spk: Dict[str, List[int]] = defaultdict(list)
    for i in kept:
        by_spk[spk_ids[items[i].speaker]].append(i)
    split = split_speakers(sorted(by_spk), test_speakers, seed, val_speakers)
    log(
        f"speakers: {len(split[0])} train, {len(split[1])} val, {len(split[2])} test (--test-speakers "
        f"{'auto' if test_speakers is None else f'{test_speakers:g}'}, --val-speakers "
        f"{'auto' if val_speakers is None else f'{val_speakers:g}'})"
    )
    sessions = None
    if sessions_given:  # list-safe session ids, as for speakers
        session_ids = safe_ids({s: s or "none" for s in {items[i].session for i in kept}}, UTT_BAD)
        sessions = {utt_ids[i]: session_ids[items[i].session] for i in kept}
    if not split[1] and (out / "val").is_dir():
        shutil.rmtree(out / "val")  # an earlier run's validation split, not this one's
    sets = {}
    for name, speakers in zip(("train", "val", "test"), split):
        if not speakers:
            continue
        idx = [i for s in speakers for i in by_spk[s]]
        sets.update((i, name) for i in idx)
        d = out / name
        write_data_dir(
            d, {utt_ids[i]: results[i].use for i in idx}, {utt_ids[i]: spk_ids[items[i].speaker] for i in idx}
        )
        write_table(d / "utt2num_samples", sorted((utt_ids[i], results[i].samples) for i in idx))
        if sessions is not None:
            write_table(d / "utt2sess", sorted((utt_ids[i], sessions[utt_ids[i]]) for i in idx))
        if name != "train":
            _write_trials(d, {s: sorted(utt_ids[i] for i in by_spk[s]) for s in speakers}, sessions, trials, seed)
    _write_sources(out / "sources.csv", items, utt_ids, sets)


def _write_trials(d: Path, spk2utt: Dict[str, List[str]], sessions, trials: int, seed: int) -> None:
    """`d`/trials of a held-out split, said in one line, with a warning line when it is too small to measure an
    EER (speakerlab.dataio.tables.trials.MIN_SPEAKERS)."""
    try:
        rows, note = make_trials(spk2utt, sessions, trials, seed)
    except DatasetError as e:
        raise DatasetError(f"{d}: {e}") from None
    if note:
        log(f"{d / 'trials'}: {note}")
    write_table(d / "trials", ((a, (b, "target" if t else "nontarget")) for a, b, t in rows))
    n_target = sum(t for _, _, t in rows)
    log(f"{d / 'trials'}: {len(rows)} trials ({n_target} target{', cross-session' if sessions else ''})")
    lacking = too_few_to_measure(len(spk2utt), n_target)
    if lacking:
        use = "the EER measured on it" if d.name == "test" else "model selection on it"
        log(f"warning: {d / 'trials'}: {lacking}; {use} is coarse (docs/custom_data.md, 'How sure is the EER')")


def _enough_per_speaker(items, results, speakers: set, min_utts: int, report: List[str]) -> List[int]:
    """Indices of the usable files of speakers with at least `min_utts` of them; the others' files get
    report lines, and every speaker left out is said."""
    usable: Dict[str, List[int]] = defaultdict(list)
    for i, r in enumerate(results):
        if not r.problem:
            usable[items[i].speaker].append(i)
    for spk in sorted(speakers - set(usable)):
        log(f"speaker {spk!r}: no usable file; left out")
    kept = []
    for spk, idx in sorted(usable.items()):
        if len(idx) >= min_utts:
            kept += idx
            continue
        log(f"speaker {spk!r}: {len(idx)} usable file(s), fewer than --min-utts {min_utts}; left out")
        why = f"left out: speaker with too few files ({spk!r}: {len(idx)} < --min-utts {min_utts})"
        report.extend(f"{items[i].path}: {why}" for i in idx)
    return kept


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    with output_file(path, errors="surrogateescape") as f:
        f.writelines(line + "\n" for line in lines)


def _write_sources(path: Path, items: Sequence[Item], utt_ids: Sequence[str], sets: Dict[int, str]) -> None:
    """utt,set,path,speaker,session of every used item (`sets`: item index -> train, val or test)."""
    with output_file(path, errors="surrogateescape", newline="") as f:
        w = csv.writer(f)
        w.writerow(["utt", "set", "path", "speaker", "session"])
        for i in sorted(sets, key=lambda i: utt_ids[i]):
            it = items[i]
            w.writerow([utt_ids[i], sets[i], it.path, it.speaker, it.session])


def _remove_stale(audio: Path, used: set) -> None:
    """Conversions and links of an earlier run that this one does not use (a file since removed)."""
    for p in audio.iterdir():
        if str(p) not in used:
            p.unlink()


def main(argv=None) -> int:
    ap = CommandParser(
        prog="speakerlab-folder",
        description=__doc__,
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--root", help="folder tree DIR/<speaker>/**/<audio file>")
    src.add_argument("--csv", dest="csv_path", metavar="CSV", help="CSV (or .tsv) with rows path,speaker[,session]")
    ap.add_argument(
        "--data",
        dest="out",
        metavar="DATA",
        required=True,
        help="output folder: train/, val/, test/, report.txt, sources.csv, audio/",
    )
    ap.add_argument(
        "--test-speakers", type=_held_out(2), help="auto (the default: split.py), a count >= 2 or a fraction in (0, 1)"
    )
    ap.add_argument(
        "--val-speakers", type=_held_out(0), help="validation split: auto (the default), 0 (none), a count, a fraction"
    )
    ap.add_argument("--trials", type=int, default=20000, help="trials of test/trials and val/trials, half target")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="shorter files are left out")
    ap.add_argument("--min-utts", type=int, default=2, help="speakers with fewer usable files are left out")
    ap.add_argument("--sample-rate", type=int, default=16000, help="rate of the lists; other rates are converted")
    ap.add_argument("--folder-sessions", action="store_true", help="the folder below each speaker is a session")
    ap.add_argument("--seed", type=int, default=0, help="of the speaker split and the trials")
    ap.add_argument("--jobs", type=int, default=4, help="processes reading (and converting) the audio")
    args = ap.parse_args(argv)
    for name in ("trials", "min_utts", "jobs"):
        if getattr(args, name) < (2 if name != "jobs" else 1):
            ap.error(f"--{name.replace('_', '-')} must be >= {2 if name != 'jobs' else 1}, got {getattr(args, name)}")
    if args.folder_sessions and args.csv_path:
        ap.error("--folder-sessions goes with --root (a CSV gives sessions in its third column)")
    # Every option is a keyword of `prepare`, under the same name.
    return run_command(lambda: prepare(**vars(args)), (DatasetError, ListError, OutputError))


if __name__ == "__main__":
    sys.exit(main())
