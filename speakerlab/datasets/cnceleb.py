"""CN-Celeb1 + CN-Celeb2 (16 kHz flac) as Kaldi data dirs, with the CN-Celeb1 evaluation trials.

    speakerlab-cnceleb download [--parts cnceleb1 cnceleb2] [--download-dir D]
                                                   [--archive-dir A] [--mirror URL]
    speakerlab-cnceleb extract  [--parts cnceleb1 cnceleb2] [--raw-dir R]
    speakerlab-cnceleb prepare  [--raw-dir R] [--data DATA] [--parts cnceleb1 cnceleb2]

OpenSLR 82 archives, unpacked into R: cn-celeb_v2.tar.gz (CN-Celeb1) and cn-celeb2_v2.tar.gz
(cn-celeb2_v2.tar.gza[a-c] joined):
  CN-Celeb_flac/data/<spk>/<genre>-<session>-<n>.flac      every CN-Celeb1 utterance
  CN-Celeb_flac/dev/dev.lst                                the CN-Celeb1 training speakers (797)
  CN-Celeb_flac/eval/enroll/<spk>-enroll.flac              one enrolment file per evaluation speaker
  CN-Celeb_flac/eval/test/<spk>-<genre>-<session>-<n>.flac the test utterances
  CN-Celeb_flac/eval/lists/enroll.lst                      `id00800-enroll enroll/id00800-enroll.wav`
  CN-Celeb_flac/eval/lists/test.lst                        `test/id00800-singing-01-005.wav`
  CN-Celeb_flac/eval/lists/trials.lst                      `id00800-enroll test/id00800-singing-01-005.wav 1`
  CN-Celeb2_flac/data/<spk>/*.flac, CN-Celeb2_flac/spk.lst CN-Celeb2 (1,996 speakers, all training)
The lists name files `.wav` (the first release was wav); each is resolved to the file present.

Data dirs under DATA (the flac files are read directly; nothing is converted):
  cnceleb_train  CN-Celeb1 dev.lst speakers + CN-Celeb2, 2,793 speakers; utterance `<spk>-<file stem>`
  cnceleb_eval   `<spk>-enroll` enrolment utterances and `<spk>-<genre>-<session>-<n>` test utterances;
                 `trials_cnceleb1` = the CN-Celeb1 evaluation list (196 enrolments x 17,777 tests = 3,484,292)

Enrolment: in the official protocol a speaker is enrolled with the concatenation of his or her
enrolment utterances, and the release ships exactly that concatenation as eval/enroll/<spk>-enroll
(enroll.lst). So each enrolment is one ordinary utterance here, embedded whole by the extract stage,
and a trial line compares it with a test utterance: `id00800-enroll id00800-singing-01-005 target`.
(Averaging per-utterance embeddings of the enroll.map utterances instead, which some toolkits also
report, would need a scorer that averages; it is not done here.)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path, PurePosixPath
from typing import Dict, Sequence

from speakerlab.datasets.common import (
    CorpusCommand,
    DatasetError,
    check_count,
    convert_trial_list,
    iter_list,
    require_dir,
    write_data_dir,
)
from speakerlab.datasets.download import Archive, Part

OPENSLR = "https://www.openslr.org/resources/82"
PARTS = {
    "cnceleb1": (Archive("cn-celeb_v2.tar.gz", "7ab1b214028a7439e26608b2d5a0336c", OPENSLR),),
    "cnceleb2": (
        Archive(
            "cn-celeb2_v2.tar.gz",
            "55c47cf0b6d0bf793e88bf79d5dfc660",
            OPENSLR,
            parts=tuple(Part(f"cn-celeb2_v2.tar.gza{c}") for c in "abc"),
        ),
    ),
}
PUBLISHED = {
    "cnceleb1 dev speakers": 797,
    "cnceleb2 speakers": 1996,
    "enrolments": 196,
    "test utterances": 17777,
    "trials": 3484292,
}
AUDIO_EXT = (".flac", ".wav")
HINT = "run `speakerlab-cnceleb extract --parts {}` (or check --raw-dir)"


def resolve(base: Path, rel: str, where: str) -> Path:
    """`base/rel`, or the same name with the other audio extension; DatasetError naming it if neither exists."""
    p = base / rel
    for candidate in [p] + [p.with_suffix(ext) for ext in AUDIO_EXT if ext != p.suffix]:
        if candidate.is_file():
            return candidate
    raise DatasetError(f"{where}: {p} does not exist (nor as {' / '.join(AUDIO_EXT)})")


def speaker_utts(corpus: Path, spk_list: Path) -> Dict[str, str]:
    """Utterances of the speakers in `spk_list`, from `corpus/data/<spk>/` -> {`<spk>-<stem>`: path}."""
    wav: Dict[str, str] = {}
    for lineno, f in iter_list(spk_list):
        spk = f[0]
        folder = require_dir(corpus / "data" / spk, f"speaker listed at {spk_list}:{lineno}")
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            stem, ext = os.path.splitext(entry.name)
            if ext in AUDIO_EXT and entry.is_file():
                wav.setdefault(f"{spk}-{stem}", os.path.abspath(entry.path))  # flac sorts before wav
    return wav


def prepare_train(raw: Path, data: Path, parts: Sequence[str]) -> None:
    """DATA/cnceleb_train from the CN-Celeb1 dev speakers and/or CN-Celeb2."""
    wav: Dict[str, str] = {}
    for part, corpus, spk_list, name in (
        ("cnceleb1", "CN-Celeb_flac", "dev/dev.lst", "cnceleb1 dev speakers"),
        ("cnceleb2", "CN-Celeb2_flac", "spk.lst", "cnceleb2 speakers"),
    ):
        if part not in parts:
            continue
        root = require_dir(raw / corpus, HINT.format(part))
        utts = speaker_utts(root, root / spk_list)
        spks = {u.split("-", 1)[0] for u in utts}
        check_count(name, len(spks), PUBLISHED[name])
        clash = spks & {u.split("-", 1)[0] for u in wav}
        if clash:
            raise DatasetError(
                f"speaker id {sorted(clash)[0]} of {root / spk_list} is also a CN-Celeb1 speaker; "
                f"the two corpora would be merged wrongly"
            )
        wav.update(utts)
    write_data_dir(data / "cnceleb_train", wav)


def prepare_eval(raw: Path, data: Path) -> None:
    """DATA/cnceleb_eval: enrolment and test utterances plus the official trials."""
    ev = require_dir(raw / "CN-Celeb_flac" / "eval", HINT.format("cnceleb1"))
    lists = require_dir(ev / "lists", HINT.format("cnceleb1"))
    wav: Dict[str, str] = {}
    for lineno, f in iter_list(lists / "enroll.lst", 2):
        wav[f[0]] = str(resolve(ev, f[1], f"{lists / 'enroll.lst'}:{lineno}"))
    n_enrol = len(wav)
    test_ids: Dict[str, str] = {}  # token as the lists write it -> utterance id
    for lineno, f in iter_list(lists / "test.lst"):
        token = f[-1]
        uid = PurePosixPath(token).stem
        wav[uid] = str(resolve(ev, token, f"{lists / 'test.lst'}:{lineno}"))
        test_ids[token] = uid
    check_count("cnceleb_eval enrolments", n_enrol, PUBLISHED["enrolments"])
    check_count("cnceleb_eval test utterances", len(test_ids), PUBLISHED["test utterances"])
    out = data / "cnceleb_eval"
    write_data_dir(out, wav)

    def read(f, where):
        return f[0], test_ids.get(f[1]) or PurePosixPath(f[1]).stem, f[2]

    n = convert_trial_list(lists / "trials.lst", out / "trials_cnceleb1", set(wav), read)
    check_count("cnceleb_eval trials", n, PUBLISHED["trials"])


def prepare(raw_dir, data, parts: Sequence[str] = ("cnceleb1", "cnceleb2")) -> None:
    """Write the data dirs of the docstring (cnceleb_eval needs CN-Celeb1)."""
    raw, data = Path(raw_dir), Path(data)
    prepare_train(raw, data, parts)
    if "cnceleb1" in parts:
        prepare_eval(raw, data)


def main(argv=None) -> int:
    cli = CorpusCommand("speakerlab-cnceleb", __doc__, PARTS)
    cli.prepare(
        "write the Kaldi data dirs and the trial list", lambda a: prepare(a.raw_dir, a.data, a.parts), parts=True
    )
    return cli.run(argv)


if __name__ == "__main__":
    sys.exit(main())
