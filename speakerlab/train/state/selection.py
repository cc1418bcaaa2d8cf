"""Validation while training, and model selection on it (train.keep_best, train.patience).

With data.val every validated epoch logs its EER (`val/eer`). With train.keep_best as well:

- before the first step of a run started from train.init, the starting model is measured (epoch 0);
- after each validated epoch (its checkpoint written first, and again with the selection once it is
  measured) the EER is compared with the best so far (`validation.Selection`: strictly lower wins, ties keep
  the earlier model); a new best is written to `<exp>/checkpoints/best.pt` (the model and its classifier, no
  resume state), the run's result (`speakerlab.checkpoint.run_result`);
- after train.patience validations in a row without a new best the run stops early, and stays stopped when
  the command is run again; epochs of the frozen start (a train.freeze rule on trunk: the embedding model is
  still the start's) are not validated, so they count for nothing;
- the run ends with one line saying which model is its result; when no epoch beat the start, that line says
  the run did not help and hands back the starting model.

Validation runs on every rank, each embedding its part of the utterances (rank 0 scores them), with the random
streams set aside (`torch.random.fork_rng`), so it draws nothing from them, and its EER is shared with every rank;
the selection state is saved in each checkpoint's resume state, so a resumed run decides exactly as an
uninterrupted one.
"""

from __future__ import annotations

from typing import Optional

import torch

from speakerlab.frontends import feature_spec
from speakerlab.inference.embedder import NonFiniteEmbedding
from speakerlab.train.build import Run
from speakerlab.train.optim.freeze import describe, trunk_frozen_until
from speakerlab.train.state.resume import save_best, save_epoch_end
from speakerlab.train.state.validation import parts_path, same_model, shared, validation_eer


def measure(run: Run, epoch: int) -> Optional[float]:
    """The validation EER of the model now (every rank embeds its part, rank 0 scores, every rank gets the EER;
    None when an embedding was not finite: logged, and training goes on)."""
    cfg, eer = run.cfg, None
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    devices = [run.device] if run.device.type == "cuda" else []
    same_model(run.raw.model, run.info)
    with torch.random.fork_rng(devices=devices, device_type=run.device.type):
        try:
            eer = validation_eer(run.raw.model, spec, cfg.data.val, run.device, parts_path(run, "val"), run.info)
        except NonFiniteEmbedding as e:
            run.monitor.log(f"epoch {epoch}: no validation EER: {e}")
    eer = shared(eer, run.info.enabled, run.device)
    if eer is not None:
        run.monitor.scalars({"eer": eer * 100}, run.state.step, prefix="val")
    return eer


def selecting(run: Run) -> bool:
    return bool(run.cfg.train.keep_best and run.cfg.data.val)


def due(run: Run, epoch: int) -> bool:
    """Whether the end of `epoch` (1-based, completed) is validated: every train.val_every epochs and the last."""
    cfg = run.cfg
    return bool(cfg.data.val) and epoch > 0 and (epoch % cfg.train.val_every == 0 or epoch == cfg.train.epochs)


def validate_start(run: Run, step_in_epoch: int) -> None:
    """Before the first step of a fresh run from train.init: epoch 0, the model it starts from. After a resume
    at the end of an epoch whose checkpoint lacks that epoch's validation (the run was stopped between writing
    the checkpoint and writing it again with the validation): that validation, and the checkpoint again."""
    if not selecting(run):
        return
    sel, epoch = run.state.selection, run.state.epoch
    if run.state.step == 0 and run.cfg.train.init and sel.best_epoch < 0:
        eer = measure(run, 0)
        if eer is not None:
            sel.update(eer, 0)
            save_best(run)
            run.monitor.log(f"epoch 0 (the model the run starts from): validation EER {eer * 100:.2f}%")
    elif step_in_epoch == 0 and due(run, epoch) and sel.last_epoch < epoch:
        if validate_epoch(run):
            save_epoch_end(run)


def frozen_through(run: Run, epoch: int) -> bool:
    """Whether the embedding model stayed the start's all through `epoch` (the frozen start of a run from
    train.init: only the classifier trained). Such an epoch's validation EER is the start's; counting it
    would stop a run on a plateau before its trunk ever trained. The one place selection reads the freeze."""
    return epoch * run.steps_per_epoch <= trunk_frozen_until(run.cfg.train.freeze, run.steps_per_epoch)


def validate_epoch(run: Run) -> bool:
    """After a completed epoch, when validation is due: its EER, logged, and with keep_best the selection
    updated (a new best written to best.pt). True when the selection changed (the epoch checkpoint is then
    written again, with it)."""
    cfg, epoch = run.cfg, run.state.epoch
    if not due(run, epoch):
        return False
    if selecting(run) and frozen_through(run, epoch):
        frozen = describe(cfg.train.freeze, frozenset({"trunk"}), run.steps_per_epoch)
        run.monitor.log(f"epoch {epoch}: not validated: the embedding model is still the start's ({frozen})")
        return False
    eer = measure(run, epoch)
    if eer is None:
        return False
    if not selecting(run):
        run.monitor.log(f"epoch {epoch}: validation EER {eer * 100:.2f}%")
        return False
    sel = run.state.selection
    if sel.update(eer, epoch):
        save_best(run)
        run.monitor.log(f"epoch {epoch}: validation EER {eer * 100:.2f}%, the best so far (checkpoints/best.pt)")
    else:
        patience = f"; {sel.since_best} of train.patience {cfg.train.patience}" if cfg.train.patience else ""
        run.monitor.log(
            f"epoch {epoch}: validation EER {eer * 100:.2f}% (best {sel.best_eer * 100:.2f}% after epoch "
            f"{sel.best_epoch}{patience})"
        )
    return True


def stopped(run: Run) -> bool:
    """Whether the run has stopped early (train.patience validations without a new best)."""
    return selecting(run) and run.state.selection.stopped(run.cfg.train.patience)


def outcome(run: Run) -> str:
    """The line that ends a run with keep_best: which model is its result, and whether training helped."""
    sel, where = run.state.selection, run.ckpt_dir / "best.pt"
    if sel.best_epoch < 0:
        return "no validation EER was measured: the run's result is its last checkpoint"
    if sel.best_epoch == 0:
        epochs = f"any of {sel.since_best} validated epochs" if sel.since_best > 1 else "the one validated epoch"
        return (
            f"training did not help: validation EER {sel.best_eer * 100:.2f}% before it and none lower after "
            f"{epochs} (the last: {sel.last_eer * 100:.2f}%); the run hands back the model it started from ({where})"
        )
    start = f"; {sel.start_eer * 100:.2f}% before training" if sel.start_eer is not None else ""
    return f"the run's result: {where}, epoch {sel.best_epoch}, validation EER {sel.best_eer * 100:.2f}%{start}"
