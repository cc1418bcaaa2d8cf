"""What egs/custom's stage 5 says about the model it scored (stages 4-5 on a made-up exp dir): what the run was,
from the exp dir's own config (stage 7's run is fine-tuned whatever this command's --init), and which checkpoint
was embedded (the one a corrupt newer checkpoint fell back to; best.pt, and when that is the start, so)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.fake_corpora import REPO, env_ready, recipe_env
from tests.helpers import damaged_copy, make_data_dir, save_tiny_checkpoint

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not env_ready(), reason="egs/tools/env.sh would install packages for this interpreter"),
]


def made_up_run(tmp_path: Path, init) -> tuple:
    """A test data dir (6 speakers x 3 utterances, every pair a trial) and an exp dir of two epoch checkpoints
    whose config.yaml says train.init: `init` -> (data root, exp dir)."""
    utts = [f"s{s}-{u}" for s in range(6) for u in range(3)]
    trials = "".join(
        f"{a} {b} {'target' if a[:2] == b[:2] else 'nontarget'}\n" for i, a in enumerate(utts) for b in utts[i + 1 :]
    )
    make_data_dir(tmp_path / "data" / "test", {u: u[:2] for u in utts}, seconds=1.0, trials=trials)
    exp = tmp_path / "exp_lm"
    for epoch in (1, 2):
        save_tiny_checkpoint(exp / "checkpoints" / f"epoch_{epoch:03d}.pt", seed=epoch, step=10 * epoch, epoch=epoch)
    (exp / "config.yaml").write_text(yaml.safe_dump({"train": {"init": init}}))
    return tmp_path / "data", exp


def stages_4_5(data: Path, exp: Path) -> str:
    r = subprocess.run(
        ["bash", str(REPO / "egs" / "custom" / "run.sh"), "--data", str(data), "--exp", str(exp)]
        + ["--stage", "4", "--stop_stage", "5"],
        capture_output=True,
        text=True,
        env=recipe_env(OMP_NUM_THREADS="1"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


def line(output: str) -> str:
    found = re.findall(r"^EER: .*$", output, re.M)
    assert len(found) == 1, output[-3000:]  # no pretrained.pt in a made-up run: one line
    return found[0]


def test_after_stage_7_the_model_is_fine_tuned_and_the_checkpoint_named(tmp_path):
    avg = str(tmp_path / "exp" / "checkpoints" / "avg.pt")
    data, exp = made_up_run(tmp_path, avg)
    said = line(stages_4_5(data, exp))
    assert re.match(
        rf"EER: \d+\.\d\d% \(95% CI \d+\.\d\d-\d+\.\d\d%\) fine-tuned from {re.escape(avg)} "
        rf"\({re.escape(str(exp / 'checkpoints' / 'epoch_002.pt'))}: epoch 2, step 20\) "
        rf"on {re.escape(str(data / 'test' / 'trials'))}, 153 trials \(18 target, 135 nontarget, 6 speakers\)$",
        said,
    ), said


def test_a_corrupt_latest_checkpoint_is_said_and_the_one_used_named(tmp_path):
    data, exp = made_up_run(tmp_path, None)
    damaged_copy(exp / "checkpoints" / "epoch_002.pt", exp / "checkpoints" / "epoch_002.pt")
    out = stages_4_5(data, exp)
    assert re.search(f"warning: checkpoint {exp / 'checkpoints' / 'epoch_002.pt'} (is corrupt|cannot be loaded)", out)
    said = line(out)
    assert f" trained from scratch ({exp / 'checkpoints' / 'epoch_001.pt'}: epoch 1, step 10) on " in said, said
    assert "its latest checkpoint" not in said


def test_a_run_that_handed_back_its_start_says_so(tmp_path):
    data, exp = made_up_run(tmp_path, "pretrained.ckpt")
    save_tiny_checkpoint(exp / "checkpoints" / "best.pt", step=0, epoch=0)
    said = line(stages_4_5(data, exp))
    best = exp / "checkpoints" / "best.pt"
    assert (
        f" fine-tuned from pretrained.ckpt ({best}: the model the run started from: training did not lower the "
        "validation EER) on "
    ) in said, said
