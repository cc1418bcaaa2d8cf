"""Prepare a data dir for training: validate the lists, check every audio file, index lengths.

    speakerlab-prepare --data data/train [--data data/test ...]

Trial lists (`trials*`) are parsed as scoring will parse them (`speakerlab.dataio.tables.trials`): every id must be
in wav.scp. Writes `spk2utt` (when missing, or when it disagrees with utt2spk: it is utt2spk inverted, and a
run after the lists changed replaces the one an earlier run wrote) and `utt2num_samples` (so training never
decodes headers at start-up, and crops can be drawn without opening files), and training's compact lists
`.compact/` (speakerlab.dataio.tables.compact: a start-up maps them instead of parsing millions of lines).
Every problem is reported, with file and line, before anything is written. This is its own recipe stage:
multi-GPU training then starts from prepared lists and no rank waits on another's preparation.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.audio import AudioError, audio_info
from speakerlab.dataio.tables.compact import read_compact
from speakerlab.dataio.tables.lists import (
    DataDir,
    ListError,
    check_spk2utt,
    group_by_speaker,
    load_data_dir,
    write_table,
)
from speakerlab.dataio.tables.trials import IdIndex, read_trial_list


def index_lengths(data: DataDir, sample_rate: int = 16000, jobs: int = 4) -> Dict[str, int]:
    """Read every file's header: {utt: samples}. All unusable files (wrong rate or channels,
    unreadable) are reported in one ListError naming wav.scp and the line of each."""

    def info(utt):
        try:
            return utt, audio_info(data.wav[utt], sample_rate), None
        except AudioError as e:
            return utt, 0, f"  {data.root / 'wav.scp'}:{data.wav_line[utt]}: {e}"

    with ThreadPoolExecutor(max_workers=jobs) as pool:  # header reads are I/O-bound
        results = list(pool.map(info, data.utts))
    problems = [p for _, _, p in results if p]
    if problems:
        raise ListError(f"{len(problems)} unusable audio file(s) in {data.root}:\n" + "\n".join(problems[:50]))
    return {u: n for u, n, _ in results}


def prepare(data_dir, sample_rate: int = 16000, jobs: int = 4) -> str:
    """Validate `data_dir` and write its index files; returns a one-line summary."""
    root = Path(data_dir)
    # spk2utt and utt2num_samples are this stage's own outputs: read from an earlier run over other lists, they would
    # refuse the run that rewrites them.
    data = load_data_dir(root, need_speakers=(root / "utt2spk").exists(), derived=False)
    if not data.utts:  # nothing to train on, embed or score: stop at the stage that prepares it
        raise ListError(f"{root / 'wav.scp'}: no utterances in it (an empty wav.scp)")
    data.check_audio_exists()
    lengths = index_lengths(data, sample_rate, jobs)
    index = IdIndex(data.utts, str(root / "wav.scp"))
    for trials in sorted(root.glob("trials*")):  # `trials`, and the recipes' `trials_<name>` lists
        read_trial_list(trials, index, lacking=f"not in {root / 'wav.scp'}")
    write_table(root / "utt2num_samples", sorted(lengths.items()))
    if data.utt2spk and _stale_spk2utt(root / "spk2utt", data.utt2spk):
        write_table(root / "spk2utt", sorted(group_by_speaker(data.utts, data.utt2spk).items()))
    read_compact(
        root
    )  # training's compact lists, read once here (speakerlab.dataio.tables.compact): its starts map them
    hours = sum(lengths.values()) / sample_rate / 3600
    speakers = f"{len(data.speakers)} speakers" if data.utt2spk else "unlabelled (no utt2spk)"
    return f"{root}: {len(data.utts)} utterances, {speakers}, {hours:.2f} h"


def _stale_spk2utt(path: Path, utt2spk: Dict[str, str]) -> bool:
    """True when `path` is missing or is not utt2spk inverted (said on stderr: it is then written again from it)."""
    if not path.exists():
        return True
    try:
        check_spk2utt(path, utt2spk)
    except ListError as e:
        print(f"prepare: {path} is written again from utt2spk, which it disagreed with ({e})", file=sys.stderr)
        return True
    return False


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-prepare", description=__doc__.split("\n")[0])
    ap.add_argument("--data", action="append", required=True, help="data dir (repeatable)")
    ap.add_argument("--sample-rate", type=int, default=16000, help="the rate every file must have")
    ap.add_argument("--jobs", type=int, default=4, help="threads reading audio headers")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")

    def work():
        for d in args.data:
            print(f"prepare: {prepare(d, args.sample_rate, args.jobs)}", file=sys.stderr)

    return run_command(work, (ListError,))


if __name__ == "__main__":
    sys.exit(main())
