"""Model selection on the validation split (train.keep_best, train.patience; speakerlab.train.state.selection): the
start measured before the first step, the best kept as checkpoints/best.pt, early stop on a plateau, a run that does not
help handing back its start and saying so, and all of it resumed exactly."""

from __future__ import annotations

import pytest
import torch

import speakerlab.train.state.selection as selection
from speakerlab.checkpoint import load_checkpoint, run_result
from speakerlab.train.loop import main as train_main
from speakerlab.train.state.validation import Selection
from tests.helpers import losses, make_data_dir, new_data, write_config


def val_dir(tmp_path):
    """Held-out speakers v0-v2, two utterances each, every pair a trial."""
    utts = [f"v{s}-{u}" for s in range(3) for u in range(2)]
    pairs = [(a, b) for i, a in enumerate(utts) for b in utts[i + 1 :]]
    trials = "".join(f"{a} {b} {'target' if a[:2] == b[:2] else 'nontarget'}\n" for a, b in pairs)
    return make_data_dir(tmp_path / "val", {u: u[:2] for u in utts}, seconds=0.6, seed=3, trials=trials)


def config(tmp_path, pretrained_exp, patience=0, epochs=3, frozen=0):
    train = {"init": str(pretrained_exp), "epochs": epochs, "keep_best": True, "patience": patience}
    train["freeze"] = [{"modules": ["trunk"], "until_epoch": frozen}] if frozen else []
    return write_config(tmp_path, new_data(tmp_path), data={"val": str(val_dir(tmp_path))}, train=train)


def scripted(monkeypatch, eers):
    """Validation EERs in this order instead of measured ones: epoch 0 (the start), 1, 2, ..."""
    calls = []

    def fake(run, epoch):
        calls.append(epoch)
        return eers[len(calls) - 1]

    monkeypatch.setattr(selection, "measure", fake)
    return calls


def test_the_rule_keeps_the_lowest_and_counts_the_validations_since():
    sel = Selection()
    assert [sel.update(e, k) for k, e in enumerate([0.3, 0.2, 0.2, 0.25, 0.1])] == [True, True, False, False, True]
    assert (sel.best_eer, sel.best_epoch, sel.start_eer, sel.since_best) == (0.1, 4, 0.3, 0)
    sel.update(0.4, 5)
    assert sel.since_best == 1 and not sel.stopped(0) and not sel.stopped(2) and sel.stopped(1)
    assert Selection.from_dict(sel.to_dict()) == sel


def test_the_best_epoch_is_the_result_and_a_plateau_stops_the_run(tiny_model, tmp_path, monkeypatch):
    calls = scripted(monkeypatch, [0.30, 0.20, 0.25, 0.22, 0.1])
    exp = tmp_path / "exp"
    args = ["--config", config(tmp_path, tiny_model.exp, patience=2, epochs=5), "--exp-dir", str(exp)]
    assert train_main(args) == 0
    assert calls == [0, 1, 2, 3]  # epochs 4 and 5 never ran
    log = (exp / "train.log").read_text()
    assert "epoch 0 (the model the run starts from): validation EER 30.00%" in log
    assert "epoch 1: validation EER 20.00%, the best so far (checkpoints/best.pt)" in log
    assert "epoch 3: validation EER 22.00% (best 20.00% after epoch 1; 2 of train.patience 2)" in log
    assert "stopped early after epoch 3 of 5, 6 steps: no validation EER below 20.00% (epoch 1) in 2 validations" in log
    assert f"the run's result: {exp / 'checkpoints' / 'best.pt'}, epoch 1, validation EER 20.00%; 30.00% before" in log
    best = load_checkpoint(exp / "checkpoints" / "best.pt")
    assert best.epoch == 1 and best.resume is None
    epoch1 = load_checkpoint(exp / "checkpoints" / "epoch_001.pt")
    assert all(torch.equal(best.model[k], v) for k, v in epoch1.model.items())
    assert run_result(exp)[0] == exp / "checkpoints" / "best.pt"
    # Run again: it stays stopped (no step, no validation), and says so.
    steps = max(losses(exp))
    assert train_main(args) == 0
    assert calls == [0, 1, 2, 3] and max(losses(exp)) == steps
    assert (exp / "train.log").read_text().count("stopped early after epoch 3 of 5") == 2


def test_a_run_that_does_not_help_hands_back_its_start_and_says_so(tiny_model, tmp_path, monkeypatch):
    scripted(monkeypatch, [0.10, 0.12, 0.15])
    exp = tmp_path / "exp"
    assert train_main(["--config", config(tmp_path, tiny_model.exp, epochs=2), "--exp-dir", str(exp)]) == 0
    line = [x for x in (exp / "train.log").read_text().splitlines() if "training did not help" in x]
    assert len(line) == 1 and line[0].endswith(
        "training did not help: validation EER 10.00% before it and none lower after any of 2 validated epochs "
        f"(the last: 15.00%); the run hands back the model it started from ({exp / 'checkpoints' / 'best.pt'})"
    )
    best, start = load_checkpoint(exp / "checkpoints" / "best.pt"), load_checkpoint(exp / "pretrained.pt")
    assert best.epoch == 0 and all(torch.equal(best.model[k], v) for k, v in start.model.items())


def test_the_frozen_start_is_neither_validated_nor_counted(tiny_model, tmp_path, monkeypatch):
    """With the trunk frozen for 2 epochs the model of epochs 1-2 is the start's: patience 1 must not stop the run
    there."""
    calls = scripted(monkeypatch, [0.30, 0.20, 0.25])
    exp = tmp_path / "exp"
    assert train_main(["--config", config(tmp_path, tiny_model.exp, 1, 4, frozen=2), "--exp-dir", str(exp)]) == 0
    assert calls == [0, 3, 4]
    log = (exp / "train.log").read_text()
    for epoch in (1, 2):  # 16 utterances in batches of 8: 2 steps an epoch
        line = f"epoch {epoch}: not validated: the embedding model is still the start's (frozen: trunk until step 4)"
        assert line in log
    assert "training done: 4 epochs" in log and "epoch 3, validation EER 20.00%" in log


def test_selection_resumes_exactly_even_when_stopped_between_an_epoch_and_its_validation(tiny_model, tmp_path):
    """Measured EERs this time. Run b is interrupted inside epoch 1, after epoch 2's checkpoint but before its
    validation (a crash there), and resumed each time: the same losses, validation EERs, selection and best.pt as
    the uninterrupted run a."""
    cfg = config(tmp_path, tiny_model.exp, epochs=3)
    assert train_main(["--config", cfg, "--exp-dir", str(tmp_path / "a")]) == 0
    b = ["--config", cfg, "--exp-dir", str(tmp_path / "b")]
    assert train_main([*b, "--max-steps", "1"]) == 0
    real = selection.measure

    def crash_at_epoch_2(run, epoch):
        if epoch == 2:
            raise KeyboardInterrupt
        return real(run, epoch)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(selection, "measure", crash_at_epoch_2)
        with pytest.raises(KeyboardInterrupt):
            train_main(b)
    assert load_checkpoint(tmp_path / "b" / "checkpoints" / "epoch_002.pt").resume.selection["last_epoch"] == 1
    assert train_main(b) == 0
    log = (tmp_path / "b" / "train.log").read_text()
    resumed = f"resumed from {tmp_path / 'b' / 'checkpoints' / 'epoch_002.pt'}"
    assert log.index("epoch 2: validation EER") > log.index(resumed)
    la, lb = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert sorted(la) == sorted(lb)
    for step in la:
        assert lb[step] == pytest.approx(la[step], rel=1e-6, abs=1e-7), step

    def outcome(exp):
        last = max((exp / "checkpoints").glob("epoch_*.pt"))
        log = (exp / "train.log").read_text().replace(str(exp), "EXP").splitlines()
        lines = [x.split("] ", 1)[-1] for x in log if "validation EER" in x]
        return last.name, load_checkpoint(last).resume.selection, lines

    a, b_ = outcome(tmp_path / "a"), outcome(tmp_path / "b")
    assert a[:2] == b_[:2] and a[2][-1] == b_[2][-1] and set(a[2]) == set(b_[2])
    best_a, best_b = (load_checkpoint(tmp_path / e / "checkpoints" / "best.pt") for e in ("a", "b"))
    assert best_a.epoch == best_b.epoch == a[1]["best_epoch"]
    for key in best_a.model:
        torch.testing.assert_close(best_a.model[key], best_b.model[key], rtol=1e-6, atol=1e-7)


def test_without_keep_best_or_without_data_val_nothing_is_selected(tiny_model, tmp_path):
    exp = tmp_path / "plain"
    cfg = config(tmp_path, tiny_model.exp, epochs=1)
    assert train_main(["--config", cfg, "--exp-dir", str(exp), "train.keep_best=false"]) == 0
    log = (exp / "train.log").read_text()
    assert "epoch 1: validation EER" in log and "epoch 0" not in log and "result" not in log
    assert not (exp / "checkpoints" / "best.pt").exists()
    assert run_result(exp)[0] == exp / "checkpoints" / "epoch_001.pt"
    exp = tmp_path / "noval"
    assert train_main(["--config", cfg, "--exp-dir", str(exp), "data.val=null"]) == 0
    assert "validation" not in (exp / "train.log").read_text() and not (exp / "checkpoints" / "best.pt").exists()
