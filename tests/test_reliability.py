"""Nothing lost under kills: SIGKILL at random points of a run (steps, checkpoint writes, data loading),
a dead rank and a stalled rank of a 2-process torchrun. Each is followed by the same command again."""

import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from speakerlab.checkpoint import latest_checkpoint, load_checkpoint
from tests.helpers import ROOT, assert_no_traceback, free_port, losses, tiny_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def newest_complete(ckpt_dir: Path):
    """What a restart must resume from: the newest checkpoint file by name (temp files never count)."""
    return latest_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None


@pytest.mark.slow
def test_sigkill_at_random_points_then_same_command_ends_with_the_uninterrupted_weights(tmp_path):
    cfg, _ = tiny_config(tmp_path, val=False)
    args = ["--config", str(cfg), "train.epochs=10"]
    ref = tmp_path / "ref"
    r = subprocess.run(
        [sys.executable, "-m", "speakerlab.train", *args, "--exp-dir", str(ref)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]

    exp = tmp_path / "killed"
    ckpts = exp / "checkpoints"
    cmd = [*args, "--exp-dir", str(exp)]
    rng = random.Random(20261122)
    # Events per full run: a checkpoint write per step (20), 8 crops per step (160), 20 steps. Early
    # counts, so that each killed run gets at most about one step further and all 12 kills happen.
    points = (
        [("write", rng.randint(1, 2)) for _ in range(4)]
        + [("load", rng.randint(1, 12)) for _ in range(4)]
        + [("step", rng.randint(1, 2)) for _ in range(4)]
    )
    rng.shuffle(points)
    kinds_hit, kills = set(), 0
    # The killed runs are children of one server process (tests/crash_points.py) that imported torch once.
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "crash_points.py")],
        env=ENV,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for i, (kind, n) in enumerate(points):
            expected = newest_complete(ckpts)
            expected_step = None if expected is None else load_checkpoint(expected).step
            torn_before = sorted(p.name for p in ckpts.glob(".*.tmp*")) if ckpts.is_dir() else []
            out = tmp_path / f"killed_{i}.log"
            server.stdin.write(json.dumps([kind, n, str(out), *cmd]) + "\n")
            server.stdin.flush()
            ready, _, _ = select.select([server.stdout], [], [], 300)
            assert ready, f"run {i} ({kind} {n}) did not end within 300 s"
            code, stderr = int(server.stdout.readline()), out.read_text()
            if code == 0:  # finished before the event came (a resumed run has fewer events)
                break
            assert code == -signal.SIGKILL, stderr[-2000:]
            kinds_hit.add(kind)
            kills += 1
            resumed = re.findall(r"resumed from (\S+): epoch \d+, step (\d+)", stderr)
            if expected is None:
                assert not resumed
            else:  # the newest complete checkpoint, never a torn temporary file
                assert resumed and Path(resumed[0][0]) == expected, (kind, n, resumed, expected)
                assert int(resumed[0][1]) == expected_step
            for name in torn_before:
                assert f"removed {ckpts / name}, left mid-write" in stderr
    finally:
        server.stdin.close()  # the server ends at the end of its input
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    assert kinds_hit == {"write", "load", "step"} and kills >= 10
    r = subprocess.run(
        [sys.executable, "-m", "speakerlab.train", *cmd], env=ENV, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert not list(ckpts.glob(".*.tmp*"))
    a, b = load_checkpoint(ref / "checkpoints" / "epoch_010.pt"), load_checkpoint(ckpts / "epoch_010.pt")
    assert a.step == b.step == 20
    for key, value in a.model.items():
        torch.testing.assert_close(b.model[key], value, rtol=0, atol=1e-6)
    assert sorted(losses(exp)) == list(range(1, 21))


def _worker_pids(parent: int) -> dict:
    """rank -> pid of torchrun's worker processes."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True).stdout
    ranks = {}
    for pid in map(int, out.split()):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                ranks[int(item[5:])] = pid
    return ranks


def _start_torchrun(cfg, exp, port, *extra):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={port}",
        "-m",
        "speakerlab.train",
        "--config",
        str(cfg),
        "--exp-dir",
        str(exp),
        "train.epochs=20",  # 40 steps: a rank is killed or stopped once the run has logged 3
        *extra,
    ]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        try:
            if len(losses(exp)) >= 3 and len(_worker_pids(proc.pid)) == 2:
                return cmd, proc
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"torchrun did not start training: {proc.communicate()[0][-2000:]}")


def _resume_and_finish(cmd, exp):
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    log = (exp / "train.log").read_text()
    assert_no_traceback(r.stdout, r.stderr)
    assert re.search(r"resumed from \S+: epoch \d+, step \d+", log) and "training done: 20 epochs, 40 steps" in log


@pytest.mark.slow
def test_dead_rank_ends_the_job_and_the_same_command_resumes(tmp_path):
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "dead"
    cmd, proc = _start_torchrun(cfg, exp, free_port())
    os.kill(_worker_pids(proc.pid)[1], signal.SIGKILL)
    t0 = time.time()
    out = proc.communicate(timeout=120)[0]
    assert time.time() - t0 < 60 and proc.returncode != 0
    assert re.search(r"local_rank\s*:\s*1", out) and "Signal 9 (SIGKILL)" in out, out[-3000:]
    _resume_and_finish(cmd, exp)


@pytest.mark.slow
def test_stalled_rank_ends_the_job_within_the_watchdog_time(tmp_path):
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "stalled"
    cmd, proc = _start_torchrun(cfg, exp, free_port(), "hardware.watchdog_s=10")
    stopped = _worker_pids(proc.pid)[1]
    os.kill(stopped, signal.SIGSTOP)
    t0 = time.time()
    try:
        out = proc.communicate(timeout=120)[0]
    finally:
        try:
            os.kill(stopped, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert time.time() - t0 < 60 and proc.returncode != 0
    assert "rank 0: rank(s) 1 have not run for more than 10 s (hardware.watchdog_s)" in out, out[-3000:]
    _resume_and_finish(cmd, exp)
    assert "removing the stale lock" in (exp / "train.log").read_text()
