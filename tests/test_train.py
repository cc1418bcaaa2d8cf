"""Training engine end to end on a tiny model and corpus (CPU, seconds per run)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from speakerlab.checkpoint import load_checkpoint, rebuild_model
from speakerlab.train.loop import main as train_main
from tests.helpers import ROOT, assert_no_traceback, free_port, losses, tiny_config, write_wav


@pytest.mark.parametrize("dither", [False, True], ids=["plain", "dither"])
def test_resume_equals_uninterrupted(tiny_run, tmp_path, dither):
    # With dither the front-end draws from torch's global random state every step: a resumed run must
    # restore it and nothing (a DataLoader's base seed, say) may draw from it in one run and not the other.
    if dither:
        cfg, _ = tiny_config(tmp_path, val=False, extra="features: {dither: 1.0}")
        ref = tmp_path / "a"
        assert train_main(["--config", str(cfg), "--exp-dir", str(ref)]) == 0
    else:
        cfg, ref = tiny_run.config, tiny_run.exp  # the uninterrupted run (tests/conftest.py)
    # Interrupted at the end of epoch 1 (step 2), then mid-epoch 2 (step 3), then run to the end.
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "b"), "--max-steps", "2"]) == 0
    assert sorted(losses(tmp_path / "b")) == [1, 2]
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "b"), "--max-steps", "1"]) == 0
    assert sorted(losses(tmp_path / "b")) == [1, 2, 3]
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "b")]) == 0
    a, b = losses(ref), losses(tmp_path / "b")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6, abs=1e-7), step
    wa = load_checkpoint(ref / "checkpoints" / "epoch_002.pt")
    wb = load_checkpoint(tmp_path / "b" / "checkpoints" / "epoch_002.pt")
    for k in wa.model:
        torch.testing.assert_close(wa.model[k], wb.model[k], rtol=1e-5, atol=1e-6)
    assert "resumed from" in (tmp_path / "b" / "train.log").read_text()


def test_a_run_of_two_gpus_resumes_on_one_and_on_the_cpu(tiny_run, tmp_path, monkeypatch):
    """A checkpoint holding the CUDA random states of 2 GPUs: resumed here on the CPU (0 GPUs) it continues
    the same schedule and data order, equal to the uninterrupted run, warning once; with 1 GPU (faked)
    the state of GPU 0 is restored and the warning names the counts."""
    from speakerlab.checkpoint import save_checkpoint
    from speakerlab.train.state.resume import restore_cuda_rng

    cfg = tiny_run.config  # tiny_run.exp: the uninterrupted run (tests/conftest.py)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "b"), "--max-steps", "3"]) == 0
    path = tmp_path / "b" / "checkpoints" / "partial_002.pt"
    ck = load_checkpoint(path)
    fake = [torch.arange(16, dtype=torch.uint8), torch.arange(16, 32, dtype=torch.uint8)]
    ck.resume.rng_cuda = fake
    save_checkpoint(path, ck)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "b")]) == 0
    a, b = losses(tiny_run.exp), losses(tmp_path / "b")
    assert sorted(b) == [1, 2, 3, 4] and all(b[s] == pytest.approx(a[s], rel=1e-6, abs=1e-7) for s in a)
    log = (tmp_path / "b" / "train.log").read_text()
    assert log.count("CUDA random state of 2 GPU(s), this run has 0: restored 0") == 1

    restored, warnings = [], []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, index: restored.append((index, state)))
    restore_cuda_rng(fake, torch.device("cuda", 0), warnings.append)
    assert [i for i, _ in restored] == [0] and torch.equal(restored[0][1], fake[0])
    assert len(warnings) == 1 and "2 GPU(s), this run has 1: restored 1" in warnings[0]
    restore_cuda_rng(fake[:1], torch.device("cuda", 0), warnings.append)
    assert len(warnings) == 1  # the same count: nothing to say


def test_checkpoint_alone_rebuilds_model(tiny_model):
    path = tiny_model.exp / "checkpoints" / "epoch_001.pt"
    raw = torch.load(path, weights_only=True)
    assert raw["schema"] == 2 and {
        "model_name",
        "model_args",
        "model",
        "features",
        "speakers",
        "classifier",
        "step",
        "epoch",
        "resume",
        "config",
    } <= set(raw)
    ck = load_checkpoint(path)
    assert ck.speakers == ["s0", "s1", "s2", "s3"] and ck.config["train"]["epochs"] == 1
    assert ck.features.fbank.num_mel_bins == 80 and ck.features.fbank.dither == 0.0 and ck.features.mean_norm
    assert ck.resume is not None and ck.resume.optimizer["state"] and ck.resume.rng_cpu is not None
    model = rebuild_model(ck)
    assert not model.training
    assert model(torch.randn(2, 60, 80)).shape == (2, 32)
    assert (tiny_model.exp / "config.yaml").exists()


def test_nan_wav_is_skipped_and_named(tmp_path):
    cfg, train = tiny_config(tmp_path, val=False)
    bad = train / "wav" / "s2-1.wav"
    x = np.full(int(0.6 * 16000), np.nan, dtype=np.float32)
    write_wav(bad, x, subtype="FLOAT")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "n")]) == 0
    log = (tmp_path / "n" / "train.log").read_text()
    assert "skipped" in log and str(bad) in log
    assert "training done: 2 epochs, 4 steps, 2 skipped" in log  # one NaN batch per epoch


def test_consecutive_nonfinite_steps_stop_with_good_checkpoint(tmp_path):
    cfg, train = tiny_config(tmp_path, val=False)
    exp = tmp_path / "x"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), "train.epochs=1"]) == 0
    good = load_checkpoint(exp / "checkpoints" / "epoch_001.pt")
    for wav in (train / "wav").glob("*.wav"):
        write_wav(wav, np.full(int(0.6 * 16000), np.inf, dtype=np.float32), subtype="FLOAT")
    assert (
        train_main(
            [
                "--config",
                str(cfg),
                "--exp-dir",
                str(exp),
                "train.epochs=2",
                "train.save_every_steps=0",
                "--force-new-schedule",
            ]
        )
        == 3
    )
    log = (exp / "train.log").read_text()
    assert "2 consecutive steps had a non-finite loss or gradient" in log
    after = load_checkpoint(exp / "checkpoints" / "epoch_001.pt")
    assert after.step == good.step
    assert all(torch.isfinite(v).all() for v in after.model.values() if v.is_floating_point())
    assert not list((exp / "checkpoints").glob("partial_*.pt"))


def test_missing_wav_stops_before_training(tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    lines = (train / "wav.scp").read_text().splitlines()
    lines[5] = lines[5].split()[0] + " /no/such/file.wav"
    (train / "wav.scp").write_text("\n".join(lines) + "\n")
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert f"{train / 'wav.scp'}:6: /no/such/file.wav" in err
    assert not (tmp_path / "m" / "checkpoints").exists()


def test_bad_config_key_is_reported(tmp_path, capsys):
    cfg, _ = tiny_config(tmp_path, val=False)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "c"), "train.epocs=1"]) == 2
    assert "unknown config key 'train.epocs'" in capsys.readouterr().err


def test_tensorboard_has_every_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg, _ = tiny_config(tmp_path, val=True)
    assert train_main(["--config", str(cfg), "--exp-dir", str(tmp_path / "t"), "train.epochs=1"]) == 0
    acc = EventAccumulator(str(tmp_path / "t" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {
        f"train/{k}"
        for k in (
            "loss",
            "accuracy",
            "lr",
            "margin",
            "grad_norm",
            "loss_scale",
            "samples_per_s",
            "data_wait_fraction",
            "peak_memory_gb",
            "skipped_steps",
        )
    }
    assert want | {"val/eer"} <= tags


@pytest.mark.slow
def test_killed_run_resumes_with_the_same_command(tmp_path):
    """SIGKILL mid-run (no clean shutdown at all), then the same command: training continues from
    the last checkpoint and ends with every step done."""
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "k"
    cmd = [sys.executable, "-m", "speakerlab.train", "--config", str(cfg), "--exp-dir", str(exp), "train.epochs=30"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def logged_steps():
        try:
            return len(losses(exp))
        except (OSError, ValueError):  # not written yet, or a line half-written
            return 0

    deadline = time.time() + 240
    while proc.poll() is None and logged_steps() < 5 and time.time() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (exp / "train.log").read_text()
    resumed = re.search(r"resumed from \S+: epoch \d+, step (\d+)", log)
    assert resumed and int(resumed.group(1)) >= 4  # a checkpoint every step: at most one step lost
    assert "training done: 30 epochs, 60 steps" in log
    assert sorted(losses(exp)) == list(range(1, 61))


@pytest.mark.slow
def test_torchrun_two_processes(tmp_path):
    cfg, _ = tiny_config(tmp_path, val=True)
    exp = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={free_port()}",
        "-m",
        "speakerlab.train",
        "--config",
        str(cfg),
        "--exp-dir",
        str(exp),
        "hardware.num_workers=1",  # loader workers fork while the watchdog thread runs
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (exp / "train.log").read_text()
    assert_no_traceback(r.stdout, r.stderr, log)
    assert "global 8 = 2 device(s) x 4 x accum 1" in log
    assert "training done: 2 epochs, 4 steps" in log
    assert sorted(losses(exp)) == [1, 2, 3, 4]
    ck = load_checkpoint(exp / "checkpoints" / "epoch_002.pt")
    assert ck.step == 4
    # Interrupted DDP run resumes too: stop after 1 step, then the same command.
    exp2 = tmp_path / "ddp2"
    r = subprocess.run(cmd[:-2] + [str(exp2), "--max-steps", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(cmd[:-2] + [str(exp2)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_traceback(r.stdout, r.stderr, (exp2 / "train.log").read_text())
    a, b = losses(exp), losses(exp2)
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6)


def test_average_then_large_margin_finetune(tiny_run, tmp_path):
    from speakerlab.train.state.average import main as average_main

    cfg, exp = tiny_run.config, tmp_path / "base"
    shutil.copytree(tiny_run.exp, exp)  # both epoch checkpoints of the 2-epoch run; averaging writes avg.pt
    assert average_main(["--exp-dir", str(exp), "--last", "2"]) == 0
    avg = load_checkpoint(exp / "checkpoints" / "avg.pt")
    e1 = load_checkpoint(exp / "checkpoints" / "epoch_001.pt")
    e2 = load_checkpoint(exp / "checkpoints" / "epoch_002.pt")
    key = next(k for k, v in avg.model.items() if v.is_floating_point() and v.ndim > 1)
    torch.testing.assert_close(avg.model[key], (e1.model[key] + e2.model[key]) / 2)
    assert avg.resume is None and avg.averaged_from and avg.classifier is not None
    lm = tmp_path / "lm"
    overlay = ROOT / "conf" / "mini" / "finetune_lm.yaml"
    assert (
        train_main(
            [
                "--config",
                str(cfg),
                "--config",
                str(overlay),
                "--exp-dir",
                str(lm),
                f"train.init={exp / 'checkpoints' / 'avg.pt'}",
                "data.crop_seconds=0.55",
            ]
        )
        == 0
    )
    log = (lm / "train.log").read_text()
    assert f"initialised from {exp / 'checkpoints' / 'avg.pt'}" in log
    rows = [json.loads(r) for r in (lm / "metrics.jsonl").read_text().splitlines()]
    assert all(r["margin"] == pytest.approx(0.4) for r in rows)
    saved = load_checkpoint(lm / "checkpoints" / "epoch_001.pt")
    assert saved.config["loss"]["margin"] == pytest.approx(0.4)
    assert saved.config["data"]["crop_seconds"] == pytest.approx(0.55)
