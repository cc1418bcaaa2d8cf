"""The speed switches of the `hardware` section, resolved once per run and logged:

    compile          false | true | a torch.compile mode | auto   (the embedding model)
    channels_last    auto | true | false                        (NHWC weights and activations)
    cudnn_benchmark  auto | true | false                        (cuDNN picks its fastest kernels)

`auto` means: compile on CUDA (eager on the CPU, where compiling costs minutes and gains little), with a
logged fallback to eager when compilation fails; channels_last for 2-D CNNs (more Conv2d than Conv1d
layers: ERes2Net, ResNet, DF-ResNet, ReDimNet2) on CUDA, where tensor-core convolutions want NHWC;
cudnn.benchmark on CUDA, because training crops all have one length (data.crop_seconds), so the
kernel search runs once per shape and pays back at every step. None of them changes the results
beyond float rounding, so none is part of the schedule that resume checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn as nn


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
        try:
            out = self.call(feats)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # dynamo / inductor / a missing compiler raise many kinds
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if not self.fallback:
                raise CompileFailed(
                    f"hardware.compile={self.setting}: torch.compile failed: {type(e).__name__}: {reason}; "
                    "set hardware.compile=false (or auto: eager when compiling fails)"
                ) from e
            self.log(f"hardware.compile=auto: torch.compile failed ({type(e).__name__}: {reason}); training eager")
            self.call = self.model
            out = self.call(feats)
        self.checked = True
        return out


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
