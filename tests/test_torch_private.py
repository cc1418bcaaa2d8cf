"""The private torch names the package relies on (speakerlab.train.launch.torch_private) are all in the installed
torch, and each user fails at start-up in one line, naming the torch version the code was proven on, when its name
is gone: the agent (torch's exit barrier) and a training run with the sharded classifier (DDP's ignore list)."""

import pytest
import torch
from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

from speakerlab.train.launch import agent
from speakerlab.train.launch.torch_private import PRIVATE, PROVEN_ON, TorchPrivateMissing, require
from speakerlab.train.loop import main as train_main
from tests.helpers import tiny_config


def test_every_private_name_is_in_this_torch():
    require(*PRIVATE)  # raises on the first one missing


def test_a_missing_name_is_one_line_naming_the_proven_torch(monkeypatch):
    monkeypatch.delattr(torch.nn.parallel.DistributedDataParallel, "_set_params_and_buffers_to_ignore_for_model")
    with pytest.raises(TorchPrivateMissing) as caught:
        require("ddp_ignore")
    line = str(caught.value)
    assert "\n" not in line and f"torch {torch.__version__} has no " in line and f"torch {PROVEN_ON}" in line
    assert "_set_params_and_buffers_to_ignore_for_model" in line and "sharded" in line


def test_the_agent_without_the_exit_barrier_stops_in_one_line(monkeypatch, capsys):
    monkeypatch.delattr(SimpleElasticAgent, "_exit_barrier")
    assert agent.launch(["--nproc_per_node=1", "--no-python", "true"]) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agent: error: torch ") and "SimpleElasticAgent._exit_barrier" in err[0]
    assert f"proven on torch {PROVEN_ON}" in err[0] and out.out == ""


def test_a_sharded_run_without_ddps_ignore_list_stops_before_training(monkeypatch, tmp_path, capsys):
    """On one process too: the config that will need it on many fails where it is tried first."""
    monkeypatch.delattr(torch.nn.parallel.DistributedDataParallel, "_set_params_and_buffers_to_ignore_for_model")
    cfg, _ = tiny_config(tmp_path, val=False)
    exp = tmp_path / "exp"
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), "loss.shard_classes=true"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "_set_params_and_buffers_to_ignore_for_model" in err[0] and PROVEN_ON in err[0], err
    assert not (exp / "checkpoints").exists()
