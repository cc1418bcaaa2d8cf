"""Fine-tuning defaults scaled to the data (speakerlab.train.scaled): the rules of its docstring at the small and
the large end, a value the user gives kept (and what depends on it following it), and its command's lines."""

from __future__ import annotations

import pytest

from speakerlab.config import FreezeRule
from speakerlab.train.scaled import main, scaled_settings
from tests.helpers import make_data_dir


@pytest.mark.parametrize(
    "utterances, epochs, patience, frozen",
    [
        (348, 30, 10, 6),  # 58 speakers x 6 files: 11 steps of 32 per epoch -> 30 epochs (the cap), 6 frozen
        (2304, 9, 3, 1),  # 144 x 16: 72 steps -> 9 epochs (648 steps), patience 3 (216 steps), 1 frozen
        (50000, 4, 3, 1),  # 1,000 x 50: 1,563 steps -> at least 4 epochs, patience at least 3
    ],
)
def test_the_rules_at_each_end(utterances, epochs, patience, frozen):
    want = [f"train.epochs={epochs}", f"train.patience={patience}", trunk(frozen)]
    assert scaled_settings(utterances, 32, True, {}) == [*want, f"loss.margin_start_epoch={frozen}"]


def trunk(epochs: int) -> str:
    return f"train.freeze=[{{modules: [trunk], until_epoch: {epochs}}}]"


def test_given_values_are_kept_and_what_depends_on_them_follows():
    # train.epochs=2 given: the frozen start follows 2 epochs (at most a quarter, at least 1), not the 30 of the data
    epochs_given = scaled_settings(18, 32, True, {"train.epochs": 2, "train.patience": 0})
    assert epochs_given == [trunk(1), "loss.margin_start_epoch=1"]
    # train.freeze given: kept, and the margin starts when its trunk rule ends (none: at once; 25 steps of 11: epoch 3)
    frozen_given = scaled_settings(348, 32, True, {"train.freeze": []}, [])
    assert frozen_given == ["train.epochs=30", "train.patience=10", "loss.margin_start_epoch=0"]
    in_steps = [FreezeRule(modules=["trunk"], until_step=25)]
    assert scaled_settings(348, 32, True, {"train.freeze": "..."}, in_steps)[-1] == "loss.margin_start_epoch=3"
    assert scaled_settings(348, 32, False, {}) == ["train.epochs=30", "train.patience=10"]  # scratch: no frozen start
    # the config's other rules stay; trunk's bound is the scaled one
    encoder = [FreezeRule(modules=["trunk", "encoder"], until_step=5)]
    assert scaled_settings(348, 32, True, {}, encoder)[2] == (
        "train.freeze=[{modules: [encoder], until_step: 5}, {modules: [trunk], until_epoch: 6}]"
    )


def test_the_command_prints_the_overrides_and_says_why(tmp_path, capsys):
    train = make_data_dir(tmp_path / "train", {f"s{s}-{u}": f"s{s}" for s in range(10) for u in range(4)})
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: campplus}\ntrain: {global_batch_size: 8}\n")
    assert main(["--data", str(train), "--config", str(config), f"data.train={train}", "train.init=x.pt"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["train.epochs=30", "train.patience=20", trunk(7), "loss.margin_start_epoch=7"]
    assert err.startswith("defaults scaled to 10 speakers, 40 utterances (5 steps of 8 per epoch): train.epochs=30")
    assert main(["--data", str(tmp_path / "nowhere"), "--config", str(config), f"data.train={train}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'nowhere' / 'utt2spk'}")
