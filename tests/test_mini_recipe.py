"""Smoke run of the whole egs/mini recipe on a tiny corpus, through run.sh as a user runs it."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from speakerlab.checkpoint import load_checkpoint
from speakerlab.scoring.metrics import compute_eer
from tests.conftest import MINI_TRAIN
from tests.helpers import LAST_STAGE, assert_no_traceback, free_port, threads

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "egs" / "mini" / "run.sh"


def run_recipe(tmp_path, *args, check=True, data=None):
    env = {**os.environ, "OMP_NUM_THREADS": threads()}
    r = subprocess.run(
        ["bash", str(RUN), "--data", str(data or tmp_path / "data"), "--exp", str(tmp_path / "exp"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r


@pytest.mark.slow
def test_mini_recipe_end_to_end(mini_corpus, mini_model, tmp_path):
    # The session's stage 1 and stages 2-3 (tests/conftest.py: mini_corpus, mini_model, shared with egs/mini_diar's
    # test); stages 4-8 here, on a copy of the exp dir (they write into it; the data dir they only read).
    shutil.copytree(mini_model.exp, tmp_path / "exp")
    train = MINI_TRAIN
    r = run_recipe(
        tmp_path,
        "--train_overrides",
        train,
        "--stage",
        "4",
        "--stop_stage",
        "8",
        "--average_last",
        "2",
        "--lm_config",
        str(ROOT / "conf" / "mini" / "finetune_lm.yaml"),
        "--lm_overrides",
        "train.epochs=1",  # after train_overrides' 10 epochs: stage 7 is one epoch
        data=mini_model.data,
    )
    out = mini_corpus.log + mini_model.log + r.stdout + r.stderr
    for n in range(1, 9):
        assert f"stage {n}:" in out
    # The training stage (egs/mini's stage 3, in the fixture) trained the model: its own log says so.
    assert "] stage 3: train" in mini_model.log and "training done: 10 epochs, 400 steps" in mini_model.log
    m = re.search(r"EER (\d+\.\d+)%", r.stdout)
    assert m, r.stdout
    exp = tmp_path / "exp"
    # The printed EER is the EER of the written scores, and every trial of the list was scored.
    rows = [line.split() for line in (exp / "scores" / "test.scores").read_text().splitlines()]
    trials = (mini_model.data / "test" / "trials").read_text().splitlines()
    assert [r[:2] for r in rows] == [t.split()[:2] for t in trials]
    eer = compute_eer(np.array([float(r[2]) for r in rows]), np.array([r[3] == "target" for r in rows]))
    assert float(m.group(1)) == pytest.approx(100 * eer, abs=0.006)
    assert (exp / "scores" / "test.result").read_text().strip() in r.stdout
    # Training learned: the trained model's EER is clearly below the no-training baseline's on the same trials,
    # its whole 95% interval below it (an EER of 20 speakers moves by several points between runs and machines).
    baseline = re.search(r"mean log-mel baseline, \d+ trials: EER (\d+\.\d+)%", r.stdout)
    assert baseline and (exp / "scores" / "test_baseline.result").exists(), r.stdout
    high = float(json.loads((exp / "scores" / "test.json").read_text())["eer_ci"]["high"]) * 100
    assert float(m.group(1)) < 0.75 * float(baseline.group(1)), (m.group(1), baseline.group(1))
    assert high < float(baseline.group(1)), (high, baseline.group(1))
    assert (exp / "checkpoints" / "avg.pt").exists()
    assert (Path(str(exp) + "_lm") / "checkpoints" / "epoch_001.pt").exists()
    # Stage 8: the calibration fitted on val's trials, measured on test's, beside the checkpoints.
    cal = json.loads((exp / "calibration.json").read_text())
    model_id = str(np.load(exp / "embeddings" / "test.npz")["model_id"])  # the model of stage 4's embeddings
    assert cal["fitted_on"]["trials"] == [str(mini_model.data / "val" / "trials")] and cal["model_id"] == model_id
    held = cal["metrics"][str(mini_model.data / "test" / "trials")]
    assert held["n_trials"] == len(trials) and 0 <= held["min_cllr"] <= held["cllr"]
    # Re-running a finished stage range is safe: training resumes, finds nothing to do.
    r2 = run_recipe(tmp_path, "--train_overrides", train, "--stage", "3", "--stop_stage", "5", data=mini_model.data)
    assert "training done: 10 epochs" in r2.stderr
    assert re.search(r"EER (\d+\.\d+)%", r2.stdout).group(1) == m.group(1)
    # Training read the fbank store of stage 2; --augment true trains from the audio with speed
    # perturbation (3x classes), reverberation and noise from the bank instead.
    assert (mini_model.data / "train" / "feats.scp").exists() and "feature store" in mini_model.log
    aug = tmp_path / "exp_aug"
    r3 = run_recipe(
        tmp_path,
        "--train_overrides",
        "train.epochs=1 train.global_batch_size=16 hardware.per_device_batch=8 data.crop_seconds=1.0 "
        "model.args.num_layers=[1,1,1]",
        "--stage",
        "3",
        "--stop_stage",
        "5",
        "--augment",
        "true",
        "--exp",
        str(aug),
        data=mini_model.data,
    )
    log = (aug / "train.log").read_text()
    assert "augmentation with probability 0.6" in log and "reverb (" in log and "babble (" in log
    speakers = load_checkpoint(aug / "checkpoints" / "epoch_001.pt").speakers  # sped-up copies are new classes
    assert len(speakers) == 240 and speakers[80].startswith("sp0.9-") and speakers[160].startswith("sp1.1-")
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
    assert r.returncode == 2 and "unknown option --http_proxy" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stage", "x"], f"--stage must be a stage number from 1 to {LAST_STAGE}, got 'x'"),
        (
            ["--stop_stage", str(LAST_STAGE + 1)],
            f"--stop_stage must be a stage number from 1 to {LAST_STAGE}, got '{LAST_STAGE + 1}'",
        ),
        (["--stage", "0"], f"--stage must be a stage number from 1 to {LAST_STAGE}, got '0'"),
        (["--stage", "4", "--stop_stage", "3"], "--stage 4 is after --stop_stage 3"),
    ],
)
def test_bad_stage_numbers_are_errors(tmp_path, args, message):
    r = run_recipe(tmp_path, *args, check=False)
    assert r.returncode == 2 and message in r.stderr
    assert not (tmp_path / "data").exists()  # nothing ran


def test_recipe_help_lists_options():
    r = subprocess.run(["bash", str(RUN), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "--stop_stage" in r.stdout and "--hardware cpu" in r.stdout


@pytest.mark.slow
def test_two_nodes_on_localhost_through_the_recipe_launch_options(tmp_path):
    """Two torchrun "nodes" (one process each, gloo) started by the recipe's stage 3 with --nnodes 2
    --node_rank 0|1 --master_addr 127.0.0.1: one run of world size 2, both logs free of tracebacks."""
    from tests.helpers import losses, tiny_config

    cfg, _ = tiny_config(tmp_path, val=True)  # tmp_path/train and tmp_path/val: the recipe's --data layout
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["--stage", "3", "--stop_stage", "3", "--data", str(tmp_path), "--config", str(cfg)]
    common += ["--exp", str(tmp_path / "exp"), "--nnodes", "2", "--master_addr", "127.0.0.1", "--master_port", port]
    nodes = [
        subprocess.Popen(
            ["bash", str(RUN), *common, "--node_rank", str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        assert node.returncode == 0, out[-2000:] + err[-4000:]
    assert "launch: 1 process(es) on the CPU on node 0 of 2 (master 127.0.0.1:" in outputs[0][1]
    assert "on node 1 of 2" in outputs[1][1]
    log = (tmp_path / "exp" / "train.log").read_text()
    assert_no_traceback(*outputs[0], *outputs[1], log)
    assert "global 8 = 2 device(s) x 4 x accum 1" in log and "training done: 2 epochs, 4 steps" in log
    assert sorted(losses(tmp_path / "exp")) == [1, 2, 3, 4]


def test_launch_uses_every_visible_gpu_by_default_and_the_cpu_without_one(tmp_path):
    """`launch` with the default --gpus all: N visible GPUs -> torchrun with N processes; none -> the console
    script itself on the CPU; `none` and a list as given. Stub `python` and `speakerlab-train` record what runs."""
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text('#!/usr/bin/env bash\nif [ "$1" = -c ]; then echo "${FAKE_GPUS:-0}"; else echo "RUN $*"; fi\n')
    stub.chmod(0o755)
    script_stub = stub.parent / "speakerlab-train"
    script_stub.write_text('#!/usr/bin/env bash\necho "SCRIPT speakerlab-train $*"\n')
    script_stub.chmod(0o755)
    script = (
        f". {ROOT}/egs/tools/common.sh; opt stage 3; opt stop_stage 3; launch_options; "
        f'. {ROOT}/egs/tools/parse_options.sh; launch speakerlab-train --x; echo "CVD=${{CUDA_VISIBLE_DEVICES:-}}"'
    )

    def launch(*args, gpus_seen=0, visible=None):
        env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "FAKE_GPUS": str(gpus_seen)}
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        r = subprocess.run(["bash", "-c", script, "launch", *args], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr

    out, err = launch(gpus_seen=8)
    assert "--nproc_per_node=8" in out and "launch: 8 process(es) on 8 GPU(s) (all visible)" in err
    out, err = launch(gpus_seen=2, visible="4,5")
    assert "--nproc_per_node=2" in out and "CVD=4,5" in out and "CUDA_VISIBLE_DEVICES=4,5" in err
    out, err = launch(gpus_seen=0)
    assert "SCRIPT speakerlab-train --x" in out and "launch: 1 process(es) on the CPU (no GPU visible)" in err
    out, err = launch("--gpus", "none", "--nproc", "2", gpus_seen=8)
    assert "--nproc_per_node=2" in out and "on the CPU" in err
    out, err = launch("--gpus", "1 3", gpus_seen=8)
    assert "--nproc_per_node=2" in out and "CVD=1,3" in out


def test_stress_stage_reads_the_clean_side_from_stage_4s_embeddings_when_they_exist(tmp_path):
    """stress_stage (egs/tools/common.sh) with a stub `speakerlab-stress` that records its arguments: the noise bank
    when built, stage 4's embeddings when written, $stress_opts after them."""
    stub = tmp_path / "bin" / "speakerlab-stress"
    stub.parent.mkdir()
    stub.write_text('#!/usr/bin/env bash\necho "STRESS $*"\n')
    stub.chmod(0o755)
    bank, clean = tmp_path / "bank", tmp_path / "exp" / "embeddings" / "test.npz"
    script = (
        f'. {ROOT}/egs/tools/common.sh; stress_opts="--test-utts 200"; '
        f"stress_stage ckpt data data/trials test {tmp_path / 'exp'} {bank} {clean}"
    )

    def stage() -> str:
        env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return next(line for line in r.stdout.splitlines() if line.startswith("STRESS "))

    out = stage()
    assert "--noise-bank" not in out and "--clean-embeddings" not in out and "--test-utts 200" in out
    bank.mkdir()
    (bank / "index.json").write_text("{}")
    clean.parent.mkdir(parents=True)
    clean.write_bytes(b"")
    out = stage()
    assert f"--noise-bank {bank} --clean-embeddings {clean} --test-utts 200" in out
