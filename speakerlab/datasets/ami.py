"""The AMI meeting corpus, scored by the AMI-diarization-setup protocol, as diarization data dirs.

    speakerlab-ami prepare --ami-root A --setup S [--subsets dev test] [--condition sdm] [--data DATA]

Nothing is downloaded: the audio comes from the AMI corpus site (https://groups.inf.ed.ac.uk/ami/download/,
the `amicorpus` folder as its download script lays it out), the protocol from a checkout of
https://github.com/BUTSpeechFIT/AMI-diarization-setup (or pyannote's fork of it, whose
pyannote/download_ami.sh fetches the headset mix of every meeting). A, the amicorpus folder (or the folder
holding it), has per meeting
  <meeting>/audio/<meeting>.Mix-Headset.wav    --condition headset: the mix of the headset microphones
  <meeting>/audio/<meeting>.Array1-01.wav      --condition sdm: the first channel of the first table array
both 16 kHz mono. S, the setup, holds
  lists/{train,dev,test}.meetings.txt          one meeting id per line (136, 18, 16 meetings), e.g. ES2004a
  only_words/rttms/<subset>/<meeting>.rttm     the reference: the words of the manual annotation, a speaker's
                                               adjacent words merged (word_and_vocalsounds/: with vocal sounds)
  uems/<subset>/<meeting>.uem                  `<meeting> 1 0.000 <end>`: the whole recording is scored
Data dirs DATA/ami_<condition>_<subset>, one meeting per line, for speakerlab-diarize and speakerlab-der:
  wav.scp        `<meeting> <audio path>`      rttm       every reference turn of the subset's meetings
  reco2num_spk   `<meeting> <speakers>`        uem        the setup's UEM lines
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Sequence

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.audio import sf
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.rttm import read_rttm, read_uem, rttm_lines, uem_lines
from speakerlab.datasets.common import DatasetError, check_count, iter_list, require_dir, require_file
from speakerlab.datasets.download import log
from speakerlab.outputs import OutputError, check_folder_output, write_lines

CONDITIONS = {"headset": "Mix-Headset", "sdm": "Array1-01"}  # --condition -> the audio file's middle name
ANNOTATIONS = ("only_words", "word_and_vocalsounds")
MEETINGS = {"train": 136, "dev": 18, "test": 16}  # the setup's lists
MEETING_ID = re.compile(r"[A-Z]{2}\d{4}[a-z]?")  # ES2004a, IS1009d, TS3003b, EN2002c, IB4001
SETUP_HINT = "is --setup a checkout of github.com/BUTSpeechFIT/AMI-diarization-setup?"


def read_meetings(path: Path) -> List[str]:
    """A setup list (`lists/<subset>.meetings.txt`: one meeting id per line) -> its ids in file order; a line that
    is not one id, or an id listed twice, raises naming file:line."""
    meetings: Dict[str, int] = {}
    for lineno, fields in iter_list(require_file(path, SETUP_HINT)):
        where = f"{path}:{lineno}"
        if len(fields) != 1 or not MEETING_ID.fullmatch(fields[0]):
            raise DatasetError(
                f"{where}: expected one AMI meeting id per line (e.g. ES2004a), got {' '.join(fields)!r}"
            )
        if fields[0] in meetings:
            raise DatasetError(f"{where}: meeting {fields[0]} is listed twice (first on line {meetings[fields[0]]})")
        meetings[fields[0]] = lineno
    if not meetings:
        raise DatasetError(f"{path}: no meetings")
    return list(meetings)


def corpus_dir(ami_root) -> Path:
    """The amicorpus folder: --ami-root itself, or its `amicorpus` subfolder (where the download scripts put it)."""
    root = require_dir(ami_root, "--ami-root must be the amicorpus folder of the AMI audio (or the folder holding it)")
    return root / "amicorpus" if (root / "amicorpus").is_dir() else root


def _one_meeting(table: Dict, meeting: str, path: Path) -> List:
    """`table` (read from `path`, a file of one meeting) -> its entries; a file naming another recording raises."""
    other = sorted(set(table) - {meeting})
    if other:
        raise DatasetError(f"{path}: holds recording '{other[0]}', expected only '{meeting}'")
    return table.get(meeting, [])


def prepare_subset(
    corpus: Path, setup: Path, subset: str, condition: str, out: Path, annotations: str = "only_words"
) -> str:
    """The meetings of the setup's `subset` list in `condition` (headset | sdm) -> the data dir `out` (see the
    module docstring); returns a summary."""
    meetings = read_meetings(setup / "lists" / f"{subset}.meetings.txt")
    rttm_dir = require_dir(setup / annotations / "rttms" / subset, SETUP_HINT)
    uem_dir = require_dir(setup / "uems" / subset, SETUP_HINT)
    name = CONDITIONS[condition]
    missing = [m for m in meetings if not (corpus / m / "audio" / f"{m}.{name}.wav").is_file()]
    if missing:  # all of them counted before any is read: a partial download is one message
        raise DatasetError(
            f"no such file: {corpus / missing[0] / 'audio' / f'{missing[0]}.{name}.wav'} (--condition {condition}: "
            f"{len(missing)} of the {len(meetings)} {subset} meetings lack their {name}.wav)"
        )
    scp: List[str] = []
    turns: List[str] = []
    counts: List[str] = []
    uem: List[str] = []
    for meeting in sorted(meetings):
        wav = corpus / meeting / "audio" / f"{meeting}.{name}.wav"
        sf.info(str(wav))  # a file that is not audio stops here, not in stage 4
        rttm = require_file(rttm_dir / f"{meeting}.rttm", SETUP_HINT)
        ref = _one_meeting(read_rttm(rttm), meeting, rttm)
        scored = require_file(uem_dir / f"{meeting}.uem", SETUP_HINT)
        regions = _one_meeting(read_uem(scored), meeting, scored)
        scp.append(f"{meeting} {wav.resolve()}")
        turns += rttm_lines(meeting, ref)
        counts.append(f"{meeting} {max(1, len({t.speaker for t in ref}))}")
        uem += uem_lines(meeting, regions)
    check_count(f"AMI {subset} meetings", len(meetings), MEETINGS[subset])  # after the checks: a refusal is one line
    for file, lines in (("wav.scp", scp), ("rttm", turns), ("reco2num_spk", counts), ("uem", uem)):
        write_lines(out / file, lines)
    summary = f"{out}: {len(scp)} meetings ({condition}: {name}.wav), {len(turns)} turns ({annotations})"
    log(summary)
    return summary


def prepare(ami_root, setup, data, subsets: Sequence[str], condition: str, annotations: str = "only_words") -> None:
    corpus = corpus_dir(ami_root)
    setup = require_dir(setup, SETUP_HINT)
    for subset in subsets:
        prepare_subset(corpus, setup, subset, condition, Path(data) / f"ami_{condition}_{subset}", annotations)


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-ami", description=__doc__)
    sub = ap.add_subparsers(dest="step", required=True)
    text = "write the diarization data dirs (wav.scp, rttm, reco2num_spk, uem)"
    p = sub.add_parser("prepare", help=text, description=text)
    p.add_argument("--ami-root", required=True, help="the amicorpus folder (<meeting>/audio/*.wav), or its parent")
    p.add_argument("--setup", required=True, help="a checkout of AMI-diarization-setup (lists/, only_words/, uems/)")
    p.add_argument("--data", default="data", help="output folder for the data dirs ami_<condition>_<subset>")
    p.add_argument("--subsets", nargs="+", choices=sorted(MEETINGS), default=["dev", "test"], help="which lists")
    p.add_argument(
        "--condition", choices=sorted(CONDITIONS), default="sdm", help="headset: Mix-Headset.wav; sdm: Array1-01.wav"
    )
    p.add_argument("--annotations", choices=ANNOTATIONS, default="only_words", help="which reference of the setup")
    args = ap.parse_args(argv)

    def work():
        check_folder_output(args.data)
        try:
            prepare(args.ami_root, args.setup, args.data, args.subsets, args.condition, args.annotations)
        except RuntimeError as e:  # soundfile's errors on a broken wav (a DatasetError keeps its message)
            raise DatasetError(str(e)) from None

    return run_command(work, (DatasetError, ListError, OutputError))


if __name__ == "__main__":
    sys.exit(main())
