"""The composition root of training: the one place that sees the whole config. It checks the config
against the model registry, then builds a run's parts from their own settings sections (data,
augmentation, features, model + classifier, optimizer, batch plan, loader) into a `Run`."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn as nn

from speakerlab.config import Config, ConfigError, load_config, needs_labels
from speakerlab.dataio.loaders.batches import GlobalBatchSampler
from speakerlab.dataio.loaders.shard_stream import ShardStream
from speakerlab.dataio.tables.corpora import resolve_corpora
from speakerlab.dataio.waveform.augment import Augmenter, open_augmenter
from speakerlab.dataio.waveform.degrade import channel_augment
from speakerlab.dataio.waveform.speed import speed_speaker_names
from speakerlab.devices import resolve_device, use_threads
from speakerlab.features.spec import build_features
from speakerlab.frontends import feature_spec
from speakerlab.models import build_model, model_args_problems
from speakerlab.sources import Source, input_problem
from speakerlab.train.hardware.batch_plan import (
    BatchPlan,
    CudaMemory,
    MemoryProbe,
    find_max_batch,
    plan_batches,
    probe_sizes,
)
from speakerlab.train.hardware.precision import Precision, resolve_precision
from speakerlab.train.hardware.speedups import apply_switches, resolve_switches
from speakerlab.train.inputs.loader import load_train_lists, make_loader
from speakerlab.train.inputs.pipeline import InputPipeline
from speakerlab.train.launch import distributed as dist_utils
from speakerlab.train.launch.distributed import DistInfo, wrap_ddp
from speakerlab.train.losses.dino import DinoObjective
from speakerlab.train.losses.multicrop import DinoNet, WaveInputs
from speakerlab.train.losses.sharded import Sharded, clip_grad_norm, keep_out_of_ddp, make_head
from speakerlab.train.monitor import Monitor
from speakerlab.train.optim.freeze import check_freeze
from speakerlab.train.optim.groups import check_encoder_settings, parameter_groups
from speakerlab.train.optim.stability import NonFiniteGuard
from speakerlab.train.state.init import resolve_config
from speakerlab.train.state.validation import Selection


def load_train_config(
    paths: Sequence[str], overrides: Sequence[str], hardware: Optional[str]
) -> Tuple[Config, Optional[Source]]:
    """(config, the `train.init` Source read here once, or None; for `build_run`): `load_config`, the sections
    resolve_config completes, and the model arguments checked against the builder's signature, so a typo in
    `model.args` stops here, naming the key, before any work."""
    cfg = load_config(list(paths), list(overrides), hardware=hardware)
    resolve_corpora(cfg.data)  # a manifest read into data.train, so the run records its corpora
    init = resolve_config(cfg)  # a key that conflicts with the pretrained model is named
    problems = model_args_problems(cfg.model.name, cfg.model.args)
    if problems:
        given = f" with overrides {' '.join(overrides)}" if overrides else ""  # the key may come from either
        raise ConfigError(f"config key {problems[0]} in {', '.join(map(str, paths))}{given}")
    return cfg, init


class SpeakerNet(nn.Module):
    """Features -> embedding model -> margin classifier (speakerlab.train.losses.margin, or sharded over the ranks:
    speakerlab.train.losses.sharded), one module so DDP sees every parameter.

    `forward(feats (B, T, F), labels (B,)) -> (loss, (B,) the class of the largest cosine)`; autocast applies to
    the embedding model only: the classifier computes in fp32.
    """

    def __init__(self, model: nn.Module, classifier: nn.Module, autocast: Callable):
        super().__init__()
        self.model, self.classifier, self._autocast = model, classifier, autocast
        # hardware.compile: the compiled `model` (speakerlab.train.hardware.speedups)
        self.compiled: Optional[Callable] = None

    def forward(self, feats: torch.Tensor, labels: torch.Tensor):
        with self._autocast():
            emb = self.model(feats) if self.compiled is None else self.compiled(feats)
        return self.classifier.loss_and_top1(emb, labels)

    def clip_grad_norm(self, params: List[torch.Tensor], max_norm: float, agree: Callable) -> torch.Tensor:
        """Clip the gradients of `params` to a total norm of `max_norm`; returns the norm, a 0-dim tensor (a sharded
        classifier's rows counted over all ranks, through `agree`: speakerlab.train.losses.sharded.clip_grad_norm)."""
        return clip_grad_norm(params, max_norm, self.classifier, agree)

    # What a self-supervised objective (DinoNet) does around the optimizer step; nothing for a classifier.
    def end_step(self, updated: torch.Tensor) -> None:
        """After the optimizer step (`updated`: a 0-dim bool tensor on the device, True when it was taken)."""

    def scalars(self) -> Dict[str, float]:
        """The objective's own values for the log (read every train.log_every_steps)."""
        return {}

    def end_of_run_problem(self) -> Optional[str]:
        """What makes the finished run's model useless (collapsed embeddings), or None."""
        return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_augmenter(cfg: Config, log: Callable[[str], None]) -> Optional[Augmenter]:
    """The training augmenter of `cfg.augment` (its lists checked now, every problem reported at
    once), or None when `augment.lists` is not set. Validation and extraction never augment."""
    a = cfg.augment
    if not a.lists:
        log("augmentation off (augment.lists not set: no noise, music, babble, reverberation or equaliser)")
        return None
    return open_augmenter(a, cfg.data.sample_rate, log)


def build_inputs(cfg: Config, features: nn.Module, num_speakers: int) -> Union[InputPipeline, WaveInputs]:
    """Loader batch -> (features, labels) on the device of `features` (`make_features`): speed, reverb,
    noise, then the front-end; for a self-supervised objective (augmented waves, dataset index)."""
    a, crop = cfg.augment, int(round(cfg.data.crop_seconds * cfg.data.sample_rate))
    pipeline = InputPipeline(
        features,
        crop,
        a.speed_factors if a.speed_prob > 0 else (),
        num_speakers if a.speed_prob > 0 and a.speed_new_speakers and needs_labels(cfg) else None,
        sample_rate=cfg.data.sample_rate,
    )
    return pipeline if needs_labels(cfg) else WaveInputs(pipeline)


def class_names(cfg: Config, speakers: List[str]) -> List[str]:
    """The classifier's classes: the speakers, then their sped-up copies when those are new speakers."""
    a = cfg.augment
    return speed_speaker_names(speakers, a.speed_factors) if a.speed_prob > 0 and a.speed_new_speakers else speakers


def make_features(cfg: Config, device: torch.device) -> nn.Module:
    """The training front-end: wave `(B, samples)` -> model input, of `cfg.features` at `cfg.data.sample_rate`
    with its dither (the checkpoint stores the same spec without dither)."""
    return build_features(feature_spec(cfg.features, cfg.data.sample_rate, training=True)).to(device)


def example_input(cfg: Config, seconds: Optional[float] = None) -> torch.Tensor:
    """The model input of one random wave of `seconds` (default: the training crop), `(1, ...)` on the CPU;
    drawn from its own generator, so the run's random streams are untouched."""
    n = int(round((seconds or cfg.data.crop_seconds) * cfg.data.sample_rate))
    wave = 0.1 * torch.randn(1, n, generator=torch.Generator().manual_seed(0))
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    with torch.no_grad():
        return build_features(spec)(wave)


def build_net(
    cfg: Config, num_speakers: int, autocast: Callable, features: Optional[nn.Module] = None
) -> Union[SpeakerNet, DinoNet]:
    """The model and its objective: a margin classifier of `num_speakers`, or (loss.name dino) the
    self-distillation of speakerlab.train.losses.dino, whose crops go through `features` (the training front end)."""
    try:
        model = build_model(cfg.model.name, **cfg.model.args)
    except _BUILD_ERRORS as e:
        raise ConfigError(_unbuildable(cfg, e)) from None
    problem = input_problem(model, feature_spec(cfg.features, cfg.data.sample_rate))
    if problem:
        raise ConfigError(f"config key {problem} (model {cfg.model.name})")
    check_encoder_settings(model, cfg.optim, cfg.model.name)
    try:
        with torch.no_grad():
            dim = model.eval()(example_input(cfg, 2.0)).shape[-1]
    except _BUILD_ERRORS as e:
        raise ConfigError(_unbuildable(cfg, e)) from None
    if dim < 1:
        raise ConfigError(_unbuildable(cfg, f"its embeddings have {dim} dimensions"))
    model.train()
    if not needs_labels(cfg):
        objective = DinoObjective(cfg.dino, model, dim)
        return DinoNet(model, objective, features, cfg.dino, cfg.data.sample_rate, cfg.train.seed, autocast)
    classifier = make_head(cfg.loss, dim, num_speakers, cfg.train.seed)
    return SpeakerNet(model, classifier, autocast)


# What a builder or its first forward raises for model.args it cannot take (a negative size, lists of unequal lengths).
_BUILD_ERRORS = (TypeError, ValueError, AssertionError, RuntimeError, ArithmeticError, IndexError)


def _unbuildable(cfg: Config, why) -> str:
    return f"config key 'model.args' ({dict(cfg.model.args)}): model {cfg.model.name} does not work with them: " + (
        str(why) or type(why).__name__
    )


def build_optimizer(cfg: Config, net: SpeakerNet) -> torch.optim.Optimizer:
    """The optimizer of `cfg.optim` over the groups of speakerlab.train.optim.groups (weight decay, LR scale): the
    embedding model at `optim.backbone_lr_scale` x the scheduled LR (an SSL encoder further scaled there),
    the classifier at the LR itself."""
    o = cfg.optim
    groups = parameter_groups(net.model, net.classifier, o)
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[o.name]
    # Fused kernels on every device (CUDA and, since torch 2.4, the CPU): one launch for all parameters, and
    # the only update that honours `found_inf`, which skips a non-finite step on the device without a host
    # read (speakerlab.train.optim.stability.step_unless). A torch without them keeps its default path.
    kwargs = {"momentum": o.momentum, "nesterov": o.nesterov} if o.name == "sgd" else {}
    if supports_fused(cls):
        try:
            return cls(groups, lr=o.lr, fused=True, **kwargs)
        except RuntimeError:  # a device or dtype this torch has no fused kernel for
            pass
    return cls(groups, lr=o.lr, **kwargs)


def supports_fused(cls) -> bool:
    """Whether this torch's optimizer class takes `fused` (SGD since torch 2.4, Adam/AdamW since 2.0)."""
    import inspect

    return "fused" in inspect.signature(cls).parameters


def choose_plan(
    cfg: Config,
    info: DistInfo,
    device: torch.device,
    probe: Optional[MemoryProbe],
    log: Callable[[str], None],
) -> BatchPlan:
    """The batch plan: per-device batch from the config, or `auto`: the largest micro batch of the plan up to
    `hardware.max_per_device_batch` that `probe` says fits (CUDA); without a probe (CPU) auto means 64."""
    hw = cfg.hardware
    pdb = hw.per_device_batch
    share = cfg.train.global_batch_size // max(1, info.world_size)
    if pdb == "auto":
        if probe is not None:
            sizes = probe_sizes(share, hw.max_per_device_batch)
            found = find_max_batch(probe, sizes)
            log(f"per_device_batch auto on {device}: {probe.describe()}")
            if found is None:
                raise RuntimeError(
                    f"per_device_batch auto: even a batch of {sizes[-1]} does not fit on {device} "
                    f"(hardware.memory_margin {hw.memory_margin}); lower data.crop_seconds or use a smaller model"
                )
            pdb = found
            if info.enabled:  # every rank must use the same micro batch: take the smallest card's
                t = torch.tensor([pdb], device=device)
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
                pdb = int(t.item())
            log(
                f"per_device_batch auto: {pdb} (largest fitting of {sizes}, hardware.max_per_device_batch "
                f"{hw.max_per_device_batch}, margin {hw.memory_margin})"
            )
        else:
            pdb = min(64, share)
    return plan_batches(cfg.train.global_batch_size, info.world_size, int(pdb))


@dataclass
class RunState:
    """Where a run is: the only values that change as it trains (besides weights and optimizer)."""

    step: int = 0  # optimizer steps done: the clock of the LR and margin schedules
    epoch: int = 0  # epochs completed
    bad_reads: int = 0  # training crops that failed to read and were skipped (data.on_bad_audio: skip)
    selection: Selection = field(default_factory=Selection)  # model selection so far (train.keep_best)


@dataclass(kw_only=True)
class Run:
    """A training run's parts, built once by `build_run`; `state` is what advances."""

    cfg: Config
    exp_dir: Path
    info: DistInfo
    device: torch.device
    precision: Precision
    net: nn.Module  # DDP-wrapped when distributed
    raw: Union[SpeakerNet, DinoNet]  # the SpeakerNet (DinoNet: loss.name dino) itself
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    inputs: Union[InputPipeline, WaveInputs]  # loader batch -> (features, labels): speed, augmentation, features
    loader: torch.utils.data.DataLoader
    sampler: Union[GlobalBatchSampler, ShardStream]  # set_epoch(epoch, start_step), steps_per_epoch
    plan: BatchPlan
    monitor: Monitor
    speakers: List[str]  # the classifier's classes (sped-up copies included)
    guard: NonFiniteGuard
    state: RunState
    init: Optional[Source] = None  # train.init as load_train_config read it, until the run is initialised from it

    @property
    def ckpt_dir(self) -> Path:
        return self.exp_dir / "checkpoints"

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch


def build_run(cfg: Config, exp_dir: Path, init: Optional[Source] = None) -> Run:
    """Process group, device, precision, data, model, optimizer, batch plan and loader of a run; `init`, the source
    of `load_train_config`, is kept for the run's initialisation."""
    info = dist_utils.init_distributed(resolve_device(cfg.hardware.device, 0).type, cfg.hardware.dist_timeout_s)
    device = resolve_device(cfg.hardware.device, info.local_rank)
    monitor = Monitor(exp_dir, enabled=info.is_main)
    threads_line = use_threads(cfg.hardware.threads, key="hardware.threads")[1]
    precision = resolve_precision(cfg.hardware.precision, device, cfg.hardware.tf32)
    seed_everything(cfg.train.seed)
    with dist_utils.once_per_node(info):  # lists and audio checked, the noise bank built: once per node
        log = dist_utils.preparation_log(info, monitor.log)
        data = load_train_lists(cfg, log)
        augmenter = build_augmenter(cfg, log)
    monitor.log(threads_line)  # after the lists: a bad list stays the one line on stderr
    speakers = class_names(cfg, data.speakers)
    if cfg.augment.speed_prob > 0:
        new = len(speakers) > len(data.speakers)
        monitor.log(
            f"speed perturbation with probability {cfg.augment.speed_prob:g}, factors {cfg.augment.speed_factors}; "
            f"{len(speakers)} classes{' (sped-up copies are new speakers)' if new else ''}"
        )
    features = make_features(cfg, device)
    net = build_net(cfg, len(speakers), precision.autocast, features).to(device)
    inputs = build_inputs(cfg, features, len(data.speakers))
    probe = None
    if device.type == "cuda" and cfg.hardware.per_device_batch == "auto" and not needs_labels(cfg):
        raise ConfigError("config key 'hardware.per_device_batch': auto is not measured for loss.name dino; give one")
    if device.type == "cuda" and cfg.hardware.per_device_batch == "auto":
        crop_shape = tuple(example_input(cfg).shape[1:])  # one training crop's model input
        probe = MemoryProbe(net, crop_shape, len(speakers), device, cfg.hardware.memory_margin, CudaMemory(device))
    plan = choose_plan(cfg, info, device, probe, monitor.log)
    del probe  # its copy of the net
    hw = cfg.hardware
    switches = resolve_switches(hw.compile, hw.channels_last, hw.cudnn_benchmark, net.model, device)
    apply_switches(switches, net, monitor.log)
    pin = cfg.hardware.pin_memory and device.type == "cuda"
    channel = channel_augment(cfg.augment, cfg.data.sample_rate, monitor.log)
    loader, sampler = make_loader(cfg, data, plan, info, pin, augmenter, channel)
    check_freeze(cfg.train.freeze, net.model, cfg.train.epochs * sampler.steps_per_epoch, cfg.model.name)
    if isinstance(net, DinoNet):  # its schedules run in optimizer steps
        net.classifier.set_clock(cfg.train.epochs * sampler.steps_per_epoch, sampler.steps_per_epoch)
    dist_utils.check_shared_memory(
        cfg.hardware.num_workers,
        plan.per_device * loader.dataset.crop_samples * 4,
        cfg.hardware.prefetch_factor,
        info.local_world_size,
        monitor.log,
    )
    keep_out_of_ddp(net)  # a sharded classifier's rows are each rank's own
    if isinstance(net.classifier, Sharded):  # every rank's rows padded to the micro-batch: no sizes exchanged
        net.classifier.rows = plan.per_device
    ddp = wrap_ddp(net, info, device)
    guard = NonFiniteGuard(cfg.train.max_consecutive_skips, monitor.log)
    run = Run(
        cfg=cfg,
        exp_dir=exp_dir,
        info=info,
        device=device,
        precision=precision,
        net=ddp,
        raw=net,
        optimizer=build_optimizer(cfg, net),
        scaler=precision.grad_scaler(),
        inputs=inputs,
        loader=loader,
        sampler=sampler,
        plan=plan,
        monitor=monitor,
        speakers=speakers,
        guard=guard,
        state=RunState(),
        init=init,
    )
    optimizer = f"{cfg.optim.name}{' (fused)' if run.optimizer.defaults.get('fused') else ''}"
    monitor.log(
        f"{precision.describe()}; {plan.describe()}; {run.steps_per_epoch} steps/epoch; "
        f"model {cfg.model.name} {sum(p.numel() for p in net.model.parameters()):,} params; optimizer {optimizer}"
    )
    if isinstance(net.classifier, Sharded):
        monitor.log(net.classifier.describe())
    monitor.log(switches.describe())
    restart = dist_utils.restart_note(info, os.environ)
    if restart:
        monitor.log(f"{restart}; {plan.describe()} (the global batch of the config); resuming from the last checkpoint")
    monitor.text("hardware", f"{precision.describe()}; {plan.describe()}; {switches.describe()}")
    return run
