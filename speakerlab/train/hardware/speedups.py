"""The speed switches of the `hardware` section, resolved once per run and logged:

    compile          false | true | a torch.compile mode | auto   (the embedding model)
    channels_last    auto | true | false                        (NHWC weights and activations)
    cudnn_benchmark  auto | true | false                        (cuDNN picks its fastest kernels)

`auto` means: compile on CUDA (eager on the CPU, where compiling costs minutes and gains little), with a
logged fallback to eager when compilation fails or when the compiled model's gradients on the first training
batch are not the eager model's (CompiledModel.check: inductor's gradients of a ceil-mode average pool and of an
index_select are wrong, on the CPU with torch 2.13 and on an H100 with torch 2.11: CAM++'s were 14-52 % off);
channels_last for 2-D CNNs (more Conv2d than Conv1d layers: ERes2Net, ResNet, DF-ResNet, ReDimNet2) on CUDA,
where tensor-core convolutions want NHWC; cudnn.benchmark on CUDA, because training crops all have one length
(data.crop_seconds), so the kernel search runs once per shape and pays back at every step. None of them changes
the results beyond float rounding, so none is part of the schedule that resume checks.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from speakerlab.devices import exact_fp32

# CompiledModel.check: the largest gradient error allowed, relative to a tensor's norm plus GRAD_FLOOR of all.
GRAD_TOLERANCE = 0.05
GRAD_FLOOR = 1e-3


class CompileFailed(RuntimeError):
    """torch.compile failed under `hardware.compile` true or a mode; the message names the setting."""


class CompiledModel:
    """`(B, T, F) -> (B, D)` through `torch.compile(model, mode)`; the module itself stays as it is (its state
    dict, checkpoints and validation use it eagerly). torch.compile is lazy: the first call compiles, and a
    failure there raises CompileFailed naming the setting, or with `fallback` logs it and uses the eager
    model from then on. Not an nn.Module, so the compiled wrapper adds no parameters or state-dict keys."""

    def __init__(
        self, model: nn.Module, mode: str, setting: str, fallback: bool, log: Callable[[str], None], backend="inductor"
    ):
        self.model, self.setting, self.fallback, self.log = model, setting, fallback, log
        # Static shapes: training crops have one length, so a new shape (another micro-batch size) is a rare
        # recompile; automatic dynamic shapes instead hit an inductor error on this model zoo (torch 2.13:
        # "cannot determine truth value of Relational" on a symbolic batch size).
        self.call = torch.compile(model, mode=None if mode == "default" else mode, backend=backend, dynamic=False)
        self.checked = False

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        if self.checked:
            return self.call(feats)
        cause = None
        try:
            wrong = self.check(feats) if torch.is_grad_enabled() and self.model.training else None
            out = self.call(feats) if wrong is None else None
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # dynamo / inductor / a missing compiler raise many kinds
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            wrong, cause = f"torch.compile failed: {type(e).__name__}: {reason}", e
        if wrong is not None:
            if not self.fallback:
                raise CompileFailed(
                    f"hardware.compile={self.setting}: {wrong}; set hardware.compile=false (or auto: eager when "
                    "compiling fails or its gradients differ)"
                ) from cause
            self.log(f"hardware.compile=auto: {wrong}; training eager")
            self.call = self.model
            out = self.call(feats)
        self.checked = True
        return out

    def check(self, feats: torch.Tensor) -> Optional[str]:
        """The compiled model's parameter gradients on the first training batch against the eager model's, for one
        random direction of the output, both in exact fp32 (autocast and TF32 off); None when they agree, else what
        differs. Exact fp32 because under bf16 the eager model's own rounding hides a defect (measured on a tiny
        CAM++: bf16 eager was as far from fp32 as its compiled graph with inductor's wrong pool gradient) or makes a
        sound graph look wrong (ERes2Net). This compiles the fp32 graph once beside the run's own. Leaves the
        buffers (BatchNorm statistics), the gradients and the random streams as they were, so that a resumed run
        stays exact."""
        named = [(k, p) for k, p in self.model.named_parameters() if p.requires_grad]
        if not named:
            return None
        if any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in self.model.modules()):
            self.log("hardware.compile: gradients not checked against eager (dropout: two runs draw two masks)")
            return None
        kind = feats.device.type
        buffers = [b.detach().clone() for b in self.model.buffers()]
        with torch.random.fork_rng(devices=[feats.device] if kind == "cuda" else []), _full_precision(kind):
            eager = self._gradients(self.model, feats, named, buffers)
            if not all(bool(torch.isfinite(g).all()) for g in eager):
                self.log("hardware.compile: gradients not checked against eager (the eager ones are not finite)")
                return None
            compiled = self._gradients(self.call, feats, named, buffers)
            worst = worst_error([k for k, _ in named], compiled, eager, GRAD_FLOOR)
        if worst[0] <= GRAD_TOLERANCE:
            self.log(
                "hardware.compile: the compiled model's gradients on the first batch are the eager model's "
                f"(fp32, worst {worst[0]:.1e} of the tensor's norm, {worst[1]})"
            )
            return None
        return (
            f"the compiled model's gradients on the first batch differ from the eager model's by {worst[0]:.0%} of "
            f"the tensor's norm in {worst[1]} (fp32; the tolerance is {GRAD_TOLERANCE:.0%})"
        )

    def _gradients(self, fn: Callable, feats: torch.Tensor, named, buffers) -> List[torch.Tensor]:
        """The parameters' gradients of (fn(feats) . a fixed random direction), then the buffers put back."""
        out = fn(feats)
        direction = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out.device)
        got = torch.autograd.grad((out.float() * direction).sum(), [p for _, p in named], allow_unused=True)
        for b, saved in zip(self.model.buffers(), buffers):
            b.copy_(saved)
        return [torch.zeros_like(p) if g is None else g.detach() for (_, p), g in zip(named, got)]


def worst_error(names: List[str], got: List[torch.Tensor], want: List[torch.Tensor], floor: float) -> Tuple[float, str]:
    """The largest |got - want| / (|want| + floor x |all of want|) over the named tensors (norms in float64), and its
    name; inf where `got` is not finite. Relative to each tensor's own norm, floored by the whole set's: a bias
    before BatchNorm has a true gradient of 0, rounding noise on both sides that no elementwise tolerance compares."""
    total = math.sqrt(sum(w.double().square().sum().item() for w in want))
    worst = (0.0, "")
    for name, g, w in zip(names, got, want):
        err = (g.double() - w.double()).norm().item()
        worst = max(worst, (err / (w.double().norm().item() + floor * total) if math.isfinite(err) else math.inf, name))
    return worst


@contextlib.contextmanager
def _full_precision(kind: str):
    """Autocast off and TF32 off: the float32 the model's parameters hold."""
    with torch.autocast(kind, enabled=False), exact_fp32():
        yield


def is_2d_cnn(model: nn.Module) -> bool:
    """More Conv2d than Conv1d layers (CAM++ has a small 2-D head on a 1-D TDNN: not one)."""
    kinds = [type(m) for m in model.modules()]
    return kinds.count(nn.Conv2d) > kinds.count(nn.Conv1d)


@dataclass(frozen=True)
class SpeedSwitches:
    """The resolved switches of a run; `describe()` is what the log and tensorboard record."""

    compile: Optional[str]  # the torch.compile mode, None for eager
    compile_setting: str  # hardware.compile as written, for messages
    compile_fallback: bool
    channels_last: bool
    cudnn_benchmark: bool
    why: str

    def describe(self) -> str:
        on = "compile " + (f"mode {self.compile}" if self.compile else "off (eager)")
        on += f", channels_last {'on' if self.channels_last else 'off'}"
        on += f", cudnn.benchmark {'on' if self.cudnn_benchmark else 'off'}"
        return f"speed switches: {on} ({self.why})"


def _switch(value: Union[bool, str], auto: bool) -> bool:
    return auto if value == "auto" else bool(value)


def resolve_switches(
    compile: Union[bool, str],
    channels_last: Union[bool, str],
    cudnn_benchmark: Union[bool, str],
    model: nn.Module,
    device: torch.device,
) -> SpeedSwitches:
    """The `hardware` settings -> SpeedSwitches for `model` on `device` (see the module docstring)."""
    cuda = device.type == "cuda"
    if compile == "auto":
        mode, fallback = ("default" if cuda else None), True
    elif compile is True:
        mode, fallback = "default", False
    elif compile is False:
        mode, fallback = None, False
    else:
        mode, fallback = compile, False
    cnn = is_2d_cnn(model)
    why = (
        f"hardware.compile={str(compile).lower()} channels_last={str(channels_last).lower()} "
        f"cudnn_benchmark={str(cudnn_benchmark).lower()}"
        f"; {'2-D CNN' if cnn else 'not a 2-D CNN'} on {device.type}"
    )
    return SpeedSwitches(
        mode,
        str(compile).lower(),
        fallback,
        _switch(channels_last, cnn and cuda),
        cuda and _switch(cudnn_benchmark, True),
        why,
    )


def apply_switches(switches: SpeedSwitches, net: nn.Module, log: Callable[[str], None], backend="inductor") -> None:
    """channels_last on `net`'s 4-D weights (convolution outputs follow their weights' layout), cuDNN
    benchmark mode, and the compiled embedding model as `net.compiled` (SpeakerNet calls it when set).
    `backend`: torch.compile's (bench/gpu_session.sh --dry-run passes "eager": dynamo without code generation)."""
    if switches.channels_last:
        net.to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = switches.cudnn_benchmark
    if switches.compile is not None:
        net.compiled = CompiledModel(
            net.model, switches.compile, switches.compile_setting, switches.compile_fallback, log, backend
        )
