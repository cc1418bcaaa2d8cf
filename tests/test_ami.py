"""AMI (speakerlab-ami and egs/ami) on a fake corpus in the real layout: the amicorpus folder of the AMI download
(<meeting>/audio/<meeting>.Mix-Headset.wav and .Array1-01.wav, a few seconds of noise each) and an
AMI-diarization-setup checkout (lists/, only_words/ and word_and_vocalsounds/ RTTMs, uems/) for real meeting ids."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speakerlab.dataio.tables.rttm import Turn, read_reco2num_spk, read_uem, rttm_lines
from speakerlab.datasets import ami
from tests.fake_corpora import env_ready
from tests.test_deploy import stats_file  # noqa: F401 (the fixture: a small ONNX embedder)
from tests.test_diarization_data import run_recipe

REPO = Path(__file__).resolve().parent.parent
SECONDS = 4.0
# subset -> meeting -> its only_words turns (start, end, speaker); EN2002c has 3 speakers, as in the setup.
FOUR = [(0.3, 1.0, "FEE005"), (0.9, 1.8, "MEE006"), (2.0, 2.6, "FEE007"), (2.7, 3.5, "MEE008")]
REFERENCE = {
    "train": {"EN2001a": FOUR[:3]},
    "dev": {"IS1008a": FOUR, "IB4001": [(0.1, 0.8, "MIO012"), *FOUR[1:]]},
    "test": {"ES2004a": FOUR, "TS3003a": FOUR[::-1], "EN2002c": [(0.2, 1.1, "FEO070"), *FOUR[2:]]},
}
SPEAKERS = {"IS1008a": 4, "IB4001": 4, "ES2004a": 4, "TS3003a": 4, "EN2002c": 3, "EN2001a": 3}


def talk(turns, rng) -> np.ndarray:
    """SECONDS of faint noise, louder where the turns are (each speaker at a level of its own): the energy VAD finds
    the turns and the stats embedder (mean square per window) tells speakers apart by level."""
    x = 0.002 * rng.standard_normal(int(16000 * SECONDS))
    levels = {spk: 0.05 * (i + 1) for i, spk in enumerate(sorted({t[2] for t in turns}))}
    for start, end, spk in turns:
        a, b = int(16000 * start), int(16000 * end)
        x[a:b] += levels[spk] * rng.standard_normal(b - a)
    return np.clip(x, -1, 1)


def make_ami(root: Path, without_audio=()) -> tuple:
    """The fake corpus under `root` -> (amicorpus folder, setup folder); `without_audio`: (meeting, wav name) pairs
    not written."""
    corpus, setup = root / "amicorpus", root / "AMI-diarization-setup"
    rng = np.random.default_rng(0)
    for subset, meetings in REFERENCE.items():
        (setup / "lists").mkdir(parents=True, exist_ok=True)
        (setup / "lists" / f"{subset}.meetings.txt").write_text("".join(f"{m}\n" for m in meetings))
        for meeting, turns in meetings.items():
            ref = [Turn(s, e, spk) for s, e, spk in turns]
            for reference, extra in (("only_words", []), ("word_and_vocalsounds", [Turn(3.6, 3.9, turns[0][2])])):
                (setup / reference / "rttms" / subset).mkdir(parents=True, exist_ok=True)
                lines = rttm_lines(meeting, ref + extra)
                (setup / reference / "rttms" / subset / f"{meeting}.rttm").write_text("\n".join(lines) + "\n")
            (setup / "uems" / subset).mkdir(parents=True, exist_ok=True)
            (setup / "uems" / subset / f"{meeting}.uem").write_text(f"{meeting} 1 0.000 {SECONDS:.6f}\n")
            (corpus / meeting / "audio").mkdir(parents=True, exist_ok=True)
            for name in ("Mix-Headset", "Array1-01"):
                if (meeting, name) not in without_audio:
                    wav = corpus / meeting / "audio" / f"{meeting}.{name}.wav"
                    sf.write(str(wav), talk(turns, rng), 16000, subtype="PCM_16")
    return corpus, setup


@pytest.fixture(scope="module")
def fake_ami(tmp_path_factory) -> tuple:
    return make_ami(tmp_path_factory.mktemp("ami"))


def reference_lines(subset: str, meetings) -> list:
    """The RTTM lines of `meetings`' turns, in order (times to the millisecond, as the data dir has them)."""
    return [line for m in meetings for line in rttm_lines(m, [Turn(*t) for t in REFERENCE[subset][m]])]


def prepare(corpus, setup, data, *args) -> int:
    return ami.main(["prepare", "--ami-root", str(corpus), "--setup", str(setup), "--data", str(data), *args])


@pytest.mark.parametrize("condition, wav_name", [("headset", "Mix-Headset"), ("sdm", "Array1-01")])
def test_prepare_writes_the_data_dirs_of_both_conditions(fake_ami, tmp_path, condition, wav_name):
    corpus, setup = fake_ami
    assert prepare(corpus.parent, setup, tmp_path, "--condition", condition, "--subsets", "dev", "test") == 0
    for subset in ("dev", "test"):
        d = tmp_path / f"ami_{condition}_{subset}"
        meetings = sorted(REFERENCE[subset])
        scp = [line.split() for line in (d / "wav.scp").read_text().splitlines()]
        assert [m for m, _ in scp] == meetings
        assert [p for _, p in scp] == [str((corpus / m / "audio" / f"{m}.{wav_name}.wav").resolve()) for m in meetings]
        assert (d / "rttm").read_text().splitlines() == reference_lines(subset, meetings)
        assert read_uem(d / "uem") == {m: [(0.0, SECONDS)] for m in meetings}
        assert read_reco2num_spk(d / "reco2num_spk") == {m: SPEAKERS[m] for m in meetings}


def test_the_annotations_choose_the_reference(fake_ami, tmp_path):
    corpus, setup = fake_ami
    assert prepare(corpus, setup, tmp_path, "--subsets", "train", "--annotations", "word_and_vocalsounds") == 0
    lines = (tmp_path / "ami_sdm_train" / "rttm").read_text().splitlines()
    assert lines == reference_lines("train", ["EN2001a"]) + rttm_lines("EN2001a", [Turn(3.6, 3.9, "FEE005")])


def one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err.strip()


def test_a_meeting_without_its_audio_is_one_line_naming_the_file_and_the_condition(tmp_path, capsys):
    corpus, setup = make_ami(tmp_path / "raw", without_audio={("TS3003a", "Array1-01"), ("ES2004a", "Array1-01")})
    assert prepare(corpus, setup, tmp_path / "data", "--subsets", "test", "--condition", "sdm") == 2
    wav = corpus / "ES2004a" / "audio" / "ES2004a.Array1-01.wav"
    assert one_error(capsys) == (
        f"error: no such file: {wav} (--condition sdm: 2 of the 3 test meetings lack their Array1-01.wav)"
    )
    assert not (tmp_path / "data" / "ami_sdm_test").exists()
    assert prepare(corpus, setup, tmp_path / "data", "--subsets", "test", "--condition", "headset") == 0


def test_a_missing_setup_folder_or_file_is_one_line_naming_it(fake_ami, tmp_path, capsys):
    corpus, setup = fake_ami
    assert prepare(corpus, tmp_path / "nowhere", tmp_path / "data") == 2
    assert one_error(capsys).startswith(f"error: expected folder {tmp_path / 'nowhere'} does not exist: is --setup")
    assert prepare(corpus, corpus, tmp_path / "data") == 2  # the audio folder given as the setup
    assert f"expected file {corpus / 'lists' / 'dev.meetings.txt'} does not exist" in one_error(capsys)
    partial = tmp_path / "setup"
    (partial / "lists").mkdir(parents=True)
    (partial / "lists" / "test.meetings.txt").write_text("ES2004a\n")
    (partial / "only_words" / "rttms" / "test").mkdir(parents=True)
    assert prepare(corpus, partial, tmp_path / "data", "--subsets", "test") == 2
    assert f"expected folder {partial / 'uems' / 'test'} does not exist" in one_error(capsys)
    (partial / "uems" / "test").mkdir(parents=True)
    assert prepare(corpus, partial, tmp_path / "data", "--subsets", "test") == 2
    assert f"expected file {partial / 'only_words' / 'rttms' / 'test' / 'ES2004a.rttm'} does not" in one_error(capsys)
    assert prepare(tmp_path / "no_audio", setup, tmp_path / "data") == 2
    assert one_error(capsys).startswith(f"error: expected folder {tmp_path / 'no_audio'} does not exist: --ami-root")


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "ES2004a\nES2004b TS3003a\n",
            ":2: expected one AMI meeting id per line (e.g. ES2004a), got 'ES2004b TS3003a'",
        ),
        ("ES2004a.Mix-Headset.wav\n", ":1: expected one AMI meeting id per line (e.g. ES2004a), got 'ES2004a.Mix"),
        ("ES2004a\n\nES2004a\n", ":3: meeting ES2004a is listed twice (first on line 1)"),
        ("\n", ": no meetings"),
    ],
)
def test_a_malformed_list_is_one_line_naming_file_and_line(fake_ami, tmp_path, capsys, text, message):
    corpus, _ = fake_ami
    setup = tmp_path / "setup"
    (setup / "lists").mkdir(parents=True)
    (setup / "lists" / "test.meetings.txt").write_text(text)
    assert prepare(corpus, setup, tmp_path / "data", "--subsets", "test") == 2
    assert one_error(capsys).startswith(f"error: {setup / 'lists' / 'test.meetings.txt'}{message}")


def test_a_reference_of_another_meeting_or_broken_audio_is_one_line(tmp_path, capsys):
    corpus, setup = make_ami(tmp_path / "raw")
    rttm = setup / "only_words" / "rttms" / "test" / "ES2004a.rttm"
    rttm.write_text(rttm.read_text().replace("ES2004a", "ES2004b", 1))
    assert prepare(corpus, setup, tmp_path / "data", "--subsets", "test") == 2
    assert one_error(capsys) == f"error: {rttm}: holds recording 'ES2004b', expected only 'ES2004a'"
    (corpus / "IB4001" / "audio" / "IB4001.Array1-01.wav").write_text("not audio")
    assert prepare(corpus, setup, tmp_path / "data", "--subsets", "dev") == 2
    assert "IB4001.Array1-01.wav" in one_error(capsys)


def recipe(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "egs" / "ami" / "run.sh"), *map(str, args)], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "error: stages 4-5 need --model_opts"),
        (("--model_opts", "--onnx m.onnx"), "error: stage 1 needs --ami_root (the amicorpus folder) and --setup"),
        (("--stage", 4, "--model_opts", "x", "--subset", "train"), "error: --subset must be dev, test or both"),
        (("--stage", 4, "--model_opts", "x", "--condition", "ihm"), "error: --condition must be sdm or headset"),
        (("--stage", 3, "--model_opts", "x", "--segmentation_train", "dev"), "error: --segmentation_train must be"),
    ],
)
def test_the_recipe_refuses_bad_options_in_one_line_before_any_work(args, message):
    r = recipe(*args)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith(message), r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not env_ready(), reason="egs/tools/env.sh would install packages")
def test_ami_recipe_on_the_fake_corpus(fake_ami, stats_file, tmp_path):  # noqa: F811
    """Stages 1, 3, 4 and 5 on the test list in the headset condition: the data dirs of
    test_prepare_writes_the_data_dirs_of_both_conditions (test, and train for the segmentation model), a two-step
    segmentation model trained on the train list (no PLDA: no VBx), every system diarized and scored, the collar-0
    rows printed again. The embedder is tests/test_deploy.py's small ONNX graph (per window: mean and mean square) and
    the VAD the energy one: what is tested is that the stages run and score, not a model (egs/mini_diar's test)."""
    corpus, setup = fake_ami
    where = ("--ami_root", corpus, "--setup", setup, "--data", tmp_path / "data", "--exp", tmp_path / "exp")
    tiny = "steps=2 batch_size=2 window=1.0 filters=8 channels=8 hidden=8 layers=1 warmup=0 log_every=1"
    seg = ("--segmentation_train", "train", "--seg_opts", " ".join(f"--set {x}" for x in tiny.split()))
    model = ("--model_opts", f"--onnx {stats_file}", "--vad", "energy")
    r = run_recipe("ami", *where, "--condition", "headset", *seg, *model)
    data, exp = tmp_path / "data" / "ami_headset_test", tmp_path / "exp" / "headset_test"
    assert read_reco2num_spk(data / "reco2num_spk") == {"ES2004a": 4, "EN2002c": 3, "TS3003a": 4}
    stages = [line.split("] ", 1)[1].split(":")[0] for line in r.stderr.splitlines() if "] stage " in line]
    assert stages == ["stage 1", "stage 3", "stage 3", "stage 4", "stage 5", "stage 5"]
    train = tmp_path / "data" / "ami_headset_train"
    assert (
        f"stage 3: train the segmentation model (../../conf/diarization/segmentation_cpu.yaml) on {train}" in r.stderr
    )
    segmentation = tmp_path / "exp" / "segmentation" / "segmentation.onnx"
    assert f"stage 4: diarize {data} (--onnx {stats_file}; segmentation {segmentation}) -> {exp}" in r.stderr
    result = json.loads((exp / "der.json").read_text())
    systems = {"estimated", "estimated_ahc", "oracle_count", "oracle_vad", "one_speaker"}
    assert set(result) == systems | {"segmentation", "segmentation_oracle_count"}
    assert all(np.isfinite(c["der"]) for s in result.values() for c in s["conditions"])
    # The speakers differ in level, which the stats embedder sees: given the count, they are told apart.
    given, baseline = (
        next(c["der"] for c in result[s]["conditions"] if (c["collar"], c["skip_overlap"]) == (0.0, False))
        for s in ("oracle_count", "one_speaker")
    )
    assert given < 0.6 * baseline
    assert result["oracle_count"]["count_right"] == 3
    header, *collar0 = r.stdout.splitlines()[-8:]  # after the whole table, its collar-0, overlap-scored rows
    assert header.startswith("system") and [row.split()[1:3] for row in collar0] == [["0.00", "scored"]] * 7, r.stdout
    assert len((exp / "der.txt").read_text().splitlines()) == 1 + 7 * 4  # every condition kept
