"""The teacher of self-distillation (loss.name dino): an exponential moving average (EMA) of the student, and
the schedules of the objective. Every schedule is a function of the optimizer step alone, so a resumed run and
any device count follow the same ones (the global batch is fixed: speakerlab.train.hardware.batch_plan)."""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn as nn


def teacher_momentum_at(step: int, total: int, start: float) -> float:
    """The EMA momentum at `step` of `total`: `start` rising to 1 along a half cosine (DINO's schedule)."""
    progress = min(max(step / max(total, 1), 0.0), 1.0)
    return 1.0 - (1.0 - start) * (math.cos(math.pi * progress) + 1.0) / 2.0


def teacher_temp_at(step: int, steps_per_epoch: int, start: float, end: float, warmup_epochs: float) -> float:
    """The teacher's softmax temperature: linear from `start` to `end` over `warmup_epochs`, then `end`."""
    warmup = warmup_epochs * steps_per_epoch
    if step >= warmup:
        return end
    return start + (end - start) * step / warmup


@torch.no_grad()
def ema_update(teacher: Iterable[nn.Parameter], student: Iterable[nn.Parameter], momentum: float) -> None:
    """teacher <- momentum x teacher + (1 - momentum) x student, parameter by parameter (the same order)."""
    t, s = list(teacher), list(student)
    if len(t) != len(s):
        raise ValueError(f"teacher has {len(t)} parameters, student {len(s)}")
    torch._foreach_mul_(t, momentum)
    torch._foreach_add_(t, s, alpha=1.0 - momentum)


@torch.no_grad()
def copy_into(teacher: nn.Module, student: nn.Module) -> None:
    """The teacher becomes the student (parameters and buffers): at the first step, after train.init."""
    teacher.load_state_dict(student.state_dict())
