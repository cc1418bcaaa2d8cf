"""Process-group set-up for plain runs and torchrun (single- or multi-node).

One plain process is world size 1 with no process group. Under torchrun the backend is nccl on
CUDA and gloo on CPU, with a configurable timeout so that a rank waiting on slow rank-0 work (a
slow filesystem, say) fails with a clear message rather than hanging or timing out at NCCL's default.
"""

from __future__ import annotations

import datetime
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str, timeout_s: int) -> DistInfo:
    """Read torchrun's RANK/LOCAL_RANK/WORLD_SIZE and start the process group when world > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = DistInfo(int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return info


def wrap_ddp(module: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    """`module` in DistributedDataParallel when distributed (its parameters that require grad at this
    moment are the ones it reduces), else `module` itself."""
    if not info.enabled:
        return module
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


@contextmanager
def main_process_first(info: DistInfo):
    """Rank 0 runs the body, the others wait at a barrier (bounded by the group timeout), then run it.

    Use for work whose result the other ranks read (creating dirs, writing a file)."""
    if not info.is_main:
        barrier(info)
    yield
    if info.is_main:
        barrier(info)


def all_reduce_mean(values: Dict[str, float], info: DistInfo, device: torch.device) -> Dict[str, float]:
    """Average scalar metrics over ranks (one collective for all of them)."""
    if not info.enabled or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= info.world_size
    return {k: float(v) for k, v in zip(keys, t.tolist())}


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def check_shared_memory(
    num_workers: int, bytes_per_batch: int, prefetch_factor: int, ranks_on_node: int, log, shm_path: str = "/dev/shm"
) -> None:
    """Switch tensor sharing to the file system when /dev/shm cannot hold what the loaders queue.

    DataLoader workers pass batches through shared memory; when /dev/shm is smaller than
    workers x prefetch x batch bytes for every rank on the node, workers die with SIGBUS (exit -7).
    The file_system strategy is slower but cannot run out of /dev/shm.
    """
    if num_workers == 0 or not os.path.isdir(shm_path):
        return
    need = num_workers * max(1, prefetch_factor) * bytes_per_batch * ranks_on_node * 2  # x2: pinned copies
    free = shutil.disk_usage(shm_path).free
    if free < need:
        log(
            f"WARNING: {shm_path} has {free / 2**20:.0f} MiB free but the data loaders may need "
            f"{need / 2**20:.0f} MiB; using the file_system sharing strategy instead (or raise the "
            f"container's shm size, e.g. docker --shm-size=8g)"
        )
        torch.multiprocessing.set_sharing_strategy("file_system")
