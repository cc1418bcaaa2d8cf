"""Fake corpora laid out like the published archives, shared by tests/test_datasets.py (tiny archives of
noise) and tests/test_recipes_e2e.py (the synthetic voices of speakerlab.synth re-packed into each
corpus's release layout), plus what running a recipe shell in a test needs."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- bytes of archives and audio


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def audio_bytes(fmt: str = "WAV", seconds: float = 0.2, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    x = 0.1 * np.random.default_rng(seed).standard_normal(int(16000 * seconds))
    sf.write(buf, x, 16000, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def reencode(path, fmt: str) -> bytes:
    """The audio of a file as `fmt` bytes (e.g. a synthetic wav as the FLAC CN-Celeb ships)."""
    x, sr = sf.read(str(path), dtype="int16")
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def zip_bytes(members: dict) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def tgz_bytes(members: dict) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def split(data: bytes, n: int) -> list:
    step = -(-len(data) // n)
    return [data[i * step : (i + 1) * step] for i in range(n)]


def with_md5(parts: dict, blobs: dict) -> dict:
    """A corpus PARTS table with the md5s of our fake files instead of the published ones."""

    def fix(a):
        return dataclasses.replace(
            a,
            md5=md5(blobs[a.name]) if a.md5 else None,
            parts=tuple(dataclasses.replace(p, md5=md5(blobs[p.name]) if p.md5 else None) for p in a.parts),
        )

    return {k: tuple(fix(a) for a in v) for k, v in parts.items()}


def serve(folder: Path, blobs: dict) -> str:
    """Write `blobs` into `folder`; returns the file:// mirror URL of that folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in blobs.items():
        (folder / name).write_bytes(data)
    return folder.as_uri()


# ---------------------------------------------------------------- the published layouts


def vox_archives(vox1_dev: dict, vox1_test: dict, vox2_dev: dict, lists: dict) -> dict:
    """VoxCeleb files: `vox1_dev`, `vox1_test` map `<spk>/<video>/<n>` to wav bytes, `vox2_dev` to m4a
    bytes, `lists` the trial-list file names to their text. The dev zips also come as their parts."""
    dev = zip_bytes({f"wav/{u}.wav": b for u, b in vox1_dev.items()})
    vox2 = zip_bytes({f"dev/aac/{u}.m4a": b for u, b in vox2_dev.items()})
    blobs = {
        "vox1_dev_wav.zip": dev,
        "vox1_test_wav.zip": zip_bytes({f"wav/{u}.wav": b for u, b in vox1_test.items()}),
        "vox2_aac.zip": vox2,
        **{name: text.encode() for name, text in lists.items()},
    }
    blobs.update({f"vox1_dev_wav_parta{c}": b for c, b in zip("abcd", split(dev, 4))})
    blobs.update({f"vox2_dev_aac_parta{c}": b for c, b in zip("abcdefgh", split(vox2, 8))})
    return blobs


VOX1_DEV = [
    "id10001/1zcIwhmdeo4/00001",
    "id10001/1zcIwhmdeo4/00002",
    "id10001/7w0IBEWc9Qw/00001",
    "id10002/0_laIeN-Q44/00001",
    "id10002/0_laIeN-Q44/00002",
]
VOX1_TEST = ["id10270/x6uYqmx31kE/00001", "id10270/8jEAjG6SegY/00008", "id10271/1gtz-CUIygI/00001"]
VOX2_DEV = ["id00012/21Uxsk56VDQ/00001", "id00012/21Uxsk56VDQ/00002", "id00015/0fijmz4vTVU/00001"]


def vox_blobs() -> dict:
    """The published VoxCeleb files in miniature: split zips with the real member layout, trial lists."""
    o = (
        "1 id10270/x6uYqmx31kE/00001.wav id10270/8jEAjG6SegY/00008.wav\n"
        "0 id10270/x6uYqmx31kE/00001.wav id10271/1gtz-CUIygI/00001.wav\n"
    )
    e = (
        "1 id10001/1zcIwhmdeo4/00001.wav id10001/7w0IBEWc9Qw/00001.wav\n"
        "0 id10001/1zcIwhmdeo4/00002.wav id10002/0_laIeN-Q44/00001.wav\n" + o
    )
    return vox_archives(
        {u: audio_bytes(seed=i) for i, u in enumerate(VOX1_DEV)},
        {u: audio_bytes(seed=10 + i) for i, u in enumerate(VOX1_TEST)},
        {u: b"not really aac" for u in VOX2_DEV},
        {"veri_test2.txt": o, "list_test_all2.txt": e, "list_test_hard2.txt": e},
    )


FAKE_FFMPEG = """#!{python}
import sys
import numpy as np, soundfile as sf
args = sys.argv[1:]
src, dst = args[args.index("-i") + 1], args[-1]
assert src.endswith(".m4a") and "-ar" in args and args[args.index("-ar") + 1] == "16000"
sf.write(dst, np.zeros(3200), 16000, format="WAV", subtype="PCM_16")
"""


def threedspeaker_archives(train: dict, test: dict, trials: dict) -> dict:
    """3D-Speaker files: `train`, `test` map speaker -> {official utterance id: wav bytes}, `trials` the
    three trial-list names (`trials_cross_device` ...) to their text. train.tar.gz also as its six parts."""
    members, files = {}, {}
    for split_name, spk_utts in (("train", train), ("test", test)):
        scp, u2s = [], []
        for spk, utts in spk_utts.items():
            for u, audio in utts.items():
                rel = f"{split_name}/{spk}/{u}.wav"
                members.setdefault(split_name, {})[rel] = audio
                scp.append(f"{u} {rel}\n")
                u2s.append(f"{u} {spk}\n")
        files[f"files/{split_name}_wav.scp"] = "".join(scp).encode()
        files[f"files/{split_name}_utt2spk"] = "".join(u2s).encode()
        files[f"files/{split_name}_utt2info.csv"] = b"utt,info\n"
    files.update({f"files/{name}": text.encode() for name, text in trials.items()})
    train_tgz = tgz_bytes(members["train"])
    blobs = {
        "train.tar.gz": train_tgz,
        "test.tar.gz": tgz_bytes(members["test"]),
        "3dspeaker_files.tar.gz": tgz_bytes(files),
    }
    blobs.update({f"train.tar.gz-part-{c}": b for c, b in zip("abcdef", split(train_tgz, 6))})
    return blobs


def threedspeaker_blobs() -> dict:
    # Speaker 1's ids already start with the speaker id, speaker 2's do not (they get a prefix);
    # one utterance per split comes from Device09, which the recipes leave out.
    train = {
        "S001": ["S001_Device01_001", "S001_Device02_001", "S001_Device09_001"],
        "S002": ["D01_Dis02_002", "D03_Dis01_002"],
    }
    test = {
        "S101": ["S101_Device01_001", "S101_Device03_002", "S101_Device09_003"],
        "S102": ["D01_Dis01_101", "D02_Dis03_102"],
    }
    trials = {
        "trials_cross_device": "S101_Device01_001 S101_Device03_002 1\nS101_Device01_001 D01_Dis01_101 0\n",
        "trials_cross_distance": "D01_Dis01_101 D02_Dis03_102 target\nD01_Dis01_101 S101_Device03_002 nontarget\n",
        "trials_cross_dialect": "1 D01_Dis01_101 D02_Dis03_102\n0 S101_Device01_001 D02_Dis03_102\n",
    }

    def audio(spk_utts):
        return {s: {u: audio_bytes(seed=i) for i, u in enumerate(us)} for s, us in spk_utts.items()}

    return threedspeaker_archives(audio(train), audio(test), trials)


def cnceleb_archives(cnceleb1: dict, cnceleb2: dict) -> dict:
    """cn-celeb_v2.tar.gz and cn-celeb2_v2.tar.gz (also as its parts `.tar.gza[a-c]`) from member -> bytes."""
    c2_tgz = tgz_bytes(cnceleb2)
    blobs = {"cn-celeb_v2.tar.gz": tgz_bytes(cnceleb1), "cn-celeb2_v2.tar.gz": c2_tgz}
    blobs.update({f"cn-celeb2_v2.tar.gza{c}": b for c, b in zip("abc", split(c2_tgz, 3))})
    return blobs


def cnceleb_blobs() -> dict:
    flac = lambda seed: audio_bytes("FLAC", seed=seed)  # noqa: E731
    c1 = {
        "CN-Celeb_flac/data/id00000/singing-01-001.flac": flac(1),
        "CN-Celeb_flac/data/id00000/speech-01-002.flac": flac(2),
        "CN-Celeb_flac/data/id00001/interview-01-001.flac": flac(3),
        "CN-Celeb_flac/data/id00800/singing-01-001.flac": flac(4),  # an evaluation speaker
        "CN-Celeb_flac/dev/dev.lst": b"id00000\nid00001\n",
        "CN-Celeb_flac/eval/enroll/id00800-enroll.flac": flac(5),
        "CN-Celeb_flac/eval/enroll/id00801-enroll.flac": flac(6),
        "CN-Celeb_flac/eval/test/id00800-singing-01-005.flac": flac(7),
        "CN-Celeb_flac/eval/test/id00800-speech-02-003.flac": flac(8),
        "CN-Celeb_flac/eval/test/id00801-vlog-01-001.flac": flac(9),
        "CN-Celeb_flac/eval/lists/enroll.lst": (
            b"id00800-enroll enroll/id00800-enroll.wav\nid00801-enroll enroll/id00801-enroll.wav\n"
        ),
        "CN-Celeb_flac/eval/lists/enroll.map": b"id00800-enroll id00800/singing-01-001.wav\n",
        "CN-Celeb_flac/eval/lists/test.lst": (
            b"test/id00800-singing-01-005.wav\ntest/id00800-speech-02-003.wav\ntest/id00801-vlog-01-001.wav\n"
        ),
    }
    tests = ["id00800-singing-01-005", "id00800-speech-02-003", "id00801-vlog-01-001"]
    c1["CN-Celeb_flac/eval/lists/trials.lst"] = "".join(
        f"{e}-enroll test/{t}.wav {int(t.startswith(e))}\n" for e in ("id00800", "id00801") for t in tests
    ).encode()
    c2 = {
        "CN-Celeb2_flac/data/id10000/recitation-01-001.flac": flac(10),
        "CN-Celeb2_flac/data/id10001/vlog-02-004.flac": flac(11),
        "CN-Celeb2_flac/spk.lst": b"id10000\nid10001\n",
    }
    return cnceleb_archives(c1, c2)


def musan_rirs_blobs(corpus: Path) -> dict:
    """musan.tar.gz and rirs_noises.zip holding the MUSAN- and RIRS_NOISES-shaped trees of a synthetic corpus."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        tf.add(corpus / "musan", arcname="musan")
    blobs = {"musan.tar.gz": buf.getvalue()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path in sorted((corpus / "RIRS_NOISES").rglob("*")):
            zf.write(path, path.relative_to(corpus).as_posix())
    blobs["rirs_noises.zip"] = buf.getvalue()
    return blobs


# ---------------------------------------------------------------- the synthetic corpus


def make_synth_corpus(
    out: Path,
    train_speakers: int,
    utts: int,
    eval_speakers: int,
    eval_utts: int,
    dur: Tuple[float, float] = (1.0, 1.2),
    jobs: int = 1,
) -> Path:
    """`python -m speakerlab.synth` with `eval_speakers` speakers in val and in test, all utterances `dur` long."""
    options = {
        "out": out,
        "jobs": jobs,
        "num-train-speakers": train_speakers,
        "num-val-speakers": eval_speakers,
        "num-test-speakers": eval_speakers,
        "utts-per-speaker": utts,
        "eval-utts-per-speaker": eval_utts,
        "min-dur": dur[0],
        "max-dur": dur[1],
        "eval-min-dur": dur[0],
        "eval-max-dur": dur[1],
    }
    args = [arg for name, value in options.items() for arg in (f"--{name}", str(value))]
    subprocess.run([sys.executable, "-m", "speakerlab.synth", *args], check=True, capture_output=True, cwd=REPO)
    return out


def synth_speakers(corpus: Path, name: str) -> Dict[str, Dict[str, Path]]:
    """The synthetic set `name` (train, val, test) as {speaker: {utterance: wav path}}, sorted."""
    wav = dict(line.split() for line in (corpus / name / "wav.scp").read_text().splitlines())
    out: Dict[str, Dict[str, Path]] = {}
    for line in (corpus / name / "utt2spk").read_text().splitlines():
        utt, spk = line.split()
        out.setdefault(spk, {})[utt] = Path(wav[utt])
    return {s: dict(sorted(u.items())) for s, u in sorted(out.items())}


def synth_trials(corpus: Path, name: str) -> List[Tuple[str, str, bool]]:
    """The synthetic set's trials (target pairs within each speaker, random nontarget pairs)."""
    return [
        (e, t, label == "target")
        for e, t, label in (line.split() for line in (corpus / name / "trials").read_text().splitlines())
    ]


# ---------------------------------------------------------------- running a recipe shell


def env_ready() -> bool:
    """egs/tools/env.sh would install nothing for this interpreter: every requirement is there."""
    r = subprocess.run(
        [sys.executable, str(REPO / "egs" / "tools" / "missing_requirements.py"), str(REPO / "requirements.txt")],
        capture_output=True,
        text=True,
    )
    return r.returncode == 0 and not r.stdout.strip()


def recipe_env(path_first: str = "", **extra: str) -> dict:
    """The environment a recipe runs in from a test: this interpreter (its env is current, see env_ready)
    and `path_first` (e.g. a stand-in ffmpeg's folder) at the front of PATH."""
    path = os.pathsep.join(p for p in (path_first, str(Path(sys.executable).parent), os.environ["PATH"]) if p)
    env = {**os.environ, "VIRTUAL_ENV": sys.prefix, "PATH": path, **extra}
    env.pop("CONDA_PREFIX", None)
    return env


def voxconverse_blobs() -> dict:
    """VoxConverse in miniature: the dev and test audio zips with their member folders (and the macOS
    resource folder the test zip carries), the annotations as GitHub's master.zip of the repository."""
    rttm = {
        "dev/abjxc": [(0.5, 1.0, "spk00"), (1.7, 0.6, "spk01")],
        "dev/afjiv": [(0.2, 2.0, "spk00")],
        "test/aepyx": [(0.1, 0.9, "spk03"), (0.8, 1.2, "spk07"), (2.1, 0.5, "spk03")],
    }
    text = {
        k: "".join(f"SPEAKER {k.split('/')[1]} 1 {s:.3f} {d:.3f} <NA> <NA> {spk} <NA> <NA>\n" for s, d, spk in v)
        for k, v in rttm.items()
    }
    return {
        "voxconverse_dev_wav.zip": zip_bytes(
            {"audio/abjxc.wav": audio_bytes(seconds=3.0, seed=1), "audio/afjiv.wav": audio_bytes(seconds=2.5, seed=2)}
        ),
        "voxconverse_test_wav.zip": zip_bytes(
            {
                "voxconverse_test_wav/aepyx.wav": audio_bytes(seconds=3.5, seed=3),
                "__MACOSX/voxconverse_test_wav/._aepyx.wav": b"\x00\x05\x16\x07",
            }
        ),
        "master.zip": zip_bytes(
            {
                "voxconverse-master/README.md": b"VoxConverse\n",
                **{f"voxconverse-master/{k}.rttm": v.encode() for k, v in text.items()},
            }
        ),
    }
