"""CPU threads of the commands that compute (speakerlab.devices.resolve_threads): `hardware.threads` /
`--threads`, auto from OMP_NUM_THREADS or the process's CPU affinity shared by the node's processes, applied to
torch and logged with the reason."""

import os
import re

import numpy as np
import pytest
import torch

from speakerlab.config import ConfigError, load_config
from speakerlab.devices import resolve_threads, use_threads
from speakerlab.inference.cli import run_embed
from speakerlab.train.loop import main as train_main
from tests.helpers import write_wav


@pytest.fixture
def torch_threads():
    """torch's thread count restored after the test (the commands set it for the process)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_auto_is_omp_num_threads_else_the_affinity_shared_by_the_node(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert resolve_threads("auto") == (3, "auto: OMP_NUM_THREADS")
    assert resolve_threads(5) == (5, "--threads") and resolve_threads("2", key="hardware.threads")[0] == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert resolve_threads("auto") == (cores, "auto: affinity")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cores))  # more processes than cores: one thread each
    assert resolve_threads() == (1, f"auto: affinity, {cores} cores / {2 * cores} processes")
    for bad in ("0", "two", 1.5, True, "-1"):
        with pytest.raises(ValueError, match=r"hardware.threads must be auto or an integer >= 1"):
            resolve_threads(bad, key="hardware.threads")


def test_the_setting_is_checked_and_applied(torch_threads, monkeypatch):
    with pytest.raises(ConfigError, match=r"hardware.threads"):
        load_config([], ["model.name=campplus", "hardware.threads=0"])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert use_threads(2) == (2, "threads: 2 (--threads)") and torch.get_num_threads() == 2
    assert use_threads() == (1, "threads: 1 (auto: OMP_NUM_THREADS)") and torch.get_num_threads() == 1


def test_training_logs_its_threads(tiny_model, tiny_corpus, tmp_path, torch_threads):
    """The run's train.log says how many threads and why: auto in the session's run, --threads here."""
    assert re.search(r"threads: \d+ \(auto: (OMP_NUM_THREADS|affinity)\)", (tiny_model.exp / "train.log").read_text())
    exp = tmp_path / "exp"
    argv = ["--config", str(tiny_corpus[0]), "--exp-dir", str(exp), "--max-steps", "1", "--threads", "1"]
    assert train_main(argv) == 0
    assert "threads: 1 (hardware.threads)" in (exp / "train.log").read_text()
    assert torch.get_num_threads() == 1


def test_embed_takes_threads_and_says_so(ckpt, tmp_path, capsys, torch_threads):
    wav = write_wav(tmp_path / "a.wav", np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1)
    scp = tmp_path / "wav.scp"
    scp.write_text(f"a {wav}\n")
    assert run_embed([str(scp), str(tmp_path / "e.npz"), "--checkpoint", str(ckpt), "--threads", "1"]) == 0
    assert "; threads: 1 (--threads)" in capsys.readouterr().err and torch.get_num_threads() == 1
    with pytest.raises(SystemExit) as stop:
        run_embed([str(scp), str(tmp_path / "e.npz"), "--checkpoint", str(ckpt), "--threads", "0"])
    assert stop.value.code == 2
    assert "argument --threads: --threads must be auto or an integer >= 1, got '0'" in capsys.readouterr().err
