"""How a fixed global batch is split over devices: per-device batch x world size x accumulation.

The experiment fixes the global batch (and with it the LR and schedule); the hardware decides the
per-device batch, either from its profile or `auto`: the largest micro batch of the plan (at most
`hardware.max_per_device_batch`) whose real forward+backward fits in the free memory of the card with
a safety margin (`MemoryProbe`). Accumulation makes up the rest, so loss curves and results do not
depend on the card.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence

import torch


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


def probe_sizes(share: int, upper: int, lower: int = 16) -> List[int]:
    """The per-device batches `auto` tries, largest first: the micro batches a plan of `share` samples per
    device can use (share / accumulation), at most `upper`, down to the first one <= `lower`.

    256, upper 128 -> [128, 64, 32, 16]; 300, upper 512 -> [300, 150, 100, 75, 60, 50, 30, 25, 20, 15]."""
    sizes = sorted((share // a for a in range(1, share + 1) if share % a == 0 and share // a <= upper), reverse=True)
    stop = next((i for i, size in enumerate(sizes) if size <= lower), len(sizes) - 1)
    return sizes[: stop + 1]


def find_max_batch(fits: Callable[[int], bool], candidates: Iterable[int]) -> Optional[int]:
    """The largest candidate batch size for which `fits(size)` is True (tried largest first), or None."""
    for size in sorted(candidates, reverse=True):
        if fits(size):
            return size
    return None


# Allocation failures that cuBLAS / cuDNN report as plain RuntimeErrors instead of torch.OutOfMemoryError.
ALLOCATION_FAILURES = ("out of memory", "ALLOC_FAILED", "NOT_ENOUGH_WORKSPACE", "CUBLAS_STATUS_NOT_INITIALIZED")


def is_allocation_failure(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and any(text in str(error) for text in ALLOCATION_FAILURES)
    )


class CudaMemory:
    """What `MemoryProbe` reads of a CUDA device (a test passes a fake with the same three methods)."""

    def __init__(self, device: torch.device):
        self.device = device

    def usable(self) -> int:
        """Bytes this process can hold: free on the card (other processes' use excluded) + its own cache."""
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return free + torch.cuda.memory_reserved(self.device)

    def start(self) -> None:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        """Peak bytes reserved by the caching allocator: what the card had to give, fragmentation included."""
        return torch.cuda.max_memory_reserved(self.device)


class MemoryProbe:
    """`probe(batch) -> bool`: does a training step of `batch` crops fit in `margin` x the usable memory?

    One forward+backward of a deep copy of `net` (the trained net keeps its BatchNorm statistics and
    weights; its own autocast is the configured precision) on random model inputs of the training crop
    shape `(batch, *input_shape)`, inside `torch.random.fork_rng` (the run's random streams do not
    move). Every allocation failure (torch.OutOfMemoryError, cuBLAS/cuDNN ALLOC_FAILED) means "does not
    fit"; any other error propagates. `notes` keeps one line per try for the log."""

    def __init__(self, net: torch.nn.Module, input_shape: Sequence[int], num_speakers: int, device, margin, memory):
        self.net = copy.deepcopy(net).train()
        self.shape, self.num_speakers, self.device = tuple(input_shape), num_speakers, device
        self.memory = memory
        self.budget = margin * memory.usable()
        self.notes: List[str] = []

    def __call__(self, batch: int) -> bool:
        self.net.zero_grad(set_to_none=True)
        self.memory.start()
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices, device_type=self.device.type):
                feats = torch.randn(batch, *self.shape, device=self.device)
                labels = torch.randint(0, self.num_speakers, (batch,), device=self.device)
                loss, _ = self.net(feats, labels)
                loss.backward()
            peak = self.memory.peak()
            fits = peak <= self.budget
            self.notes.append(f"{batch}: {'fits' if fits else 'too large'}, peak {peak / 2**30:.2f} GiB")
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_allocation_failure(e):
                raise
            fits = False
            self.notes.append(f"{batch}: allocation failed ({type(e).__name__})")
        finally:
            loss = feats = labels = None
            self.net.zero_grad(set_to_none=True)
            self.memory.start()
        return fits

    def describe(self) -> str:
        return f"budget {self.budget / 2**30:.2f} GiB; tried " + "; ".join(self.notes)
