"""Train a speaker-embedding model.

    python -m speakerlab.train --config conf/mini_campplus.yaml --exp-dir exp/mini [--hardware cpu] [train.epochs=2 ...]
    torchrun --nproc_per_node=4 -m speakerlab.train --config ... --exp-dir ...

Re-running the same command resumes from the latest checkpoint under <exp-dir>/checkpoints.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import torch

from speakerlab.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint
from speakerlab.config import Config, ConfigError, load_config, save_config
from speakerlab.engine import distributed as dist_utils
from speakerlab.engine.monitor import Meter, Monitor
from speakerlab.engine.precision import resolve_device, resolve_precision
from speakerlab.engine.setup import (build_augmenter, build_frontend, build_net, build_optimizer, choose_plan,
                                     class_names, cuda_probe, load_train_data, make_fbank, make_loader, seed_everything)
from speakerlab.engine.stability import NonFiniteGuard, TrainingStopped
from speakerlab.engine.validation import validation_eer
from speakerlab.features import num_frames
from speakerlab.lists import ListError
from speakerlab.schedules import lr_at, margin_at


@dataclass
class Run:
    """Everything an epoch needs; `step` is the global optimizer step (the schedules' clock)."""
    cfg: Config
    exp_dir: Path
    info: dist_utils.DistInfo
    device: torch.device
    precision: object
    net: torch.nn.Module          # DDP-wrapped when distributed
    raw: torch.nn.Module          # the SpeakerNet itself
    optimizer: torch.optim.Optimizer
    scaler: object
    frontend: torch.nn.Module     # loader batch -> (features, labels): speakerlab.augment_batch.Frontend
    loader: object
    sampler: object
    plan: object
    monitor: Monitor
    speakers: List[str]
    guard: NonFiniteGuard
    steps_per_epoch: int
    step: int = 0
    epoch: int = 0

    @property
    def ckpt_dir(self) -> Path:
        return self.exp_dir / "checkpoints"


def setup(cfg: Config, exp_dir: Path) -> Run:
    device = resolve_device(cfg.hardware.device, 0)
    info = dist_utils.init_distributed(device.type, cfg.hardware.dist_timeout_s)
    device = resolve_device(cfg.hardware.device, info.local_rank)
    monitor = Monitor(exp_dir, enabled=info.is_main)
    precision = resolve_precision(cfg.hardware.precision, device, cfg.hardware.tf32)
    seed_everything(cfg.train.seed)
    with dist_utils.main_process_first(info):  # rank 0 validates lists and audio first
        log = monitor.log if info.is_main else (lambda m: None)
        data = load_train_data(cfg, log)
        augmenter = build_augmenter(cfg, log)
    speakers = class_names(cfg, data.speakers)
    net = build_net(cfg, len(speakers), precision.autocast).to(device)
    fbank = make_fbank(cfg, device)
    frontend = build_frontend(cfg, fbank, len(data.speakers))
    crop_frames = num_frames(int(round(cfg.data.crop_seconds * cfg.data.sample_rate)), fbank.config)
    probe = cuda_probe(net, crop_frames, cfg.features.num_mel_bins, len(speakers), device,
                       cfg.hardware.memory_margin) if device.type == "cuda" else None
    plan = choose_plan(cfg, info, device, probe, monitor.log)
    pin = cfg.hardware.pin_memory and device.type == "cuda"
    loader, sampler = make_loader(cfg, data, {s: i for i, s in enumerate(speakers)}, plan, info, pin, augmenter)
    dist_utils.check_shared_memory(cfg.hardware.num_workers, plan.per_device * loader.dataset.crop_samples * 4,
                                   cfg.hardware.prefetch_factor, max(1, torch.cuda.device_count()) if device.type == "cuda" else info.world_size,
                                   monitor.log)
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None) \
        if info.enabled else net
    run = Run(cfg, exp_dir, info, device, precision, ddp, net, build_optimizer(cfg, net), precision.grad_scaler(),
              frontend, loader, sampler, plan, monitor, speakers, NonFiniteGuard(cfg.train.max_consecutive_skips),
              sampler.steps_per_epoch)
    monitor.log(f"{precision.describe()}; {plan.describe()}; {run.steps_per_epoch} steps/epoch; "
                f"model {cfg.model.name} {sum(p.numel() for p in net.model.parameters()):,} params")
    return run


def checkpoint_state(run: Run, step_in_epoch: int) -> dict:
    return {"model_name": run.cfg.model.name, "model_args": dict(run.cfg.model.args),
            "model": run.raw.model.state_dict(), "classifier": run.raw.classifier.state_dict(),
            "optimizer": run.optimizer.state_dict(), "scaler": run.scaler.state_dict(),
            "step": run.step, "epoch": run.epoch, "step_in_epoch": step_in_epoch,
            "skipped_steps": run.guard.total, "speakers": list(run.speakers), "config": run.cfg.to_dict(),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if run.device.type == "cuda" else []}


def save(run: Run, name: str, step_in_epoch: int) -> None:
    if run.info.is_main:
        save_checkpoint(run.ckpt_dir / name, checkpoint_state(run, step_in_epoch))


def init_from(run: Run, path: str) -> None:
    """Fine-tuning start: model and classifier weights of another run (same model, same speakers)."""
    ck = load_checkpoint(path, map_location=run.device)
    if ck["model_name"] != run.cfg.model.name or ck["speakers"] != run.speakers:
        raise RuntimeError(f"train.init_from {path}: trained with another model or speaker list")
    run.raw.model.load_state_dict(ck["model"])
    run.raw.classifier.load_state_dict(ck["classifier"])
    run.monitor.log(f"initialised from {path} (epoch {ck['epoch']}, step {ck['step']})")


def resume(run: Run) -> int:
    """Restore the latest checkpoint, if any; return the step within its epoch to continue from."""
    path = latest_checkpoint(run.ckpt_dir)
    if path is None:
        if run.cfg.train.init_from:
            init_from(run, run.cfg.train.init_from)
        return 0
    ck = load_checkpoint(path, map_location=run.device)
    if ck["model_name"] != run.cfg.model.name or ck["speakers"] != run.speakers:
        raise RuntimeError(f"{path} was trained with another model or speaker list; use a new --exp-dir")
    run.raw.model.load_state_dict(ck["model"])
    run.raw.classifier.load_state_dict(ck["classifier"])
    run.optimizer.load_state_dict(ck["optimizer"])
    run.scaler.load_state_dict(ck["scaler"])
    run.step, run.epoch, run.guard.total = ck["step"], ck["epoch"], ck["skipped_steps"]
    torch.set_rng_state(ck["rng_cpu"].cpu())
    if ck["rng_cuda"] and run.device.type == "cuda":
        torch.cuda.set_rng_state_all([s.cpu() for s in ck["rng_cuda"]])
    run.monitor.log(f"resumed from {path}: epoch {run.epoch}, step {run.step}")
    return ck["step_in_epoch"]


def set_schedules(run: Run, total_steps: int) -> tuple:
    o, l = run.cfg.optim, run.cfg.loss
    lr = lr_at(run.step, total_steps, int(o.warmup_epochs * run.steps_per_epoch), o.lr, o.min_lr)
    margin = margin_at(run.step, run.steps_per_epoch, l.margin, l.margin_start_epoch, l.margin_warmup_epochs)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    run.raw.classifier.set_margin(margin)
    return lr, margin


def train_epoch(run: Run, start: int, stop_at: Optional[int]) -> bool:
    """One epoch from step `start` within it; returns False when global step `stop_at` ended it early."""
    cfg, accum = run.cfg, run.plan.accumulation
    total_steps = cfg.train.epochs * run.steps_per_epoch
    run.sampler.set_epoch(run.epoch, start)
    run.net.train()
    meter, step_in_epoch = Meter(), start
    params = [p for p in run.raw.parameters() if p.requires_grad]
    bar = run.monitor.progress(run.steps_per_epoch, start, f"epoch {run.epoch + 1}/{cfg.train.epochs}")
    t_log = t_ready = time.perf_counter()
    wait, pending = 0.0, []
    # Loss and hits accumulate on the device; the host reads them once per optimizer step.
    stats, seen = torch.zeros(2, device=run.device), 0
    for micro, batch in enumerate(run.loader):
        wait += time.perf_counter() - t_ready
        if micro % accum == 0:
            lr, margin = set_schedules(run, total_steps)
        feats, labels = run.frontend(batch)
        index = batch["index"]
        pending.append((index, run.guard.nonfinite_rows(feats)))
        last = (micro + 1) % accum == 0
        sync = contextlib.nullcontext() if last or not run.info.enabled else run.net.no_sync()
        with sync:
            loss, cos = run.net(feats, labels)
            run.scaler.scale(loss / accum).backward()
        stats += torch.stack([loss.detach().float() / accum, (cos.argmax(1) == labels).sum().float()])
        seen += labels.numel()
        if not last:
            t_ready = time.perf_counter()
            continue
        run.scaler.unscale_(run.optimizer)
        max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
        loss_sum, correct = stats.tolist()
        ok = run.guard.check(run, loss_sum, grad_norm, pending)  # consistent across ranks
        if ok:
            run.scaler.step(run.optimizer)
        run.scaler.update()
        run.optimizer.zero_grad(set_to_none=True)
        run.step += 1
        step_in_epoch += 1
        if ok:
            meter.add(loss=loss_sum, accuracy=correct / seen, grad_norm=grad_norm)
        stats.zero_()
        seen, pending = 0, []
        if bar is not None:
            bar.update(1)
        if run.step % cfg.train.log_every_steps == 0 or step_in_epoch == run.steps_per_epoch:
            log_step(run, meter, lr, margin, wait, time.perf_counter() - t_log)
            wait, t_log = 0.0, time.perf_counter()
        if cfg.train.save_every_steps and run.step % cfg.train.save_every_steps == 0 \
                and step_in_epoch < run.steps_per_epoch:
            save(run, "latest.pt", step_in_epoch)
        if stop_at is not None and run.step >= stop_at and step_in_epoch < run.steps_per_epoch:
            save(run, "latest.pt", step_in_epoch)
            run.monitor.end_progress()
            return False
        t_ready = time.perf_counter()
    run.monitor.end_progress()
    return True


def log_step(run: Run, meter: Meter, lr: float, margin: float, wait: float, elapsed: float) -> None:
    steps = meter.count
    values = meter.reset() or {}
    values = dist_utils.all_reduce_mean({**values, "data_wait_fraction": wait / max(elapsed, 1e-9)}, run.info, run.device)
    values.update(lr=lr, margin=margin, skipped_steps=run.guard.total,
                  samples_per_s=max(steps, 1) * run.plan.global_batch / max(elapsed, 1e-9))
    values["loss_scale"] = run.scaler.get_scale() if run.precision.use_scaler else 1.0
    values["peak_memory_gb"] = peak_memory_gb(run.device)
    run.monitor.scalars(values, run.step)
    run.monitor.metrics(values, run.step, epoch=run.epoch)
    if run.info.is_main:
        shown = " ".join(f"{k} {v:.4g}" for k, v in values.items())
        run.monitor.log(f"epoch {run.epoch + 1} step {run.step}: {shown}")


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by tensors; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speakerlab.train", description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, action="append",
                    help="YAML config; repeat to overlay (e.g. --config base.yaml --config conf/finetune_lm.yaml)")
    ap.add_argument("--exp-dir", required=True)
    ap.add_argument("--hardware", help="profile under conf/hardware/ (name) or a YAML file")
    ap.add_argument("--max-steps", type=int, help="stop (with a checkpoint) after this many optimizer steps of "
                    "this invocation, e.g. to fit a cluster time limit; the schedule is unaffected")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.epochs=2")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, hardware=args.hardware)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    exp_dir = Path(args.exp_dir)
    try:
        run = setup(cfg, exp_dir)
    except (ListError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        dist_utils.cleanup()
        return 2
    try:
        if run.info.is_main:
            save_config(cfg, exp_dir / "config.yaml")
        start = resume(run)
        run.monitor.resume_at(run.step)
        val_fbank = make_fbank(cfg, run.device, dither=0.0)
        stop_at = run.step + args.max_steps if args.max_steps else None
        while run.epoch < cfg.train.epochs:
            if not train_epoch(run, start, stop_at):
                run.monitor.log(f"stopped after --max-steps at step {run.step}; re-run to continue")
                return 0
            start, run.epoch = 0, run.epoch + 1
            save(run, f"epoch_{run.epoch:03d}.pt", 0)
            if run.info.is_main:
                (run.ckpt_dir / "latest.pt").unlink(missing_ok=True)
                prune_checkpoints(run.ckpt_dir, cfg.train.keep_checkpoints)
                if cfg.data.val and (run.epoch % cfg.train.val_every == 0 or run.epoch == cfg.train.epochs):
                    eer = validation_eer(run.raw.model, val_fbank, cfg, run.device)
                    run.monitor.scalars({"eer": eer * 100}, run.step, prefix="val")
                    run.monitor.log(f"epoch {run.epoch}: validation EER {eer * 100:.2f}%")
            dist_utils.barrier(run.info)
            if stop_at is not None and run.step >= stop_at and run.epoch < cfg.train.epochs:
                run.monitor.log(f"stopped after --max-steps at step {run.step}; re-run to continue")
                return 0
        run.monitor.log(f"training done: {run.epoch} epochs, {run.step} steps, {run.guard.total} skipped")
        return 0
    except TrainingStopped as e:
        run.monitor.log(f"error: {e}")
        return 3
    finally:
        run.monitor.close()
        dist_utils.cleanup()


if __name__ == "__main__":
    sys.exit(main())
