"""Smoke run of the whole egs/mini recipe on a tiny corpus, through run.sh as a user runs it."""

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from speakerlab.checkpoint import load_checkpoint
from speakerlab.scoring.metrics import compute_eer

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "egs" / "mini" / "run.sh"


def run_recipe(tmp_path, *args, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    r = subprocess.run(
        ["bash", str(RUN), "--data", str(tmp_path / "data"), "--exp", str(tmp_path / "exp"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.mark.slow
def test_mini_recipe_end_to_end(tmp_path):
    corpus = (
        "--num-train-speakers 6 --num-val-speakers 3 --num-test-speakers 3 --utts-per-speaker 6 "
        "--eval-utts-per-speaker 3 --min-dur 1.0 --max-dur 1.5 --eval-min-dur 1.5 --eval-max-dur 2.0"
    )
    train = (
        "train.epochs=2 train.global_batch_size=12 hardware.per_device_batch=6 data.crop_seconds=1.0 "
        "model.args.num_layers=[1,1,1]"
    )
    r = run_recipe(
        tmp_path,
        "--corpus_opts",
        corpus,
        "--train_overrides",
        train,
        "--stop_stage",
        "7",
        "--average_last",
        "2",
        "--lm_config",
        str(ROOT / "conf" / "mini" / "finetune_lm.yaml"),
    )
    out = r.stdout + r.stderr
    for n in range(1, 8):
        assert f"stage {n}:" in out
    m = re.search(r"EER (\d+\.\d+)%", r.stdout)
    assert m, r.stdout
    exp = tmp_path / "exp"
    # The printed EER is the EER of the written scores, and every trial of the list was scored.
    rows = [line.split() for line in (exp / "scores" / "test.scores").read_text().splitlines()]
    trials = (tmp_path / "data" / "test" / "trials").read_text().splitlines()
    assert [r[:2] for r in rows] == [t.split()[:2] for t in trials]
    eer = compute_eer(np.array([float(r[2]) for r in rows]), np.array([r[3] == "target" for r in rows]))
    assert float(m.group(1)) == pytest.approx(100 * eer, abs=0.006)
    assert (exp / "scores" / "test.result").read_text().strip() in r.stdout
    assert "mean log-mel baseline" in r.stdout and (exp / "scores" / "test_baseline.result").exists()
    assert (exp / "checkpoints" / "avg.pt").exists()
    assert (Path(str(exp) + "_lm") / "checkpoints" / "epoch_001.pt").exists()
    # Re-running a finished stage range is safe: training resumes, finds nothing to do.
    r2 = run_recipe(tmp_path, "--corpus_opts", corpus, "--train_overrides", train, "--stage", "2", "--stop_stage", "5")
    assert "training done: 2 epochs" in r2.stderr
    assert re.search(r"EER (\d+\.\d+)%", r2.stdout).group(1) == m.group(1)
    # Training read the fbank store of stage 2; --augment true trains from the audio with speed
    # perturbation (3x classes), reverberation and noise from the bank instead.
    assert (tmp_path / "data" / "train" / "feats.scp").exists() and "feature store" in r.stdout + r.stderr
    aug = tmp_path / "exp_aug"
    r3 = run_recipe(
        tmp_path,
        "--train_overrides",
        train,
        "--stage",
        "3",
        "--stop_stage",
        "5",
        "--augment",
        "true",
        "--exp",
        str(aug),
    )
    log = (aug / "train.log").read_text()
    assert "augmentation with probability 0.6" in log and "reverb (" in log and "babble (" in log
    speakers = load_checkpoint(aug / "checkpoints" / "epoch_002.pt").speakers  # sped-up copies are new classes
    assert len(speakers) == 18 and speakers[6].startswith("sp0.9-") and speakers[12].startswith("sp1.1-")
    assert re.search(r"EER (\d+\.\d+)%", r3.stdout) and (aug / "scores" / "test.result").exists()


def test_recipe_rejects_unknown_option(tmp_path):
    r = run_recipe(tmp_path, "--stag", "3", check=False)
    assert r.returncode != 0 and "unknown option --stag" in r.stderr


def test_environment_variables_are_not_options(tmp_path):
    r = subprocess.run(
        ["bash", str(RUN), "--http_proxy", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "http_proxy": "http://proxy.invalid:3128"},
    )
    assert r.returncode == 1 and "unknown option --http_proxy" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stage", "x"], "--stage must be a stage number from 1 to 7, got 'x'"),
        (["--stop_stage", "8"], "--stop_stage must be a stage number from 1 to 7, got '8'"),
        (["--stage", "0"], "--stage must be a stage number from 1 to 7, got '0'"),
        (["--stage", "4", "--stop_stage", "3"], "--stage 4 is after --stop_stage 3"),
    ],
)
def test_bad_stage_numbers_are_errors(tmp_path, args, message):
    r = run_recipe(tmp_path, *args, check=False)
    assert r.returncode == 1 and message in r.stderr
    assert not (tmp_path / "data").exists()  # nothing ran


def test_recipe_help_lists_options():
    r = subprocess.run(["bash", str(RUN), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--stop_stage" in r.stdout and "--hardware cpu" in r.stdout
