"""How a fixed global batch is split over devices: per-device batch x world size x accumulation.

The experiment fixes the global batch (and with it the LR and schedule); the hardware decides the
per-device batch, either from its profile or `auto` (the largest size in [16, 128] whose real
forward+backward fits in memory with a safety margin). Accumulation makes up the rest, so loss
curves and results do not depend on the card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional


@dataclass(frozen=True)
class BatchPlan:
    global_batch: int
    world_size: int
    per_device: int
    accumulation: int

    def describe(self) -> str:
        return (
            f"global {self.global_batch} = {self.world_size} device(s) x {self.per_device} x accum {self.accumulation}"
        )


def plan_batches(global_batch: int, world_size: int, per_device_max: int) -> BatchPlan:
    """Split `global_batch` with micro batches of at most `per_device_max`.

    Rule for uneven splits: the global batch must be divisible by the world size; the per-device
    share is then split into the fewest equal micro batches that fit (accumulation = smallest divisor
    of the share giving a micro batch <= per_device_max). E.g. global 256, 3 GPUs -> an error naming
    the nearest valid global batches; global 256, 1 GPU, max 48 -> 32 x accum 8.
    """
    if global_batch % world_size:
        lo = global_batch - global_batch % world_size
        raise ValueError(
            f"train.global_batch_size {global_batch} is not divisible by {world_size} processes; "
            f"use {lo} or {lo + world_size}"
        )
    share = global_batch // world_size
    if per_device_max < 1:
        raise ValueError(f"per-device batch must be >= 1, got {per_device_max}")
    for accum in range(1, share + 1):
        if share % accum == 0 and share // accum <= per_device_max:
            return BatchPlan(global_batch, world_size, share // accum, accum)
    raise AssertionError("unreachable: accum == share always fits")


def find_max_batch(
    fits: Callable[[int], bool], candidates: Iterable[int] = (128, 96, 64, 48, 32, 24, 16)
) -> Optional[int]:
    """The largest candidate batch size for which `fits(size)` is True (tried largest first).

    `fits` runs a real forward+backward at the training crop length and returns False on
    out-of-memory (or when peak memory exceeds the safety margin)."""
    for size in sorted(candidates, reverse=True):
        if fits(size):
            return size
    return None
