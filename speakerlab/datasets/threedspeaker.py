"""The 3D-Speaker corpus (multi-Device, multi-Distance, multi-Dialect) as Kaldi data dirs.

    speakerlab-3dspeaker download [--download-dir D] [--archive-dir A] [--mirror URL]
    speakerlab-3dspeaker extract  [--raw-dir R]
    speakerlab-3dspeaker prepare  [--raw-dir R] [--data DATA] [--keep-device09]

Archives (https://3dspeaker.github.io/): train.tar.gz (train.tar.gz-part-[a-f] joined), test.tar.gz
and 3dspeaker_files.tar.gz, all unpacked into R/3dspeaker, which then holds
  train/..., test/...                            the audio
  files/{train,test}_wav.scp                     `<utt> <audio path relative to R/3dspeaker>`
  files/{train,test}_utt2spk                     `<utt> <speaker>`
  files/trials_cross_{device,distance,dialect}   `<enrol utt> <test utt> <1|0|target|nontarget>`
Data dirs under DATA:
  3dspeaker_train   training set
  3dspeaker_test    test set, with trials_cross_device, trials_cross_distance, trials_cross_dialect
Utterances recorded by Device09 are left out, as the 3D-Speaker recipes do (--keep-device09 keeps
them). An utterance id that does not already start with its speaker id is renamed `<spk>-<utt>`
(trials follow the same renaming), so that sorted lists keep each speaker's utterances together.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Tuple

from speakerlab.datasets.common import (
    CorpusCommand,
    DatasetError,
    check_count,
    convert_trial_list,
    iter_list,
    require_dir,
    require_file,
    write_data_dir,
)
from speakerlab.datasets.download import Archive, Part, log

OSS = "https://speech-lab-share-data.oss-cn-shanghai.aliyuncs.com/3D-Speaker"
_TRAIN_PART_MD5 = {
    "a": "4109addde41d88760947263f18117ac3",
    "b": "5a17ef2fa28b1b9e340277edffb8b51c",
    "c": "bd2ce08f5b51005b66afe484b01a4a59",
    "d": "5cd31d961d2d5211aea38b8b95f7239a",
    "e": "58f3fb7d28ae7f4b65ee35a1ed7ab106",
    "f": "be64551c030e8087562a10df2c74ccb1",
}
PARTS = {
    "3dspeaker": (
        Archive(
            "train.tar.gz",
            "c2cea55fd22a2b867d295fb35a2d3340",
            OSS,
            dest="3dspeaker",
            parts=tuple(Part(f"train.tar.gz-part-{c}", m) for c, m in _TRAIN_PART_MD5.items()),
        ),
        Archive("test.tar.gz", "45972606dd10d3f7c1c31f27acdfbed7", OSS, dest="3dspeaker"),
        Archive("3dspeaker_files.tar.gz", None, OSS, dest="3dspeaker"),  # no md5 is published
    ),
}
TRIAL_LISTS = ("cross_device", "cross_distance", "cross_dialect")
TRAIN_SPEAKERS = 10000  # the speaker-classifier size of the 3D-Speaker training configs
EXCLUDED_DEVICE = "Device09"
_LABEL_TOKENS = {"1", "0", "target", "nontarget"}


def read_split(
    root: Path, split: str, keep_device09: bool = False
) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    """`files/<split>_wav.scp` + `<split>_utt2spk` -> (wav, utt2spk, rename).

    `wav` and `utt2spk` use the new ids; `rename` maps each official id that was kept to its new
    id. Every listed audio file must exist (an error names how many do not, and the first).
    """
    files = root / "files"
    scp = require_file(files / f"{split}_wav.scp", "is 3dspeaker_files.tar.gz extracted?")
    u2s = {f[0]: f[1] for _, f in iter_list(files / f"{split}_utt2spk", 2)}
    wav, spk, rename, dropped = {}, {}, {}, 0
    for lineno, f in iter_list(scp, 2):
        utt, rel = f[0], f[1]
        if not keep_device09 and (EXCLUDED_DEVICE in utt or EXCLUDED_DEVICE in rel):
            dropped += 1
            continue
        if utt not in u2s:
            raise DatasetError(f"{scp}:{lineno}: '{utt}' has no speaker in {files / f'{split}_utt2spk'}")
        s = u2s[utt]
        new = utt if utt.startswith(s) else f"{s}-{utt}"
        if new in wav:
            raise DatasetError(f"{scp}:{lineno}: duplicate utterance '{utt}'")
        wav[new], spk[new], rename[utt] = str(root / rel), s, new
    missing = [p for p in wav.values() if not os.path.isfile(p)]
    if missing:
        raise DatasetError(
            f"{len(missing)} audio file(s) listed in {scp} do not exist, e.g. {missing[0]}; "
            f"is {split}.tar.gz fully extracted into {root}?"
        )
    if dropped:
        log(f"{split}: left out {dropped} {EXCLUDED_DEVICE} utterances")
    return wav, spk, rename


def convert_trials(src: Path, dst: Path, rename: Dict[str, str], keep_device09: bool) -> int:
    """An official trials file -> `enrol test target|nontarget` over the renamed test utterances."""

    def read(f, where):
        # The label is expected last (where the 3D-Speaker scoring reads it); a `label enrol test` line,
        # the VoxCeleb order, is accepted too since both forms circulate.
        if f[2] in _LABEL_TOKENS or f[0] not in _LABEL_TOKENS:
            enrol, test, label = f[0], f[1], f[2]
        else:
            label, enrol, test = f[0], f[1], f[2]
        for u in (enrol, test):
            if u not in rename and EXCLUDED_DEVICE in u and not keep_device09:
                raise DatasetError(
                    f"{where}: '{u}' was recorded by {EXCLUDED_DEVICE}, which is left out; "
                    f"pass --keep-device09 to keep those utterances"
                )
        return rename.get(enrol, enrol), rename.get(test, test), label

    return convert_trial_list(src, dst, set(rename.values()), read)


def prepare(raw_dir, data, keep_device09: bool = False) -> None:
    """Write DATA/3dspeaker_train and DATA/3dspeaker_test (+ its three trial lists)."""
    root = require_dir(Path(raw_dir) / "3dspeaker", "run `speakerlab-3dspeaker extract` (or check --raw-dir)")
    # Audio folders are not checked by name: the lists say where each file is, and read_split
    # reports any listed file that is missing.
    data = Path(data)
    wav, spk, _ = read_split(root, "train", keep_device09)
    check_count("3dspeaker_train speakers", len(set(spk.values())), TRAIN_SPEAKERS)
    write_data_dir(data / "3dspeaker_train", wav, spk)
    wav, spk, rename = read_split(root, "test", keep_device09)
    write_data_dir(data / "3dspeaker_test", wav, spk)
    for name in TRIAL_LISTS:
        convert_trials(
            require_file(root / "files" / f"trials_{name}"),
            data / "3dspeaker_test" / f"trials_{name}",
            rename,
            keep_device09,
        )


def main(argv=None) -> int:
    cli = CorpusCommand("speakerlab-3dspeaker", __doc__, PARTS)
    p = cli.prepare("write the Kaldi data dirs and trial lists", lambda a: prepare(a.raw_dir, a.data, a.keep_device09))
    p.add_argument("--keep-device09", action="store_true", help=f"keep {EXCLUDED_DEVICE} utterances")
    return cli.run(argv)


if __name__ == "__main__":
    sys.exit(main())
