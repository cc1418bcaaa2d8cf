"""egs/custom end to end, as a user runs it: the egs/mini model (pretrained on synthetic speakers) fine-tuned on
other synthetic speakers (another seed) recorded over a telephone channel and kept as a folder tree (speaker
folders with spaces and umlauts, nested session and date folders, WAV and FLAC at 8, 16 and 44.1 kHz, one
stereo file). The EERs the recipe prints, with their intervals, must hold on 60 more voices of that kind that
are in no folder, and the run's result must not be worse than its start on the validation split (that
fine-tuning beats its start and training from scratch is measured at a size that can tell them apart by
bench/custom_finetune.sh). The voices are made once per session; the pretrained model is the session's egs/mini model
(tests/conftest.py's mini_model, which tests/test_mini_recipe.py and tests/test_diarization_data.py use too)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.checkpoint import load_checkpoint
from tests.fake_corpora import REPO, env_ready, recipe_env
from tests.fixture_models import fill_state_dict, load_fixture
from tests.helpers import save_tiny_checkpoint, write_wav

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not env_ready(), reason="egs/tools/env.sh would install packages for this interpreter"),
]

# One thread: the test machine is shared, and a starved second OpenMP thread stalls every op of the first.
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def bash(*args: str, log: Path) -> str:
    r = subprocess.run(["bash", *args], capture_output=True, text=True, timeout=900, env=recipe_env(**ENV))
    log.write_text(r.stdout + r.stderr)
    assert r.returncode == 0, f"{' '.join(args)}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.stdout + r.stderr


def python(*args: str) -> str:
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=recipe_env(**ENV), cwd=REPO)
    assert r.returncode == 0, f"{' '.join(args)}\n{r.stderr[-3000:]}"
    return r.stdout


# A printed result line: `EER: x.xx% (95% CI a-b%) <what> (...) on <trials>, N trials (...)`.
LINE = r"^EER: (\d+\.\d\d)% (?:\(95% CI (\d+\.\d\d)-(\d+\.\d\d)%\) |\(no interval: \d+ speakers\) )?{what}"


def eer(output: str, what: str) -> float:
    m = re.search(LINE.format(what=what), output, re.M)
    assert m, f"no 'EER: x% {what}' line:\n{output[-3000:]}"
    return float(m.group(1))


def interval(output: str, what: str) -> tuple:
    """(EER, low, high) in % of the printed line of `what`."""
    m = re.search(LINE.format(what=what), output, re.M)
    assert m and m.group(2), f"no 'EER: x% (95% CI a-b%) {what}' line:\n{output[-3000:]}"
    return tuple(float(g) for g in m.groups())


SYNTH = (
    "--num-val-speakers 2 --num-test-speakers 2 --utts-per-speaker 6 --eval-utts-per-speaker 2 --min-dur 1.5 "
    "--max-dur 2.5 --eval-min-dur 1.5 --eval-max-dur 2 --jobs 2"
)


def voice_tree(out: Path, seed: int, speakers: int) -> Path:
    """`speakers` (+ 4) synthetic voices of seed `seed` over a telephone channel as a folder tree `out`."""
    corpus = out.with_name(out.name + "_corpus")
    synth = ["--out", str(corpus), "--seed", str(seed), "--num-train-speakers", str(speakers), *SYNTH.split()]
    python("-m", "speakerlab.synth", *synth)
    python("-m", "speakerlab.synth.tree", "--corpus", str(corpus), "--out", str(out))
    return out


@pytest.fixture(scope="session")
def voices(tmp_path_factory) -> Path:
    """The user's folder: 94 new voices (another seed, a telephone channel: another family than egs/mini's)."""
    return voice_tree(tmp_path_factory.mktemp("voices") / "my recordings", 4321, 90)


@pytest.fixture(scope="session")
def unseen(tmp_path_factory) -> Path:
    """60 more voices of the same family (seed 4322) in no folder the recipe sees: a data dir whose trials are
    every target pair and as many nontarget pairs."""
    root = tmp_path_factory.mktemp("unseen")
    tree = voice_tree(root / "tree", 4322, 60)
    folder = ["--root", str(tree), "--data", str(root / "data"), "--test-speakers", "60", "--val-speakers", "0"]
    python("-m", "speakerlab.datasets.folder.cli", *folder, "--jobs", "2")
    return root / "data" / "test"


def score(model, data: Path, out: Path) -> dict:
    """The EER summary (speakerlab-score's JSON) of `model` on `data`/trials. The two commands run in this process:
    a new interpreter each would import torch again, 8 times in the test (about 3.5 s of CPU each)."""
    from speakerlab.inference.extract import main as extract
    from speakerlab.scoring.score import main as score_main

    assert extract(["--checkpoint", str(model), "--data", str(data), "--out", f"{out}.npz"]) == 0
    trials = ["--trials", str(data / "trials"), "--out", str(out), "--no-plots"]
    assert score_main(["--embeddings", f"{out}.npz", *trials]) == 0
    return json.loads(Path(f"{out}.json").read_text())


def test_the_printed_eers_hold_on_unseen_speakers_and_the_result_is_never_worse_than_its_start(
    mini_model, voices, unseen, tmp_path
):
    """Issue 34's measurement, on speakers of another family than the pretraining data: the recipe with its
    defaults (the held-out splits, the scaled schedule, model selection) prints for the fine-tuned and the
    pretrained model an EER whose interval holds that model's EER on 60 voices in no folder; its result is never
    worse than its start on the validation split, measured again here from the two checkpoints.

    Whether fine-tuning beats its start and training from scratch is not asserted at this size: one run measured
    23.1% fine-tuned, 25.8% pretrained, 23.7% from scratch on the 60 voices, differences within the noise of 60
    speakers (from a former pretrained model of 60 speakers; from the session's: 16.1% fine-tuned, 18.1% pretrained,
    printed 7.6-22.9% and 10.2-23.1%, on the 2-core Intel Xeon), and an earlier form of this test (fine-tuned <
    0.9x pretrained on 20 held-out speakers) passed on an AMD EPYC and failed on an Intel Xeon.
    bench/custom_finetune.sh measures it at a size that tells them apart (bench/RESULTS.md: 5.52% fine-tuned, 9.58%
    pretrained, 8.15% from scratch on 40 held-out speakers)."""
    run = str(REPO / "egs" / "custom" / "run.sh")
    data, exp = tmp_path / "data", tmp_path / "exp"
    args = ["--root", str(voices), "--data", str(data), "--jobs", "2"]
    # train.epochs=12: the CPU budget of a test (the data would have 30 epochs of 10 steps); the rest is scaled.
    train = ["--train_overrides", "hardware.precision=fp32 train.epochs=12"]
    out = bash(run, *args, "--init", str(mini_model.exp), "--exp", str(exp), *train, log=tmp_path / "run.log")
    for n in range(1, 6):
        assert re.search(rf"\] stage {n}: ", out), n
    printed = {"fine-tuned": interval(out, "fine-tuned from"), "pretrained": interval(out, "before fine-tuning")}
    result = (exp / "embeddings" / "test.model").read_text().split("\t")[0]
    models = {"fine-tuned": result, "pretrained": exp / "pretrained.pt"}
    unseen_eer = {k: 100 * score(m, unseen, tmp_path / f"unseen_{k}")["eer"] for k, m in models.items()}
    val_eer = {k: 100 * score(m, data / "val", tmp_path / f"val_{k}")["eer"] for k, m in models.items()}
    print(f"printed (EER, low, high) {printed}; on 60 unseen voices {unseen_eer}; on the validation split {val_eer}")
    for k, (_, low, high) in printed.items():
        assert low <= unseen_eer[k] <= high, (k, printed[k], unseen_eer[k])
    assert val_eer["fine-tuned"] <= val_eer["pretrained"], val_eer
    assert re.search(r"^EER: .* on .*test/trials, \d+ trials \(\d+ target, \d+ nontarget, 24 speakers\)$", out, re.M)
    assert result == str(exp / "checkpoints" / "best.pt")
    # The fine-tuned run started from the pretrained weights with a new classifier.
    speakers = len({line.split()[1] for line in (data / "train" / "utt2spk").read_text().splitlines()})
    log = (exp / "train.log").read_text()
    assert "initialised from" in log and f"new classifier for {speakers} speakers" in log
    # What stage 1 made of the tree: every file used, the stereo file said, the odd names kept apart.
    report = (data / "report.txt").read_text().splitlines()
    assert len(report) == 1 and report[0].endswith(": kept: first of 2 channels"), report
    with open(data / "sources.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(1 for p in voices.rglob("*") if p.is_file()) == 90 * 6 + 4 * 2
    assert {"speaker 001", "Sprecher Ü002"} <= {r["speaker"] for r in rows}
    assert len({r["utt"] for r in rows}) == len(rows)


def test_a_3dspeaker_release_fine_tunes_and_resumes_through_the_recipe(tmp_path):
    """`--3dspeaker campplus --weights FILE` (a state dict filled by the fixture rule, nested as the zoo's
    training scripts save it): stages 1-5 run, the recorded model is the file's, and stage 3 run again after its
    last checkpoint is lost ends on the same weights."""
    rng = np.random.default_rng(0)
    tree = tmp_path / "voices"
    for s in range(8):
        for u in range(3):
            write_wav(tree / f"person {s}" / f"{u}.wav", 0.1 * rng.standard_normal(40000))
    state = fill_state_dict(load_fixture("campplus")["state_dict"])
    weights = tmp_path / "my models" / "campplus_zoo.bin"  # a space in the path: one argument throughout
    weights.parent.mkdir()
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, weights)
    exp = tmp_path / "exp"
    args = ["--root", str(tree), "--data", str(tmp_path / "data"), "--jobs", "1", "--exp", str(exp)]
    args += ["--3dspeaker", "campplus", "--weights", str(weights), "--prepare_opts", "--test-speakers 2"]
    args += ["--train_overrides", "hardware.precision=fp32 train.epochs=2 train.global_batch_size=8"]
    run = str(REPO / "egs" / "custom" / "run.sh")
    out = bash(run, *args, log=tmp_path / "run.log")
    assert eer(out, f"fine-tuned from {weights}") >= 0 and eer(out, "before fine-tuning") >= 0
    assert load_checkpoint(exp / "pretrained.pt").model_args == {"embedding_size": 192}
    start = load_checkpoint(exp / "pretrained.pt").model
    assert all(torch.equal(start[k], v) for k, v in state.items())
    last = exp / "checkpoints" / "epoch_002.pt"
    done = load_checkpoint(last).model
    assert any(not torch.equal(done[k], v) for k, v in state.items())  # the second epoch trained the trunk
    last.unlink()
    bash(run, *args, "--stage", "3", "--stop_stage", "3", log=tmp_path / "again.log")
    again = load_checkpoint(last).model
    assert all(torch.equal(again[k], v) for k, v in done.items())
    assert "resumed from" in (exp / "train.log").read_text()


def run_custom(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "egs" / "custom" / "run.sh"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=recipe_env(**ENV),
        cwd=cwd,
    )


def refused(r: subprocess.CompletedProcess) -> str:
    """The one error line of a recipe that stopped: exit 2, no traceback, `error: ...` last on stderr."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), r.stderr[-3000:]
    return last


@pytest.fixture
def voices_and_model(tmp_path):
    """A folder of 6 speakers x 3 files and a tiny speakerlab CAM++ checkpoint to start from."""
    rng = np.random.default_rng(0)
    for s in range(6):
        for u in range(3):
            write_wav(tmp_path / "voices" / f"person {s}" / f"{u}.wav", 0.1 * rng.standard_normal(24000))
    return tmp_path / "voices", save_tiny_checkpoint(tmp_path / "pre.pt")


def test_bad_model_and_output_paths_stop_the_recipe_before_stage_1(voices_and_model, tmp_path):
    """The pre-flight (speakerlab-train --check) and speakerlab-folder's first check: each a one-line error
    before any file is read; nothing is written."""
    voices, model = voices_and_model
    notes = tmp_path / "weights.bin"
    notes.write_text("not weights\n")
    (tmp_path / "a file").write_text("x")
    base = ["--root", str(voices), "--data", str(tmp_path / "data"), "--jobs", "1"]
    cases = [
        (
            ["--init", str(tmp_path / "gone.pt")],
            f"error: config key 'train.init': checkpoint {tmp_path / 'gone.pt'} does not exist",
        ),
        (
            ["--3dspeaker", "campplus", "--weights", str(notes)],
            f"error: config key 'train.init': checkpoint {notes} cannot be loaded: it is a text file, not a PyTorch "
            "weights file (torch.save writes a zip archive or a pickle)",
        ),
        (["--init", str(model), "--train_overrides", "train.epocs=2"], "error: unknown config key 'train.epocs'"),
        (
            ["--init", str(model), "--exp", str(tmp_path / "a file" / "exp")],
            f"error: {tmp_path / 'a file'} is a file, not a folder (so {tmp_path / 'a file' / 'exp'} cannot be made)",
        ),
    ]
    for args, message in cases:
        r = run_custom(*base, *args, cwd=tmp_path)
        assert refused(r).startswith(message), (args, r.stderr[-2000:])
        assert "] stage 1:" not in r.stderr and not (tmp_path / "data").exists()
        assert "weights_only" not in r.stderr
    r = run_custom(
        "--root", str(tmp_path / "a file"), "--data", str(tmp_path / "data"), "--stop_stage", "1", cwd=tmp_path
    )
    folder = "--root takes the folder that holds one folder per speaker"
    assert refused(r) == f"error: {tmp_path / 'a file'} is a file, not a folder: {folder}"
    r = run_custom("--root", str(voices), "--data", str(tmp_path / "my data"), "--stop_stage", "1", cwd=tmp_path)
    assert refused(r).startswith(f"error: --data: {tmp_path / 'my data'} holds whitespace or is not UTF-8")
    r = run_custom("--root", str(voices), "--stage", "x", cwd=tmp_path)
    assert refused(r) == "error: --stage must be a stage number from 1 to 10, got 'x'"


def test_a_changed_folder_and_schedule_under_one_exp_dir(voices_and_model, tmp_path):
    """The same command after the folder changed: one line (how many speakers differ, --exp), not a traceback;
    a longer schedule: one line naming --force-new-schedule and --train_overrides, which then takes the flag
    before or after the settings (stage 2's feature store gets the settings alone); stage 1 re-run without
    stage 2: stage 3 says to re-run stage 2 and with which command."""
    voices, model = voices_and_model
    data, exp = tmp_path / "data", tmp_path / "exp"
    train = "train.global_batch_size=8 hardware.precision=fp32"
    args = ["--root", str(voices), "--data", str(data), "--jobs", "1", "--init", str(model), "--exp", str(exp)]
    args += ["--prepare_opts", "--test-speakers 2", "--stop_stage", "3"]
    r = run_custom(*args, "--train_overrides", f"train.epochs=1 {train}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_custom(*args, "--stage", "3", "--train_overrides", f"train.epochs=2 {train}", cwd=tmp_path)
    assert refused(r) == (
        f"error: {exp} was trained with other settings than this command's (train.epochs: 1 in the checkpoint -> 2 "
        "now): resuming would continue a different schedule or data order; run the original command, use a new "
        "--exp-dir, or pass --force-new-schedule (a recipe: add it to --train_overrides) to continue these weights "
        "under the new settings"
    )
    for epochs, overrides in (
        (2, f"--force-new-schedule train.epochs=2 {train}"),
        (3, f"train.epochs=3 {train} --force-new-schedule"),
    ):
        r = run_custom(*args, "--stage", "2", "--train_overrides", overrides, cwd=tmp_path)
        assert r.returncode == 0 and f"training done: {epochs} epochs" in r.stderr, r.stderr[-3000:]
    for u in range(3):
        write_wav(voices / "someone new" / f"{u}.wav", 0.1 * np.random.default_rng(u).standard_normal(24000))
    r = run_custom(*args, "--train_overrides", f"train.epochs=3 {train}", cwd=tmp_path)
    line = refused(r)
    assert line.startswith(f"error: {exp / 'checkpoints' / 'epoch_003.pt'} was trained on another speaker list than ")
    assert (
        "of its 4 speakers are gone" in line
        and "of the 5 now are new" in line
        and line.endswith(f"use a new --exp-dir (a recipe's --exp DIR), or delete {exp} to start that run again")
    )
    for u in range(3):
        write_wav(voices / "one more" / f"{u}.wav", 0.1 * np.random.default_rng(10 + u).standard_normal(24000))
    r = run_custom(*args, "--stop_stage", "1", cwd=tmp_path)  # stage 1 alone: the feature store is now stale
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_custom(*args, "--stage", "3", "--exp", str(tmp_path / "exp2"), "--train_overrides", train, cwd=tmp_path)
    assert refused(r).endswith(
        f"re-run the features stage (recipe stage 2: speakerlab-feature-store --data {data / 'train'})"
    )
