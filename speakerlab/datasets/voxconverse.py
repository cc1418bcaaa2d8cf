"""VoxConverse (speaker diarization of debates and news clips) as diarization data dirs.

    speakerlab-voxconverse download [--parts dev test annotations] [--download-dir D] [--archive-dir A]
    speakerlab-voxconverse extract  [--raw-dir R]
    speakerlab-voxconverse prepare  [--raw-dir R] [--data DATA] [--sets dev test]

Archives (https://www.robots.ox.ac.uk/~vgg/data/voxconverse/; no md5 is published): voxconverse_dev_wav.zip
(216 recordings) and voxconverse_test_wav.zip (232), and the annotations, version 0.3: the master branch
of github.com/joonson/voxconverse as master.zip. All are unpacked into R/voxconverse, which then holds
  audio/<id>.wav                       dev audio (16 kHz mono)
  voxconverse_test_wav/<id>.wav        test audio
  voxconverse-master/{dev,test}/<id>.rttm   one reference RTTM per recording
Data dirs under DATA (voxconverse_dev, voxconverse_test), one recording per line, for speakerlab-diarize
and speakerlab-der:
  wav.scp        `<id> <audio path>`            rttm       every reference turn
  reco2num_spk   `<id> <speakers>`              uem        `<id> 1 0.000 <duration>`: each file whole
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Sequence

from speakerlab.dataio.audio import sf
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.rttm import read_rttm, rttm_lines, uem_lines
from speakerlab.datasets.common import CorpusCommand, DatasetError, check_count, require_dir
from speakerlab.datasets.download import Archive, log
from speakerlab.outputs import write_lines

VGG = "https://www.robots.ox.ac.uk/~vgg/data/voxconverse/data"
ANNOTATIONS = "https://github.com/joonson/voxconverse/archive/refs/heads"
PARTS = {
    "dev": (Archive("voxconverse_dev_wav.zip", None, VGG, dest="voxconverse"),),
    "test": (Archive("voxconverse_test_wav.zip", None, VGG, dest="voxconverse"),),
    "annotations": (Archive("master.zip", None, ANNOTATIONS, dest="voxconverse"),),
}
AUDIO_DIRS = {"dev": "audio", "test": "voxconverse_test_wav"}
RECORDINGS = {"dev": 216, "test": 232}


def prepare_set(root: Path, name: str, out: Path) -> str:
    """R/voxconverse's `name` set -> the data dir `out` (see the module docstring); returns a summary."""
    rttm_dir = require_dir(root / "voxconverse-master" / name, "is master.zip (the annotations) extracted?")
    audio_dir = require_dir(root / AUDIO_DIRS[name], f"is voxconverse_{name}_wav.zip extracted?")
    scp: List[str] = []
    turns: List[str] = []
    counts: List[str] = []
    uem: List[str] = []
    missing: List[Path] = []
    for path in sorted(rttm_dir.glob("*.rttm")):
        reco = path.stem
        ref: Dict = read_rttm(path)
        if set(ref) - {reco}:
            raise DatasetError(f"{path}: holds recording '{sorted(set(ref) - {reco})[0]}', expected only '{reco}'")
        wav = audio_dir / f"{reco}.wav"
        if not wav.is_file():
            missing.append(wav)
            continue
        info = sf.info(str(wav))
        scp.append(f"{reco} {wav.resolve()}")
        turns += rttm_lines(reco, ref.get(reco, []))
        counts.append(f"{reco} {max(1, len({t.speaker for t in ref.get(reco, [])}))}")
        uem += uem_lines(reco, [(0.0, info.frames / info.samplerate)])
    if missing:
        raise DatasetError(
            f"{len(missing)} recording(s) annotated in {rttm_dir} have no audio, e.g. {missing[0]}; "
            f"is voxconverse_{name}_wav.zip fully extracted into {root}?"
        )
    if not scp:
        raise DatasetError(f"{rttm_dir}: no .rttm files")
    check_count(f"voxconverse_{name} recordings", len(scp), RECORDINGS[name])
    for file, lines in (("wav.scp", scp), ("rttm", turns), ("reco2num_spk", counts), ("uem", uem)):
        write_lines(out / file, lines)
    summary = f"{out}: {len(scp)} recordings, {len(turns)} turns"
    log(summary)
    return summary


def prepare(raw_dir, data, sets: Sequence[str] = ("dev", "test")) -> None:
    root = require_dir(Path(raw_dir) / "voxconverse", "run `speakerlab-voxconverse extract` (or check --raw-dir)")
    for name in sets:
        prepare_set(root, name, Path(data) / f"voxconverse_{name}")


def main(argv=None) -> int:
    cli = CorpusCommand("speakerlab-voxconverse", __doc__, PARTS)

    def do_prepare(a):
        try:
            prepare(a.raw_dir, a.data, a.sets)
        except (RuntimeError, ListError) as e:  # soundfile's errors on a broken wav
            raise DatasetError(str(e)) from None

    p = cli.prepare("write the diarization data dirs (wav.scp, rttm, reco2num_spk, uem)", do_prepare)
    p.add_argument(
        "--sets", nargs="+", choices=sorted(AUDIO_DIRS), default=["dev", "test"], help="which sets to prepare"
    )
    return cli.run(argv)


if __name__ == "__main__":
    sys.exit(main())
