"""The users' command, end to end, for the three real-corpus recipes: `bash egs/<corpus>/run.sh` stages 1-2
(`--archive_dir`: data preparation, features) on a small fake corpus laid out exactly like the released
archives, then `--stage 3 --stop_stage 5` (train, embeddings, scoring) with a tiny CPU config
(tests/data/tiny_campplus.yaml). The audio is the synthetic voices of `python -m speakerlab.synth`, one
corpus for the module, re-packed into each corpus's archives, lists and trial-list formats.

VoxCeleb2 ships m4a (AAC). With `ffmpeg` on PATH the fake m4a files are really AAC-encoded and the real
conversion runs (test id `[real-ffmpeg]`); without it they hold the synthetic WAV bytes and a stand-in `ffmpeg`
put first on PATH decodes them to the 16 kHz wav the recipe asks for (test id `[standin-ffmpeg]`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest
import soundfile as sf
import yaml

from speakerlab.checkpoint import load_checkpoint
from speakerlab.dataio.loaders.shards import load_index
from speakerlab.scoring.metrics import compute_eer
from tests.fake_corpora import (
    REPO,
    cnceleb_archives,
    env_ready,
    musan_rirs_blobs,
    recipe_env,
    reencode,
    serve,
    synth_speakers,
    synth_trials,
    threedspeaker_archives,
    vox_archives,
    voxblink2_archives,
)
from tests.helpers import threads

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not env_ready(), reason="egs/tools/env.sh would install packages for this interpreter"),
]

CONFIG = REPO / "tests" / "data" / "tiny_campplus.yaml"
FFMPEG = shutil.which("ffmpeg")

Trial = Tuple[str, str, bool]


@pytest.fixture
def corpus(synth_corpus):
    """The session's synthetic corpus (tests/conftest.py): 10 training speakers x 5 utterances, 4 val and 4 test
    speakers x 4 utterances, all 1-1.4 s."""
    return synth_corpus


def count(trials: List[Trial]) -> Tuple[int, int]:
    """(trials, target trials) of a list, checked to hold both classes (an EER needs both)."""
    n, t = len(trials), sum(target for _, _, target in trials)
    assert 0 < t < n, f"a fake trial list needs target and nontarget trials, got {t} of {n}"
    return n, t


def run_recipe(recipe: str, *args: str, env: dict, log: Path) -> subprocess.CompletedProcess:
    """`bash egs/<recipe>/run.sh ARGS`, which must succeed; its output is kept in `log` (.out, .err)."""
    r = subprocess.run(
        ["bash", str(REPO / "egs" / recipe / "run.sh"), *args], capture_output=True, text=True, timeout=600, env=env
    )
    log.with_suffix(".out").write_text(r.stdout)
    log.with_suffix(".err").write_text(r.stderr)
    assert r.returncode == 0, f"{recipe} {' '.join(args)}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r


def train_config(tmp_path: Path) -> dict:
    """The configuration stage 3 trained with (written by speakerlab.train.loop into the experiment folder)."""
    return yaml.safe_load((tmp_path / "exp" / "config.yaml").read_text())


def stages_logged(r: subprocess.CompletedProcess, stages) -> None:
    for n in stages:
        assert re.search(rf"\] stage {n}: ", r.stderr), f"no 'stage {n}:' in the log:\n{r.stderr[-3000:]}"


def data_dir_utts(path: Path) -> Dict[str, str]:
    return dict(line.split() for line in (path / "utt2spk").read_text().splitlines())


def check_prepared(
    data: Path,
    train_set: str,
    eval_set: str,
    train_utts: Dict[str, str],
    eval_utts: Dict[str, str],
    trials: Dict[str, Tuple[str, int, int]],
) -> None:
    """Stages 1-2 wrote the data dirs we expect (utterance -> speaker), indexed, and the trial lists
    (score name -> (trials file, trials, target trials)) with both classes."""
    for name, expected in ((train_set, train_utts), (eval_set, eval_utts)):
        assert data_dir_utts(data / name) == expected, name
        lengths = dict(line.split() for line in (data / name / "utt2num_samples").read_text().splitlines())
        assert sorted(lengths) == sorted(expected) and all(
            0.9 * 16000 <= int(n) <= 1.5 * 16000 for n in lengths.values()
        )
    for path, n, n_target in trials.values():
        labels = [line.split()[2] for line in (data / eval_set / path).read_text().splitlines()]
        assert (len(labels), labels.count("target")) == (n, n_target), path
        assert set(labels) == {"target", "nontarget"}


def check_scored(
    r: subprocess.CompletedProcess,
    data: Path,
    exp: Path,
    eval_set: str,
    eval_utts: Dict[str, str],
    trials: Dict[str, Tuple[str, int, int]],
) -> None:
    """Stages 3-5: a trained checkpoint, an embedding for every eval utterance, and for every trial list
    (score name -> (trials file, trials, target trials)) its scores and an `EER x.xx%` line."""
    stages_logged(r, (3, 4, 5))
    assert list((exp / "checkpoints").glob("epoch_001*")), sorted(p.name for p in exp.rglob("*"))
    with np.load(exp / "embeddings" / f"{eval_set}.npz") as z:
        ids, emb = [str(i) for i in z["ids"]], z["embeddings"]
    assert sorted(ids) == sorted(eval_utts) and emb.shape == (len(eval_utts), 32) and np.isfinite(emb).all()
    mine = re.findall(rf"^{re.escape(str(data / eval_set))}/\S+: .*EER \d+\.\d\d%", r.stdout, re.M)
    assert len(mine) == len(trials)  # one result line per list
    for name, (path, n, n_target) in trials.items():
        m = re.search(
            rf"^{re.escape(str(data / eval_set / path))}: (\d+) trials \((\d+) target, \d+ nontarget, \d+ speakers\) "
            r"EER (\d+\.\d\d)% ",
            r.stdout,
            re.M,
        )
        assert m, f"no EER line for {path}:\n{r.stdout}"
        assert (int(m.group(1)), int(m.group(2))) == (n, n_target)
        rows = [line.split() for line in (exp / "scores" / f"{name}.scores").read_text().splitlines()]
        scores, labels = np.array([float(r[2]) for r in rows]), np.array([r[3] == "target" for r in rows])
        assert len(rows) == n and np.isfinite(scores).all()
        # The printed EER is the EER of the written scores, which are the cosines of the written embeddings.
        assert float(m.group(3)) == pytest.approx(100 * compute_eer(scores, labels), abs=0.006)
        e = dict(zip(ids, emb / np.linalg.norm(emb, axis=1, keepdims=True)))
        np.testing.assert_allclose(scores, [e[r[0]] @ e[r[1]] for r in rows], atol=1e-4)
        assert f"| {name} | {n} | {n_target} | {m.group(3)} |" in r.stdout  # its row of the printed table
        assert (exp / "scores" / f"{name}.det.png").stat().st_size > 0
        assert (exp / "scores" / f"{name}.hist.png").stat().st_size > 0
        assert m.group(0).rstrip() in (exp / "scores" / f"{name}.result").read_text()


def options(**values) -> List[str]:
    """Recipe options `--name value`, in the order given."""
    return [arg for name, value in values.items() for arg in (f"--{name}", str(value))]


def stage_1_2(recipe: str, tmp_path: Path, musan_rirs: str, env: dict, **more) -> subprocess.CompletedProcess:
    """Data preparation and features from the archives in tmp_path/have, as a user with the archives on disk."""
    args = options(
        stage=1,
        stop_stage=2,
        archive_dir=tmp_path / "have",
        download_opts="--skip-md5",
        download_dir=tmp_path / "dl",
        raw_dir=tmp_path / "raw",
        data=tmp_path / "data",
        jobs=1,
        musan_rirs=musan_rirs,
        **more,
    )
    r = run_recipe(recipe, *args, env=env, log=tmp_path / "stage_1_2")
    stages_logged(r, (1, 2))
    return r


def stage_3_5(recipe: str, tmp_path: Path, musan_rirs: str, env: dict, **more) -> subprocess.CompletedProcess:
    """Training with the tiny config on CPU, embeddings and scoring."""
    args = options(
        stage=3,
        stop_stage=5,
        config=CONFIG,
        hardware="cpu",
        exp=tmp_path / "exp",
        data=tmp_path / "data",
        musan_rirs=musan_rirs,
        **more,
    )
    return run_recipe(recipe, *args, env=env, log=tmp_path / "stage_3_5")


# ---------------------------------------------------------------- 3D-Speaker


def threedspeaker_from_synth(corpus: Path):
    """3D-Speaker archives of the synthetic train and test sets. Training speakers' utterance ids start with
    the speaker id (`3D_SPK_00000_Device02_001`), test ids do not (`Device01_Dis02_0003`: the recipe names
    them `<spk>-<id>`); the last utterance of the first speaker of each split is a Device09 one, which the
    recipe leaves out. The three trial lists split the synthetic test trials in three, each in one of the
    label formats that circulate (`enrol test 1|0`, `enrol test target|nontarget`, `1|0 enrol test`)."""
    train, test, names = {}, {}, {}
    expect_train, expect_test = {}, {}
    for i, (_, utts) in enumerate(synth_speakers(corpus, "train").items()):
        spk = f"3D_SPK_{i:05d}"
        for n, path in enumerate(utts.values()):
            device = 9 if i == 0 and n == len(utts) - 1 else n % 3 + 1
            uid = f"{spk}_Device{device:02d}_{n:03d}"
            train.setdefault(spk, {})[uid] = path.read_bytes()
            if device != 9:
                expect_train[uid] = spk
    counter = 0
    for i, (_, utts) in enumerate(synth_speakers(corpus, "test").items()):
        spk = f"3D_SPK_{100 + i:05d}"
        for n, (synth_id, path) in enumerate(utts.items()):
            device = 9 if i == 0 and n == len(utts) - 1 else n % 3 + 1
            uid = f"Device{device:02d}_Dis{n % 2 + 1:02d}_{counter:04d}"
            counter += 1
            test.setdefault(spk, {})[uid] = path.read_bytes()
            names[synth_id] = uid
            if device != 9:
                expect_test[f"{spk}-{uid}"] = spk
    kept = [
        (names[e], names[t], y) for e, t, y in synth_trials(corpus, "test") if "Device09" not in names[e] + names[t]
    ]
    lists, trials = {}, {}
    formats = {"cross_device": "{e} {t} {y:d}", "cross_distance": "{e} {t} {label}", "cross_dialect": "{y:d} {e} {t}"}
    for k, (name, fmt) in enumerate(formats.items()):
        part = kept[k::3]
        lists[f"trials_{name}"] = "".join(
            fmt.format(e=e, t=t, y=y, label="target" if y else "nontarget") + "\n" for e, t, y in part
        )
        trials[name] = (f"trials_{name}", *count(part))
    return threedspeaker_archives(train, test, lists), expect_train, expect_test, trials


def test_3dspeaker_recipe_end_to_end(corpus, tmp_path):
    """Parts of train.tar.gz in --archive_dir; MUSAN and RIRS_NOISES archives too, so training augments."""
    blobs, train_utts, eval_utts, trials = threedspeaker_from_synth(corpus)
    serve(tmp_path / "have", {k: v for k, v in blobs.items() if k != "train.tar.gz"})
    serve(tmp_path / "have", musan_rirs_blobs(corpus))
    env = recipe_env(OMP_NUM_THREADS=threads(), MKL_NUM_THREADS=threads())
    stage_1_2("3dspeaker", tmp_path, "true", env)
    data = tmp_path / "data"
    check_prepared(data, "3dspeaker_train", "3dspeaker_test", train_utts, eval_utts, trials)
    rirs = (data / "musan_rirs" / "rirs.scp").read_text().splitlines()
    assert len(rirs) == len(list((corpus / "RIRS_NOISES" / "simulated_rirs").rglob("Room*-*.wav")))
    r = stage_3_5("3dspeaker", tmp_path, "true", env)
    assert train_config(tmp_path)["augment"]["lists"] == f"{data}/musan_rirs"
    train_log = (tmp_path / "exp" / "train.log").read_text()
    assert re.search(
        rf"augmentation with probability 0\.5, one of: .* from {re.escape(str(data))}/musan_rirs", train_log
    )
    check_scored(r, data, tmp_path / "exp", "3dspeaker_test", eval_utts, trials)


# ---------------------------------------------------------------- VoxCeleb

STANDIN_FFMPEG = """#!{python} -S
# Stand-in for ffmpeg where none is installed: the fake .m4a files hold WAV bytes. Checks that it is asked
# for 16 kHz mono 16-bit wav, as speakerlab.datasets.voxceleb.convert does, and writes the same audio.
# Standard library only (-S: no site-packages), as it starts once per file.
import sys
import wave
args = sys.argv[1:]
src, dst = args[args.index("-i") + 1], args[-1]
want = {{"-ac": "1", "-ar": "16000", "-acodec": "pcm_s16le", "-f": "wav"}}
if not src.endswith(".m4a") or any(k not in args or args[args.index(k) + 1] != v for k, v in want.items()):
    sys.exit(f"stand-in ffmpeg: unexpected arguments {{args}}")
with wave.open(src, "rb") as r:
    if (r.getnchannels(), r.getsampwidth(), r.getframerate()) != (1, 2, 16000):
        sys.exit(f"stand-in ffmpeg: {{src}} is not the 16 kHz mono 16-bit WAV it can copy")
    frames = r.readframes(r.getnframes())
with wave.open(dst, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(16000)
    w.writeframes(frames)
"""


def standin_ffmpeg(tmp_path: Path) -> str:
    """A folder holding the stand-in ffmpeg when none is installed ("" when one is)."""
    if FFMPEG is not None:
        return ""
    standin = tmp_path / "bin" / "ffmpeg"
    standin.parent.mkdir()
    standin.write_text(STANDIN_FFMPEG.format(python=sys.executable))
    standin.chmod(0o755)
    return str(standin.parent)


def m4a_bytes(path: Path, tmp: Path) -> bytes:
    """The synthetic utterance as it ships in vox2_aac.zip: AAC in mp4 with real ffmpeg, else its WAV bytes."""
    if FFMPEG is None:
        return path.read_bytes()
    out = tmp / (path.stem + ".m4a")
    subprocess.run(
        [FFMPEG, "-nostdin", "-v", "error", "-y", "-i", str(path), "-c:a", "aac", "-b:a", "64k", str(out)], check=True
    )
    return out.read_bytes()


def vox_from_synth(corpus: Path, tmp: Path):
    """VoxCeleb files of the synthetic corpus: train speakers -> VoxCeleb2 dev (m4a), val speakers -> VoxCeleb1
    dev, test speakers -> VoxCeleb1 test. Vox1-O = the test trials, Vox1-E = val + test trials, Vox1-H = the
    val trials, all in the official `1|0 <spk>/<video>/<n>.wav <spk>/<video>/<n>.wav` form."""
    tmp.mkdir(parents=True, exist_ok=True)
    files: Dict[str, Dict[str, bytes]] = {"train": {}, "val": {}, "test": {}}
    rel: Dict[str, str] = {}
    utts: Dict[str, Dict[str, str]] = {"train": {}, "val": {}, "test": {}}
    for name, first in (("train", 0), ("val", 10001), ("test", 10270)):
        for i, (_, spk_utts) in enumerate(synth_speakers(corpus, name).items()):
            spk = f"id{first + i:05d}"
            for n, (synth_id, path) in enumerate(spk_utts.items()):
                video = f"v{i:02d}-Q_{n // 2:03d}xY"  # YouTube ids have letters, digits, - and _
                rel[synth_id] = f"{spk}/{video}/{n + 1:05d}"
                files[name][rel[synth_id]] = m4a_bytes(path, tmp) if name == "train" else path.read_bytes()
                utts[name][f"{spk}-{video}-{n + 1:05d}"] = spk

    def official(trials: List[Trial]) -> str:
        return "".join(f"{int(y)} {rel[e]}.wav {rel[t]}.wav\n" for e, t, y in trials)

    val, test = synth_trials(corpus, "val"), synth_trials(corpus, "test")
    lists = {"veri_test2.txt": test, "list_test_all2.txt": val + test, "list_test_hard2.txt": val}
    blobs = vox_archives(files["val"], files["test"], files["train"], {k: official(v) for k, v in lists.items()})
    trials = {
        f"vox1_{x}_clean": (f"trials_vox1_{x}_clean", *count(lists[f]))
        for x, f in (("o", "veri_test2.txt"), ("e", "list_test_all2.txt"), ("h", "list_test_hard2.txt"))
    }
    return blobs, utts["train"], {**utts["val"], **utts["test"]}, trials


@pytest.mark.parametrize("m4a", ["real-ffmpeg" if FFMPEG else "standin-ffmpeg"])
def test_voxceleb_recipe_end_to_end(corpus, tmp_path, m4a):
    """vox1_dev_wav and vox2_dev_aac as their published parts in --archive_dir; m4a -> wav (see the module doc)."""
    blobs, train_utts, eval_utts, trials = vox_from_synth(corpus, tmp_path / "m4a")
    serve(tmp_path / "have", {k: v for k, v in blobs.items() if k not in ("vox1_dev_wav.zip", "vox2_aac.zip")})
    env = recipe_env(standin_ffmpeg(tmp_path), OMP_NUM_THREADS=threads(), MKL_NUM_THREADS=threads())
    r = stage_1_2("voxceleb", tmp_path, "false", env)
    assert f"converting {len(train_utts)} of {len(train_utts)} m4a files" in r.stderr
    data = tmp_path / "data"
    check_prepared(data, "vox2_dev", "vox1", train_utts, eval_utts, trials)
    # the converted wav is the synthetic audio (bit-exact through the stand-in; AAC is lossy: same length)
    first = sorted(train_utts)[0]
    spk, rest = first.split("-", 1)
    video, n = rest.rsplit("-", 1)
    converted, sr = sf.read(str(tmp_path / "raw/voxceleb2/dev/wav" / spk / video / f"{n}.wav"), dtype="int16")
    synth = synth_speakers(corpus, "train")
    original, _ = sf.read(str(next(iter(synth[min(synth)].values()))), dtype="int16")
    assert sr == 16000
    if m4a == "standin-ffmpeg":
        assert np.array_equal(converted, original)
    else:
        assert abs(len(converted) - len(original)) < 0.05 * 16000
    r = stage_3_5("voxceleb", tmp_path, "false", env)
    assert train_config(tmp_path)["augment"]["lists"] is None
    check_scored(r, data, tmp_path / "exp", "vox1", eval_utts, trials)


# ---------------------------------------------------------------- CN-Celeb

GENRES = ("speech", "singing", "interview", "vlog", "drama")


def cnceleb_from_synth(corpus: Path):
    """CN-Celeb archives of the synthetic corpus: the first half of the train speakers -> CN-Celeb1 dev
    (dev.lst), the rest -> CN-Celeb2 (spk.lst), test speakers -> CN-Celeb1 evaluation speakers: their first
    utterance is the enrolment file, the others test files, and every speaker's files are also under
    data/ as in the release; trials.lst = every enrolment x every test file. FLAC, as released."""
    c1: Dict[str, bytes] = {}
    c2: Dict[str, bytes] = {}
    train_utts: Dict[str, str] = {}
    speakers = list(synth_speakers(corpus, "train").values())
    half = len(speakers) // 2
    for i, spk_utts in enumerate(speakers):
        one = i < half
        spk = f"id{i:05d}" if one else f"id{10000 + i - half:05d}"
        root = "CN-Celeb_flac" if one else "CN-Celeb2_flac"
        for n, path in enumerate(spk_utts.values()):
            stem = f"{GENRES[n % len(GENRES)]}-{n // 3 + 1:02d}-{n + 1:03d}"
            (c1 if one else c2)[f"{root}/data/{spk}/{stem}.flac"] = reencode(path, "FLAC")
            train_utts[f"{spk}-{stem}"] = spk
    c1["CN-Celeb_flac/dev/dev.lst"] = "".join(f"id{i:05d}\n" for i in range(half)).encode()
    c2["CN-Celeb2_flac/spk.lst"] = "".join(f"id{10000 + i:05d}\n" for i in range(len(speakers) - half)).encode()
    enroll, tests, eval_utts = [], [], {}
    for i, spk_utts in enumerate(synth_speakers(corpus, "test").values()):
        spk = f"id{800 + i:05d}"
        for n, path in enumerate(spk_utts.values()):
            stem = f"{GENRES[n % len(GENRES)]}-01-{n + 1:03d}"
            flac = reencode(path, "FLAC")
            c1[f"CN-Celeb_flac/data/{spk}/{stem}.flac"] = flac
            if n == 0:
                c1[f"CN-Celeb_flac/eval/enroll/{spk}-enroll.flac"] = flac
                enroll.append(spk)
                eval_utts[f"{spk}-enroll"] = spk
            else:
                c1[f"CN-Celeb_flac/eval/test/{spk}-{stem}.flac"] = flac
                tests.append(f"{spk}-{stem}")
                eval_utts[f"{spk}-{stem}"] = spk
    lists = "CN-Celeb_flac/eval/lists"
    c1[f"{lists}/enroll.lst"] = "".join(f"{s}-enroll enroll/{s}-enroll.wav\n" for s in enroll).encode()
    c1[f"{lists}/enroll.map"] = "".join(f"{s}-enroll {s}/{GENRES[0]}-01-001.wav\n" for s in enroll).encode()
    c1[f"{lists}/test.lst"] = "".join(f"test/{t}.wav\n" for t in tests).encode()
    trials = [(f"{s}-enroll", t, t.startswith(s + "-")) for s in enroll for t in tests]
    c1[f"{lists}/trials.lst"] = "".join(f"{e} test/{t}.wav {int(y)}\n" for e, t, y in trials).encode()
    return cnceleb_archives(c1, c2), train_utts, eval_utts, {"cnceleb1": ("trials_cnceleb1", *count(trials))}


def test_cnceleb_recipe_end_to_end(corpus, tmp_path):
    """cn-celeb2_v2.tar.gz as its published parts in --archive_dir (joined into the download dir), MUSAN and
    RIRS_NOISES too (prepared by stage 1; training here does not augment); one trial list; training from the
    tar shards that stage 2 writes with --shards true."""
    blobs, train_utts, eval_utts, trials = cnceleb_from_synth(corpus)
    serve(tmp_path / "have", {k: v for k, v in blobs.items() if k != "cn-celeb2_v2.tar.gz"})
    serve(tmp_path / "have", musan_rirs_blobs(corpus))
    env = recipe_env(OMP_NUM_THREADS=threads(), MKL_NUM_THREADS=threads())
    stage_1_2("cnceleb", tmp_path, "true", env, shards="true")
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["cn-celeb2_v2.tar.gz"]  # joined from the parts
    data = tmp_path / "data"
    check_prepared(data, "cnceleb_train", "cnceleb_eval", train_utts, eval_utts, trials)
    rirs = (data / "musan_rirs" / "rirs.scp").read_text().splitlines()
    assert len(rirs) == len(list((corpus / "RIRS_NOISES" / "simulated_rirs").rglob("Room*-*.wav")))
    index = load_index(data / "cnceleb_train" / "shards")
    assert sorted(u.decode() for u in index["utts"].tolist()) == sorted(train_utts)
    r = stage_3_5("cnceleb", tmp_path, "false", env, shards="true")
    assert train_config(tmp_path)["data"]["shards"] == str(data / "cnceleb_train" / "shards")
    assert f"training data {data / 'cnceleb_train' / 'shards'}:" in (tmp_path / "exp" / "train.log").read_text()
    check_scored(r, data, tmp_path / "exp", "cnceleb_eval", eval_utts, trials)


# ---------------------------------------------------------------- VoxBlink2 + VoxCeleb2 + CN-Celeb2


def voxblink2_from_synth(corpus: Path):
    """VoxBlink2's VB2_audio.tar.gz parts of the synthetic train speakers (speaker i -> id00000i, 11-character video
    ids with '-' and '_'), and the utterances the recipe should list."""
    audio, utts = {}, {}
    for i, (_, spk_utts) in enumerate(synth_speakers(corpus, "train").items()):
        spk = f"id{i:06d}"
        for n, path in enumerate(spk_utts.values()):
            video = f"yT-{i:02d}_{n // 2:05d}"
            audio[f"{spk}/{video}/{n:05d}"] = path.read_bytes()
            utts[f"{spk}-{video}-{n:05d}"] = spk
    return voxblink2_archives(audio), utts


def test_voxblink2_recipe_end_to_end(corpus, tmp_path):
    """VoxBlink2 (its parts), VoxCeleb1+2 and CN-Celeb1+2 (their published parts) in one --archive_dir: stage 1
    writes vb2, vox2_dev and cnc2/cnceleb_train (CN-Celeb2 alone) and the two evaluation sets, stage 3 trains on
    the three corpora (data.train: the list run.sh writes; speakers namespaced), stages 4-5 score Vox1-O/E/H and
    CN-Celeb1."""
    vb2, vb2_utts = voxblink2_from_synth(corpus)
    vox, vox2_utts, vox1_utts, vox_trials = vox_from_synth(corpus, tmp_path / "m4a")
    cnc, cnc_train, cnc_eval, cnc_trials = cnceleb_from_synth(corpus)
    whole = ("VB2_audio.tar.gz", "vox1_dev_wav.zip", "vox2_aac.zip", "cn-celeb2_v2.tar.gz")
    serve(tmp_path / "have", {k: v for k, v in {**vb2, **vox, **cnc}.items() if k not in whole})
    env = recipe_env(standin_ffmpeg(tmp_path), OMP_NUM_THREADS=threads(), MKL_NUM_THREADS=threads())
    stage_1_2("voxblink2", tmp_path, "false", env)
    data = tmp_path / "data"
    cnc2 = {u: s for u, s in cnc_train.items() if s >= "id10000"}  # CN-Celeb2's speakers (spk.lst)
    check_prepared(data, "vb2", "vox1", vb2_utts, vox1_utts, vox_trials)
    check_prepared(data, "cnc2/cnceleb_train", "cnceleb_eval", cnc2, cnc_eval, cnc_trials)
    assert data_dir_utts(data / "vox2_dev") == vox2_utts
    r = stage_3_5("voxblink2", tmp_path, "false", env)
    corpora = train_config(tmp_path)["data"]["train"]
    assert [(c["name"], c["dir"]) for c in corpora] == [
        ("vb2", f"{data}/vb2"),
        ("vox2", f"{data}/vox2_dev"),
        ("cnc2", f"{data}/cnc2/cnceleb_train"),
    ]
    speakers = load_checkpoint(tmp_path / "exp" / "checkpoints" / "epoch_001.pt").speakers
    named = (("vb2", vb2_utts), ("vox2", vox2_utts), ("cnc2", cnc2))
    want = [f"{n}/{s}" for n, utts in named for s in set(utts.values())]
    assert speakers == sorted(want)
    check_scored(r, data, tmp_path / "exp", "vox1", vox1_utts, vox_trials)
    check_scored(r, data, tmp_path / "exp", "cnceleb_eval", cnc_eval, cnc_trials)
