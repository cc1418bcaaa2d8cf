"""MUSAN and RIRS_NOISES: download, extract, and the augmentation lists.

    speakerlab-musan-rirs download [--parts musan rirs] [--download-dir D] [--archive-dir A]
    speakerlab-musan-rirs extract  [--parts musan rirs] [--raw-dir R]
    speakerlab-musan-rirs prepare  [--raw-dir R] [--out DATA/musan_rirs]
                                                      [--rooms smallroom mediumroom largeroom]

OpenSLR 17 (musan.tar.gz) and OpenSLR 28 (rirs_noises.zip), unpacked into R:
  musan/{noise,music,speech}/<source>/*.wav                     (plus ANNOTATIONS / LICENSE files)
  RIRS_NOISES/simulated_rirs/<size>room/RoomNNN/RoomNNN-NNNNN.wav
  RIRS_NOISES/simulated_rirs/<size>room/rir_list   `--rir-id ID --room-id ROOM RIRS_NOISES/simulated_rirs/...wav`
The synthetic corpus of egs/mini (`speakerlab-synth --out DIR`) writes the same tree, so
`prepare --raw-dir DIR` works on it too.

`prepare` writes four `<id> <absolute path>` lists (sorted) into --out:
  noise.scp   MUSAN noise        id = file stem, e.g. noise-free-sound-0000
  music.scp   MUSAN music        e.g. music-fma-0000
  babble.scp  MUSAN speech (summed into babble by the augmentation), e.g. speech-librivox-0000
  rirs.scp    simulated RIRs from the rir_list of each chosen room size, id = its --rir-id
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Sequence

from speakerlab.dataio.tables.lists import write_table
from speakerlab.datasets.common import CorpusCommand, DatasetError, check_count, iter_list, require_dir
from speakerlab.datasets.download import Archive, log

PARTS = {
    "musan": (Archive("musan.tar.gz", "0c472d4fc0c5141eca47ad1ffeb2a7df", "https://openslr.elda.org/resources/17"),),
    "rirs": (Archive("rirs_noises.zip", "e6f48e257286e05de56413b4779d8ffb", "https://us.openslr.org/resources/28"),),
}
MUSAN_LISTS = {"noise.scp": "noise", "music.scp": "music", "babble.scp": "speech"}
ROOMS = ("smallroom", "mediumroom", "largeroom")
# Published sizes, checked as warnings: MUSAN file counts per category, and the simulated RIRs
# (3 room sizes x 200 rooms x 100 RIRs).
PUBLISHED = {"noise": 930, "music": 660, "speech": 426, "rirs": 60000}
HINT = "run `speakerlab-musan-rirs extract --parts {}` (or check --raw-dir)"


def musan_files(folder: Path) -> Dict[str, str]:
    """Every .wav under `folder` -> {file stem: absolute path}; MUSAN stems are unique by design."""
    out: Dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".wav"):
                continue
            stem, path = name[:-4], os.path.abspath(os.path.join(dirpath, name))
            if stem in out:
                raise DatasetError(f"two MUSAN files share the id '{stem}': {out[stem]} and {path}")
            out[stem] = path
    if not out:
        raise DatasetError(f"no .wav files under {folder}")
    return out


def read_rir_list(path: Path, base: Path) -> Dict[str, str]:
    """A RIRS_NOISES rir_list -> {rir id: absolute path}; paths in it are relative to `base`
    (the folder holding RIRS_NOISES). Missing audio raises naming the list line."""
    out: Dict[str, str] = {}
    for lineno, f in iter_list(path, 2):
        where = f"{path}:{lineno}"
        if "--rir-id" not in f or f.index("--rir-id") + 1 >= len(f):
            raise DatasetError(f"{where}: no --rir-id in {' '.join(f)!r}")
        rid, rel = f[f.index("--rir-id") + 1], f[-1]
        audio = base / rel
        if not audio.is_file():
            raise DatasetError(f"{where}: {audio} does not exist")
        if rid in out:
            raise DatasetError(f"{where}: duplicate rir id '{rid}'")
        out[rid] = os.path.abspath(audio)
    return out


def prepare(raw_dir, out, rooms: Sequence[str] = ROOMS) -> Dict[str, int]:
    """Write noise.scp, music.scp, babble.scp, rirs.scp into `out`; returns their line counts."""
    raw, out = Path(raw_dir), Path(out)
    musan = require_dir(raw / "musan", HINT.format("musan"))
    sim = require_dir(raw / "RIRS_NOISES" / "simulated_rirs", HINT.format("rirs"))
    lists = {}
    for name, category in MUSAN_LISTS.items():
        lists[name] = musan_files(require_dir(musan / category, HINT.format("musan")))
        check_count(f"MUSAN {category} files", len(lists[name]), PUBLISHED[category])
    rirs: Dict[str, str] = {}
    for room in rooms:
        rir_list = require_dir(sim / room, HINT.format("rirs")) / "rir_list"
        for rid, path in read_rir_list(rir_list, raw).items():
            if rid in rirs:
                raise DatasetError(f"{rir_list}: rir id '{rid}' also appears in another room size")
            rirs[rid] = path
    if tuple(rooms) == ROOMS:
        check_count("simulated RIRs", len(rirs), PUBLISHED["rirs"])
    lists["rirs.scp"] = rirs
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, table in lists.items():
        write_table(out / name, sorted(table.items()))
        counts[name] = len(table)
    log(f"{out}: " + ", ".join(f"{name} {n}" for name, n in counts.items()))
    return counts


def main(argv=None) -> int:
    cli = CorpusCommand("speakerlab-musan-rirs", __doc__, PARTS)
    out = ("--out", "data/musan_rirs", "output folder for the lists")
    p = cli.prepare(
        "write noise.scp, music.scp, babble.scp, rirs.scp", lambda a: prepare(a.raw_dir, a.out, a.rooms), out
    )
    p.add_argument(
        "--rooms",
        nargs="+",
        choices=ROOMS,
        default=list(ROOMS),
        help="simulated room sizes whose RIRs are listed (default: all three)",
    )
    return cli.run(argv)


if __name__ == "__main__":
    sys.exit(main())
