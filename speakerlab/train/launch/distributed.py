"""Process-group set-up for plain runs, torchrun (single- or multi-node) and Slurm's srun.

One plain process is world size 1 with no process group. Several processes find their place with
`discover_ranks`, whoever started them (torchrun, or srun without torchrun); the backend is nccl on
CUDA and gloo on CPU, with a configurable timeout so that a rank waiting on slow rank-0 work (a
slow filesystem, say) fails with a clear message rather than hanging or timing out at NCCL's default.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple

import torch
import torch.distributed as dist

from speakerlab.train.launch.slurm import first_host, rendezvous_port


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this node
    launcher: str = "single"  # what started the processes: single, torchrun or srun

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def discover_ranks(env: Mapping[str, str]) -> Tuple[DistInfo, Optional[str]]:
    """This process's place among the training processes, and where their process group meets
    (an init_method URL; None: torchrun's MASTER_ADDR/MASTER_PORT, or a single process).

    - torchrun (RANK and WORLD_SIZE set; under Slurm too, where srun started the agents): its
      RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE;
    - srun without torchrun (inside a job step: SLURM_STEP_ID, SLURM_PROCID): SLURM_PROCID,
      SLURM_LOCALID, SLURM_NTASKS (the step's tasks); rank 0 runs on the first host of
      SLURM_STEP_NODELIST and hosts the group at the job's port (speakerlab.train.launch.slurm);
    - anything else (a Slurm batch shell included, whose SLURM_PROCID=0 describes no step): one process."""
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return (
            DistInfo(
                rank=int(env["RANK"]),
                local_rank=int(env.get("LOCAL_RANK", "0")),
                world_size=world,
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
                launcher="torchrun" if world > 1 else "single",
            ),
            None,
        )
    if env.get("SLURM_STEP_ID", "") not in ("", "batch", "extern") and "SLURM_PROCID" in env:
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        if world > 1:
            nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
            url = f"tcp://{first_host(nodelist)}:{rendezvous_port(env['SLURM_JOB_ID'])}"
            local = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1"
            info = DistInfo(
                rank=int(env["SLURM_PROCID"]),
                local_rank=int(env.get("SLURM_LOCALID", "0")),
                world_size=world,
                local_world_size=int(local.split("(")[0].split(",")[0]),
                launcher="srun",
            )
            return info, url
    return DistInfo(), None


def init_distributed(device_type: str, timeout_s: int) -> DistInfo:
    """`discover_ranks` of this process, and its process group when there are several."""
    info, url = discover_ranks(os.environ)
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        where = {} if url is None else dict(init_method=url, rank=info.rank, world_size=info.world_size)
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **where)
    return info


def restart_note(info: DistInfo, env: Mapping[str, str]) -> Optional[str]:
    """The log line of a start that is a restart (None otherwise): torchrun's elastic agent restarted the
    processes after one of them or a node failed (TORCHELASTIC_RESTART_COUNT), or Slurm requeued the job."""
    parts = []
    if int(env.get("SLURM_RESTART_COUNT") or 0):
        parts.append(f"Slurm job {env.get('SLURM_JOB_ID', '?')} requeued, start {int(env['SLURM_RESTART_COUNT']) + 1}")
    if int(env.get("TORCHELASTIC_RESTART_COUNT") or 0):
        nodes = info.world_size // max(1, info.local_world_size)
        parts.append(
            f"torchrun restart {env['TORCHELASTIC_RESTART_COUNT']} after a failed process or node: "
            f"{info.world_size} process(es) on {nodes} node(s) now"
        )
    return "; ".join(parts) or None


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
def once_per_node(info: DistInfo):
    """Run the body on global rank 0 first, then on local rank 0 of every other node, then on the rest.

    For start-up work that writes files the other ranks then read (a noise bank built from the lists,
    an index): on a filesystem every node shares, rank 0 makes them and the others find them made;
    where a path is node-local (scratch disks), local rank 0 of each node makes its own copy before a
    process of that node reads it. Never two writers of one node at once. Every rank passes the
    same two barriers (bounded by the group timeout)."""
    phase = 0 if info.is_main else 1 if info.local_rank == 0 else 2
    for _ in range(phase):
        barrier(info)
    yield
    for _ in range(2 - phase):
        barrier(info)


def preparation_log(info: DistInfo, log: Callable[[str], None]) -> Callable[[str], None]:
    """Where the lines of `once_per_node` work go: rank 0's to `log` (the run's log), local rank 0 of another
    node's to stderr naming the host (its work happens on its own disk), the other ranks' nowhere."""
    if info.is_main:
        return log
    if info.local_rank == 0:
        host = socket.gethostname()
        return lambda m: print(f"rank {info.rank} on {host} (node-local preparation): {m}", file=sys.stderr, flush=True)
    return lambda m: None


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
