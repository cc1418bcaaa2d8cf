"""egs/custom end to end, as a user runs it: the egs/mini model (pretrained on synthetic speakers) fine-tuned on
other synthetic speakers (another seed) recorded over a telephone channel and kept as a folder tree (speaker
folders with spaces and umlauts, nested session and date folders, WAV and FLAC at 8, 16 and 44.1 kHz, one
stereo file). On the held-out speakers the fine-tuned model must score a lower EER than the same model without
fine-tuning and than the same CAM++ trained from scratch for the same steps (bench/custom_finetune.sh measures
the same at a meaningful size)."""

from __future__ import annotations

import csv
import re
import subprocess
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
# fp32: the same figures on every CPU (the cpu profile's auto precision is bf16 where the CPU has it). One
# schedule for both runs, so that only the starting weights differ: conf/custom/scratch.yaml's (no frozen epoch,
# one LR for the whole network). In a budget of 52 steps the fine-tuning config's frozen epoch and 0.3x trunk LR
# leave the model where it started (measured: 24.3% vs 23.9% before); they pay off over hundreds of steps
# (bench/RESULTS.md, "Fine-tuning on one's own data").
TRAIN = (
    "hardware.precision=fp32 train.epochs=4 train.log_every_steps=5 train.freeze=[] optim.backbone_lr_scale=1.0 "
    "optim.lr=0.003 optim.min_lr=0.00002 optim.warmup_epochs=0.3 loss.margin_start_epoch=1 loss.margin_warmup_epochs=2"
)


def bash(*args: str, log: Path) -> str:
    r = subprocess.run(["bash", *args], capture_output=True, text=True, timeout=900, env=recipe_env(**ENV))
    log.write_text(r.stdout + r.stderr)
    assert r.returncode == 0, f"{' '.join(args)}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.stdout + r.stderr


def eer(output: str, what: str) -> float:
    m = re.search(rf"^EER: (\d+\.\d\d)% {what}", output, re.M)
    assert m, f"no 'EER: x% {what}' line:\n{output[-3000:]}"
    return float(m.group(1))


def test_fine_tuning_on_a_folder_of_new_speakers_beats_no_fine_tuning_and_scratch(tmp_path):
    mini = tmp_path / "mini"
    pretrain = (
        "--num-train-speakers 60 --num-val-speakers 2 --num-test-speakers 2 --utts-per-speaker 8 "
        "--eval-utts-per-speaker 2 --min-dur 1.5 --max-dur 2.5 --eval-min-dur 1.5 --eval-max-dur 2"
    )
    bash(
        str(REPO / "egs" / "mini" / "run.sh"),
        *("--data", str(mini / "data"), "--exp", str(mini / "exp"), "--stop_stage", "3"),
        *("--corpus_opts", pretrain, "--train_overrides", "hardware.precision=fp32 train.epochs=6 data.val=null"),
        log=tmp_path / "mini.log",
    )
    voices = tmp_path / "voices"
    new = (
        "--seed 4321 --num-train-speakers 90 --num-val-speakers 2 --num-test-speakers 2 --utts-per-speaker 6 "
        "--eval-utts-per-speaker 2 --min-dur 1.5 --max-dur 2.5 --eval-min-dur 1.5 --eval-max-dur 2 --jobs 2"
    )
    subprocess.run(
        ["python", "-m", "speakerlab.synth", "--out", str(voices), *new.split()],
        check=True,
        capture_output=True,
        env=recipe_env(**ENV),
        cwd=REPO,
    )
    tree = tmp_path / "my recordings"
    subprocess.run(
        ["python", "-m", "speakerlab.synth.tree", "--corpus", str(voices), "--out", str(tree)],
        check=True,
        capture_output=True,
        env=recipe_env(**ENV),
        cwd=REPO,
    )
    run = str(REPO / "egs" / "custom" / "run.sh")
    data = tmp_path / "data"
    common = ["--root", str(tree), "--data", str(data), "--jobs", "2", "--train_overrides", TRAIN]
    common += ["--prepare_opts", "--test-speakers 20 --trials 3000"]
    out = bash(run, *common, "--init", str(mini / "exp"), "--exp", str(tmp_path / "ft"), log=tmp_path / "ft.log")
    for n in range(1, 6):
        assert re.search(rf"\] stage {n}: ", out), n
    fine_tuned = eer(out, "fine-tuned from")
    before = eer(out, "before fine-tuning")
    scratch_out = bash(run, *common, "--stage", "3", "--exp", str(tmp_path / "scratch"), log=tmp_path / "scratch.log")
    scratch = eer(scratch_out, "trained from scratch")
    print(f"EER fine-tuned {fine_tuned}%, before fine-tuning {before}%, from scratch {scratch}%")
    # Clearly: measured 19.5% vs 23.9% before and 30.9% from scratch (544 trials of 20 held-out speakers).
    assert fine_tuned < 0.9 * before and fine_tuned < 0.8 * scratch, (fine_tuned, before, scratch)
    # The same steps, and the fine-tuned run started from the pretrained weights with a new classifier.
    logs = [(tmp_path / e / "train.log").read_text() for e in ("ft", "scratch")]
    steps = [re.findall(r"training done: 4 epochs, (\d+) steps", log) for log in logs]
    assert steps[0] == steps[1] and steps[0]
    speakers = len({line.split()[1] for line in (data / "train" / "utt2spk").read_text().splitlines()})
    assert "initialised from" in logs[0] and f"new classifier for {speakers} speakers" in logs[0]
    # What stage 1 made of the tree: every file used, the stereo file said, the odd names kept apart.
    report = (data / "report.txt").read_text().splitlines()
    assert len(report) == 1 and report[0].endswith(": kept: first of 2 channels"), report
    with open(data / "sources.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == sum(1 for p in tree.rglob("*") if p.is_file()) == 90 * 6 + 4 * 2
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
    assert refused(r) == "error: --stage must be a stage number from 1 to 7, got 'x'"


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
