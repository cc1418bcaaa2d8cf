"""A run's checkpoints: what it writes at a step, and how it starts again from one (resume; a fresh run
with `train.init` starts from a pretrained model: speakerlab.train.state.init). The file schema itself is
speakerlab.checkpoint's."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from speakerlab.checkpoint import (
    Checkpoint,
    ResumeState,
    load_latest,
    prune_checkpoints,
    run_checkpoints,
    save_checkpoint,
)
from speakerlab.config import Config
from speakerlab.frontends import FeatureSpec, feature_spec, section_keys
from speakerlab.models import SSLModel
from speakerlab.settings import upgrade_renamed
from speakerlab.train.build import Run
from speakerlab.train.losses.sharded_state import head_state, load_optimizer_state, optimizer_state
from speakerlab.train.optim.freeze import same_freeze
from speakerlab.train.state.init import initialise
from speakerlab.train.state.validation import Selection


def checkpoint_of(run: Run, step_in_epoch: int) -> Optional[Checkpoint]:
    """Everything to rebuild the model alone (name, arguments, weights, features) and to resume the run. Every
    rank calls it (a classifier sharded over the ranks is gathered in full, speakerlab.train.losses.sharded_state);
    rank 0 gets the checkpoint, the others None."""
    cfg = run.cfg
    classifier = head_state(run.raw.classifier)
    optimizer = optimizer_state(run.optimizer, run.raw.classifier)
    if not run.info.is_main:
        return None
    resume = ResumeState(
        optimizer=optimizer,
        scaler=run.scaler.state_dict(),
        step_in_epoch=step_in_epoch,
        skipped_steps=run.guard.total,
        rng_cpu=torch.get_rng_state(),
        rng_cuda=torch.cuda.get_rng_state_all() if run.device.type == "cuda" else [],
        selection=run.state.selection.to_dict(),
    )
    model = run.raw.model
    # A model whose arguments name files (an SSL encoder's pretrained directory) says how to rebuild it alone.
    args = model.standalone_args() if isinstance(model, SSLModel) else dict(cfg.model.args)
    return Checkpoint(
        model_name=cfg.model.name,
        model_args=args,
        model=model.state_dict(),
        features=feature_spec(cfg.features, cfg.data.sample_rate),
        speakers=list(run.speakers),
        classifier=classifier,
        step=run.state.step,
        epoch=run.state.epoch,
        resume=resume,
        config=cfg.to_dict(),
    )


def save(run: Run, name: str, step_in_epoch: int = 0) -> None:
    """Rank 0 writes `<exp>/checkpoints/<name>` (atomically); every rank calls it (see checkpoint_of)."""
    ckpt = checkpoint_of(run, step_in_epoch)
    if ckpt is not None:
        save_checkpoint(run.ckpt_dir / name, ckpt)


def save_mid_epoch(run: Run, step_in_epoch: int) -> None:
    """`partial_NNN.pt` of the epoch in progress (NNN = its 1-based number), overwritten."""
    save(run, f"partial_{run.state.epoch + 1:03d}.pt", step_in_epoch)


def save_best(run: Run) -> None:
    """`best.pt`: the model now, the run's result so far under model selection (speakerlab.train.state.selection);
    no resume state (it is a result, not a place to resume from). Every rank calls it (see checkpoint_of)."""
    ckpt = checkpoint_of(run, 0)
    if ckpt is not None:
        save_checkpoint(run.ckpt_dir / "best.pt", dataclasses.replace(ckpt, resume=None))


def save_epoch_end(run: Run) -> None:
    """The epoch checkpoint; mid-epoch ones are now stale; only the newest `keep_checkpoints` stay."""
    save(run, f"epoch_{run.state.epoch:03d}.pt")
    if run.info.is_main:
        for p in run_checkpoints(run.ckpt_dir):
            if not p.name.startswith("epoch_"):
                p.unlink(missing_ok=True)
        prune_checkpoints(run.ckpt_dir, run.cfg.train.keep_checkpoints)


class ScheduleChanged(RuntimeError):
    """Resuming would silently continue a different schedule or data order; the message shows how."""


class RunMismatch(RuntimeError):
    """The exp dir's checkpoint cannot continue as this run at all (another model or speaker list, or no
    resume state): no flag helps, only another exp dir."""


NEW_EXP_DIR = "use a new --exp-dir (a recipe's --exp DIR), or delete {exp} to start that run again"


def speaker_change(before: List[str], now: List[str]) -> str:
    """How two speaker lists differ, in words: counts gone and new with an example, or the order."""
    gone, new = [s for s in before if s not in set(now)], [s for s in now if s not in set(before)]
    if not gone and not new:
        return f"the same {len(now)} speakers in another order"
    parts = [f"{len(gone)} of its {len(before)} speakers are gone" + (f" (e.g. '{gone[0]}')" if gone else "")]
    parts.append(f"{len(new)} of the {len(now)} now are new" + (f" (e.g. '{new[0]}')" if new else ""))
    return ", ".join(parts)


def _load_weights(run: Run, ckpt: Checkpoint, path) -> None:
    """Model and classifier weights of the run's own checkpoint (same model and speakers); RunMismatch
    naming what differs otherwise."""
    hint = NEW_EXP_DIR.format(exp=run.exp_dir)
    if ckpt.model_name != run.cfg.model.name:
        raise RunMismatch(f"{path} holds model {ckpt.model_name}, this command builds {run.cfg.model.name}; {hint}")
    if ckpt.speakers != run.speakers:
        raise RunMismatch(
            f"{path} was trained on another speaker list than {run.cfg.data.train or 'the shards'} holds now: "
            f"{speaker_change(ckpt.speakers, run.speakers)} (the training data changed since); {hint}"
        )
    if ckpt.classifier is None:
        raise RunMismatch(f"{path} has no classifier weights; {hint}")
    try:
        run.raw.model.load_state_dict(ckpt.model)
        run.raw.classifier.load_state_dict(ckpt.classifier)  # a sharded head takes its own rows of it
    except RuntimeError:  # model.args changed under --force-new-schedule: the shapes differ
        raise RunMismatch(
            f"{path}: its weights do not fit the {run.cfg.model.name} this command builds (other model.args); {hint}"
        ) from None


# Settings a resumed run must share with its checkpoint: they define the schedule (LR, margin, steps per
# epoch) or the data order. The hardware section is free to change: results do not depend on it.
SCHEDULE_KEYS = (
    "model.name",
    "model.args",
    "loss.name",
    "data.train",
    "data.crop_seconds",
    "data.shards",
    "data.shuffle_buffer",
    "train.global_batch_size",
    "train.epochs",
    "train.seed",
    "optim.name",
    "optim.lr",
    "optim.min_lr",
    "optim.warmup_epochs",
    "optim.backbone_lr_scale",
    "train.freeze",
    "optim.encoder_lr_scale",
    "optim.layer_decay",
    "loss.scale",
    "loss.margin",
    "loss.margin_start_epoch",
    "loss.margin_warmup_epochs",
    "loss.subcenters",
    "loss.inter_topk",
    "loss.inter_topk_margin",
    "loss.sample_rate",
)


# Keys whose values are compared by meaning: `same(checkpoint value, value now)`.
SAME_SCHEDULE = {"train.freeze": same_freeze}


def schedule_changes(stored: dict, now: dict) -> list:
    """`key: checkpoint value -> value now` for every SCHEDULE_KEYS entry that differs (plain config dicts).
    A checkpoint's renamed keys are read under their new names (train.freeze_epochs and
    train.freeze_encoder_steps as train.freeze); a key the checkpoint's config does not have (written before
    the key existed) is not compared."""
    missing = object()
    stored = upgrade_renamed(Config, stored)

    def get(d, key):
        for part in key.split("."):
            d = d.get(part, missing) if isinstance(d, dict) else missing
        return d

    def same(key, a, b) -> bool:
        return SAME_SCHEDULE[key](a, b) if key in SAME_SCHEDULE else a == b

    return [
        f"{k}: {get(stored, k)!r} in the checkpoint -> {get(now, k)!r} now"
        for k in SCHEDULE_KEYS
        if get(stored, k) is not missing and not same(k, get(stored, k), get(now, k))
    ]


def front_end_changes(stored: Optional[FeatureSpec], now: FeatureSpec) -> list:
    """`features.<key>: checkpoint value -> value now` for each key of the front-end that differs: the model learnt
    on the checkpoint's features, so another front-end is a change of the run like another model.args."""
    if stored is None or stored == now:
        return []
    try:
        a, b = section_keys(stored), section_keys(now)
    except ValueError:
        return [f"features: {stored.describe()} in the checkpoint -> {now.describe()} now"]
    return [
        f"features.{k}: {a.get(k)!r} in the checkpoint -> {b.get(k)!r} now" for k in {**a, **b} if a.get(k) != b.get(k)
    ]


def run_changes(ckpt: Checkpoint, cfg: Config) -> list:
    """What differs between the settings of a run's checkpoint and `cfg`, in the terms resuming refuses."""
    changes = schedule_changes(ckpt.config, cfg.to_dict()) if ckpt.config else []
    return changes + front_end_changes(ckpt.features, feature_spec(cfg.features, cfg.data.sample_rate))


def schedule_refusal(exp_dir, changes: list) -> str:
    return (
        f"{exp_dir} was trained with other settings than this command's ({'; '.join(changes)}): "
        "resuming would continue a different schedule or data order; run the original command, use a new "
        "--exp-dir, or pass --force-new-schedule (a recipe: add it to --train_overrides) to continue these "
        "weights under the new settings"
    )


def restore_cuda_rng(states: list, device: torch.device, log) -> None:
    """Set the CUDA random state of each GPU the checkpoint has one for and this process sees.

    Runs move between nodes: a checkpoint of 4 GPUs resumed on 1 (or on the CPU, or the other way round)
    restores what exists and says once what does not (the other GPUs start from the run's seed). The
    data order and the global batch do not depend on the number of processes (GlobalBatchSampler), so
    the run continues the same schedule; only device-side random draws (fbank dither) can differ."""
    here = torch.cuda.device_count() if device.type == "cuda" else 0
    for index, state in enumerate(states[:here]):
        torch.cuda.set_rng_state(state.cpu(), index)
    if len(states) != here:
        log(
            f"WARNING: the checkpoint holds the CUDA random state of {len(states)} GPU(s), this run has {here}: "
            f"restored {min(len(states), here)}; device-side random draws (fbank dither) of the others differ "
            "from an uninterrupted run"
        )


def resume(run: Run, force_new_schedule: bool = False) -> int:
    """Restore the latest checkpoint of the run, if any (else start from `train.init`, if set); return the
    step within its epoch to continue from.

    Settings that change the schedule or the data order (SCHEDULE_KEYS) must match the checkpoint's,
    else ScheduleChanged, unless `force_new_schedule`: then weights, optimizer and completed epochs are
    kept and the interrupted epoch starts again from its beginning under the new settings."""
    found = load_latest(run.ckpt_dir, run.device, warn=run.monitor.log)
    if found is None:
        if run.cfg.train.init:
            initialise(run)
        return 0
    run.init = None  # the run's own checkpoint wins over train.init: no copy of its weights kept for nothing
    path, ckpt = found
    changes = run_changes(ckpt, run.cfg)
    if changes and not force_new_schedule:
        raise ScheduleChanged(schedule_refusal(run.exp_dir, changes))
    if ckpt.resume is None:
        raise RunMismatch(
            f"{path} holds no resume state (an averaged or exported checkpoint); {NEW_EXP_DIR.format(exp=run.exp_dir)}"
        )
    _load_weights(run, ckpt, path)
    scales = [g.get("lr_scale", 1.0) for g in run.optimizer.param_groups]
    load_optimizer_state(run.optimizer, ckpt.resume.optimizer, run.raw.classifier)
    for group, scale in zip(run.optimizer.param_groups, scales):  # this run's, not the file's (older files lack it)
        group["lr_scale"] = scale
    run.scaler.load_state_dict(ckpt.resume.scaler)
    run.state.step, run.state.epoch, run.guard.total = ckpt.step, ckpt.epoch, ckpt.resume.skipped_steps
    run.state.selection = Selection.from_dict(ckpt.resume.selection)
    torch.set_rng_state(ckpt.resume.rng_cpu.cpu())
    restore_cuda_rng(ckpt.resume.rng_cuda, run.device, run.monitor.log)
    if changes:
        run.state.step = run.state.epoch * run.steps_per_epoch
        run.monitor.log(
            f"--force-new-schedule: {'; '.join(changes)}; epoch {run.state.epoch + 1} starts again "
            f"at global step {run.state.step}"
        )
        run.monitor.log(f"resumed from {path}: epoch {run.state.epoch}, step {run.state.step}")
        return 0
    run.monitor.log(f"resumed from {path}: epoch {run.state.epoch}, step {run.state.step}")
    return ckpt.resume.step_in_epoch
