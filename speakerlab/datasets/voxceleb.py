"""VoxCeleb1 (wav) and VoxCeleb2 dev (m4a -> 16 kHz wav) as Kaldi data dirs, with Vox1-O/E/H trials.

    speakerlab-voxceleb download [--parts vox1 vox2] [--download-dir D] [--archive-dir A]
                                                    [--mirror URL] [--url NAME=URL] [--user U]
    speakerlab-voxceleb extract  [--parts vox1 vox2] [--raw-dir R]
    speakerlab-voxceleb convert  [--raw-dir R] [--jobs N]     # VoxCeleb2: needs ffmpeg
    speakerlab-voxceleb prepare  [--raw-dir R] [--data DATA] [--parts vox1 vox2]

Layout under R once extracted and converted:
  voxceleb1/dev/wav/<spk>/<video>/<n>.wav   from vox1_dev_wav.zip (vox1_dev_wav_parta[a-d] joined)
  voxceleb1/test/wav/<spk>/<video>/<n>.wav  from vox1_test_wav.zip
  voxceleb1/meta/                           veri_test2.txt, list_test_all2.txt, list_test_hard2.txt
  voxceleb2/dev/aac/<spk>/<video>/<n>.m4a   from vox2_aac.zip (vox2_dev_aac_parta[a-h] joined)
  voxceleb2/dev/wav/<spk>/<video>/<n>.wav   written by `convert` (16 kHz mono PCM)

Data dirs under DATA (utterance id `<spk>-<video>-<n>`, e.g. id10270-x6uYqmx31kE-00001):
  vox1_dev    VoxCeleb1 dev (1,211 speakers, 148,642 utterances)
  vox1_test   VoxCeleb1 test (40 speakers, 4,874 utterances); `trials` and trials_vox1_o_clean: Vox1-O
              (cleaned), for models trained on vox1_dev
  vox1        both, for the lists that use dev speakers: trials_vox1_o_clean, trials_vox1_e_clean,
              trials_vox1_h_clean (Vox1-O, Vox1-E, Vox1-H, all cleaned)
  vox2_dev    VoxCeleb2 dev (5,994 speakers, 1,092,009 utterances), the usual training set
Official trial lines `1 id10270/x6uYqmx31kE/00001.wav id10270/8jEAjG6SegY/00008.wav` become
`id10270-x6uYqmx31kE-00001 id10270-8jEAjG6SegY-00008 target` (0 -> nontarget).

The VoxCeleb hosts have moved over the years and may ask for the credentials given out through the
dataset's request form: pass --user (password in $SPEAKERLAB_DOWNLOAD_PASSWORD), point --mirror or
--url at where the files are now, or fetch them yourself and pass --archive-dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from speakerlab.datasets.common import (
    CorpusCommand,
    DatasetError,
    check_count,
    convert_trial_list,
    prefix_speakers,
    require_dir,
    write_data_dir,
)
from speakerlab.datasets.download import Archive, Part, log
from speakerlab.outputs import OutputError, output_path

VGG = "https://thor.robots.ox.ac.uk/~vgg/data/voxceleb/vox1a"  # archives (historical official host)
META = "https://mm.kaist.ac.kr/datasets/voxceleb/meta"  # trial lists (current official host)

PARTS: Dict[str, Tuple[Archive, ...]] = {
    "vox1": (
        Archive(
            "vox1_dev_wav.zip",
            "ae63e55b951748cc486645f532ba230b",
            VGG,
            parts=tuple(Part(f"vox1_dev_wav_parta{c}") for c in "abcd"),
            dest="voxceleb1/dev",
        ),
        Archive("vox1_test_wav.zip", "185fdc63c3c739954633d50379a3d102", VGG, dest="voxceleb1/test"),
        Archive("veri_test2.txt", None, META, dest="voxceleb1/meta"),
        Archive("list_test_all2.txt", None, META, dest="voxceleb1/meta"),
        Archive("list_test_hard2.txt", None, META, dest="voxceleb1/meta"),
    ),
    "vox2": (
        Archive(
            "vox2_aac.zip",
            "bbc063c46078a602ca71605645c2a402",
            VGG,
            parts=tuple(Part(f"vox2_dev_aac_parta{c}") for c in "abcdefgh"),
            dest="voxceleb2",
        ),
    ),
}

# trial list name -> (official file, published number of lines)
TRIALS = {
    "vox1_o_clean": ("veri_test2.txt", 37611),
    "vox1_e_clean": ("list_test_all2.txt", 579818),
    "vox1_h_clean": ("list_test_hard2.txt", 550894),
}
# data dir -> (speakers, utterances) of the published corpus
PUBLISHED = {"vox1_dev": (1211, 148642), "vox1_test": (40, 4874), "vox2_dev": (5994, 1092009)}

FFMPEG_HELP = (
    "ffmpeg is needed to decode the VoxCeleb2 m4a (AAC) files and was not found on PATH. Install it, "
    "e.g. Debian/Ubuntu: sudo apt-get install ffmpeg; Fedora: sudo dnf install ffmpeg; "
    "conda: conda install -c conda-forge ffmpeg; macOS: brew install ffmpeg; "
    "or pass --ffmpeg /path/to/ffmpeg"
)


def walk(root, ext: str) -> List[Tuple[str, str, str]]:
    """Files `<root>/<spk>/<video>/<stem><ext>` -> sorted [(spk, video, stem)]."""
    out = []
    for spk in os.scandir(root):
        if not spk.is_dir():
            continue
        for video in os.scandir(spk.path):
            if not video.is_dir():
                continue
            out.extend(
                (spk.name, video.name, f.name[: -len(ext)])
                for f in os.scandir(video.path)
                if f.name.endswith(ext) and f.is_file()
            )
    return sorted(out)


def scan(root, ext: str = ".wav") -> Dict[str, str]:
    """`<root>/<spk>/<video>/<n><ext>` -> {`<spk>-<video>-<n>`: absolute path}."""
    root = os.path.abspath(root)
    return {f"{s}-{v}-{n}": os.path.join(root, s, v, n + ext) for s, v, n in walk(root, ext)}


def utt_id(rel: str, where: str) -> str:
    """`id10270/x6uYqmx31kE/00001.wav` -> `id10270-x6uYqmx31kE-00001`."""
    parts = rel.rsplit(".", 1)[0].split("/")
    if len(parts) != 3:
        raise DatasetError(f"{where}: expected a path like id10270/x6uYqmx31kE/00001.wav, got {rel!r}")
    return "-".join(parts)


def convert_trials(src, dst, utts) -> int:
    """Official `1|0 path path` list -> `enrol test target|nontarget` with utterance ids."""

    def read(f, where):
        if len(f) != 3:
            raise DatasetError(f"{where}: expected '1|0 <enrol path> <test path>', got {' '.join(f)!r}")
        return utt_id(f[1], where), utt_id(f[2], where), f[0]

    return convert_trial_list(src, dst, set(utts), read)


def _check(name: str, wav: Dict[str, str]) -> None:
    spk, utt = PUBLISHED[name]
    check_count(f"{name} speakers", len(set(prefix_speakers(wav).values())), spk)
    check_count(f"{name} utterances", len(wav), utt)


def prepare(raw_dir, data, parts: Sequence[str] = ("vox1", "vox2"), vox2_wav_dir=None) -> None:
    """Write the data dirs of the docstring for the chosen parts; missing folders raise naming them."""
    raw, data = Path(raw_dir), Path(data)
    hint = "run `speakerlab-voxceleb extract --parts {}` (or check --raw-dir)"
    if "vox1" in parts:
        dev = scan(require_dir(raw / "voxceleb1/dev/wav", hint.format("vox1")))
        test = scan(require_dir(raw / "voxceleb1/test/wav", hint.format("vox1")))
        both = {**dev, **test}
        if len(both) != len(dev) + len(test):
            raise DatasetError(
                f"utterance {sorted(set(dev) & set(test))[0]} is in both {raw / 'voxceleb1/dev'} "
                f"and {raw / 'voxceleb1/test'}"
            )
        _check("vox1_dev", dev)
        _check("vox1_test", test)
        for name, wav in (("vox1_dev", dev), ("vox1_test", test), ("vox1", both)):
            write_data_dir(data / name, wav)
        meta = require_dir(raw / "voxceleb1/meta", hint.format("vox1"))
        for name, (official, published) in TRIALS.items():
            check_count(
                f"trials {name}", convert_trials(meta / official, data / "vox1" / f"trials_{name}", both), published
            )
        for name in ("trials", "trials_vox1_o_clean"):  # `trials` for the index stage, the other for recipes
            convert_trials(meta / TRIALS["vox1_o_clean"][0], data / "vox1_test" / name, test)
    if "vox2" in parts:
        wav_root = Path(vox2_wav_dir) if vox2_wav_dir else raw / "voxceleb2/dev/wav"
        wav = scan(require_dir(wav_root, "run `speakerlab-voxceleb convert` first (needs ffmpeg)"))
        m4a_root = raw / "voxceleb2/dev/aac"
        if m4a_root.is_dir():
            n_m4a = len(walk(m4a_root, ".m4a"))
            if n_m4a != len(wav):
                log(
                    f"warning: {m4a_root} has {n_m4a} m4a files but {wav_root} has {len(wav)} wav files; "
                    f"re-run the convert step to finish the conversion"
                )
        _check("vox2_dev", wav)
        write_data_dir(data / "vox2_dev", wav)


def _convert_one(job: Tuple[str, str, str]) -> Optional[str]:
    """ffmpeg one m4a to 16 kHz mono 16-bit wav (speakerlab.outputs.output_path: written beside and renamed, so never
    half-done); None, or why it failed."""
    ffmpeg, src, dst = job
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    args = ["-nostdin", "-v", "error", "-y", "-i", src, "-vn", "-ac", "1", "-ar", "16000", "-acodec", "pcm_s16le"]
    try:
        with output_path(dst) as tmp:
            r = subprocess.run([ffmpeg, *args, "-f", "wav", str(tmp)], capture_output=True, text=True)
            if r.returncode != 0 or not tmp.is_file():
                raise DatasetError(f"{src}: ffmpeg exit {r.returncode}: {r.stderr.strip()[-300:]}")
    except (DatasetError, OutputError) as e:
        return str(e)
    return None


def convert(raw_dir, jobs: int = 8, ffmpeg: str = "ffmpeg", src=None, dst=None) -> int:
    """Convert every VoxCeleb2 m4a without a wav yet, in `jobs` processes; returns how many.

    Defaults: `<raw>/voxceleb2/dev/aac` -> `<raw>/voxceleb2/dev/wav`, same relative paths.
    """
    exe = shutil.which(ffmpeg)
    if exe is None:
        raise DatasetError(FFMPEG_HELP)
    src = require_dir(
        src or Path(raw_dir) / "voxceleb2/dev/aac",
        "run `speakerlab-voxceleb extract --parts vox2` first",
    )
    dst = Path(dst or Path(raw_dir) / "voxceleb2/dev/wav")
    files = walk(src, ".m4a")
    todo = [(exe, os.path.join(src, s, v, n + ".m4a"), os.path.join(dst, s, v, n + ".wav")) for s, v, n in files]
    todo = [job for job in todo if not os.path.isfile(job[2])]
    log(f"converting {len(todo)} of {len(files)} m4a files to {dst} with {jobs} processes")
    errors = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for i, err in enumerate(pool.map(_convert_one, todo, chunksize=64), 1):
            if err:
                errors.append(err)
            if i % 20000 == 0:
                log(f"converted {i}/{len(todo)}")
    if errors:
        raise DatasetError(f"{len(errors)} of {len(todo)} conversions failed; first: {errors[0]}")
    return len(todo)


def main(argv=None) -> int:
    cli = CorpusCommand("speakerlab-voxceleb", __doc__, PARTS)
    p = cli.prepare(
        "write the Kaldi data dirs and trial lists",
        lambda a: prepare(a.raw_dir, a.data, a.parts, a.vox2_wav_dir),
        parts=True,
    )
    p.add_argument(
        "--vox2-wav-dir",
        default=None,
        help="converted VoxCeleb2 dev wav tree <spk>/<video>/<n>.wav (default <raw>/voxceleb2/dev/wav)",
    )
    p = cli.step(
        "convert",
        "VoxCeleb2 m4a -> 16 kHz wav with ffmpeg, in a process pool",
        lambda a: log(f"converted {convert(a.raw_dir, a.jobs, a.ffmpeg)} files"),
    )
    p.add_argument("--raw-dir", default="data/raw", help="where the extract step unpacked the corpus")
    p.add_argument("--jobs", type=int, default=8, help="ffmpeg processes at once")
    p.add_argument("--ffmpeg", default="ffmpeg", help="ffmpeg executable (name on PATH or path)")
    return cli.run(argv)


if __name__ == "__main__":
    sys.exit(main())
