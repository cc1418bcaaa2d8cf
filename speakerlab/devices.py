"""Which torch device a command runs on, how many CPU threads it computes with, and the numeric switches of a
device that a step must not inherit: shared by training and the inference commands. torch is imported where it is
used, so that the ONNX runtime path (torch-free) resolves its threads here too."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import TYPE_CHECKING, Tuple, Union

if TYPE_CHECKING:
    import torch

THREADS_HELP = (
    "CPU threads the computing takes: a number, or auto (OMP_NUM_THREADS when set, else the cores this process "
    "may use, os.sched_getaffinity, shared among the processes of the node)"
)


def parse_threads(value: Union[int, str, None], key: str = "--threads") -> Union[int, str]:
    """`auto` or an integer >= 1 (as text or int); anything else a ValueError naming `key`."""
    if value is None or value == "auto":
        return "auto"
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if isinstance(value, bool) or n < 1 or str(n) != str(value).strip():
        raise ValueError(f"{key} must be auto or an integer >= 1, got {value!r}")
    return n


def resolve_threads(setting: Union[int, str, None] = "auto", key: str = "--threads") -> Tuple[int, str]:
    """(threads, why) for a command's computing: `setting` when it is a number; auto: OMP_NUM_THREADS when set (the
    user's or the launcher's choice), else the cores this process may use (its CPU affinity, which a container's
    cpuset or `taskset` limits, not the machine's count) divided among the processes of the node (LOCAL_WORLD_SIZE,
    as torchrun and speakerlab's agent set it), at least 1. On a CPU shared with other work, torch's default (every
    core) can make a step many times slower than one thread; this says how many and why, and `setting` chooses."""
    setting = parse_threads(setting, key)
    if setting != "auto":
        return setting, key
    omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return int(omp), "auto: OMP_NUM_THREADS"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    processes = int(local) if local.isdigit() and int(local) >= 1 else 1
    if processes > 1:
        return max(1, cores // processes), f"auto: affinity, {cores} cores / {processes} processes"
    return cores, "auto: affinity"


def use_threads(setting: Union[int, str, None] = "auto", key: str = "--threads") -> Tuple[int, str]:
    """`resolve_threads`, applied to torch when this process has imported it (the ONNX path passes the number to
    onnxruntime itself): (the number, the line to log, `threads: 2 (auto: affinity)`). Commands log that line in
    their own log (train.log) or summary line, so that an error stays the one line on stderr."""
    n, why = resolve_threads(setting, key)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return n, f"threads: {n} ({why})"


def resolve_device(name: str, local_rank: int = 0) -> "torch.device":
    """`auto` -> this rank's CUDA device when CUDA is available, else CPU; `cuda` -> `cuda:<local_rank>`."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for but no CUDA device is available")
        return torch.device("cuda", local_rank)
    return torch.device(name)


@contextlib.contextmanager
def exact_fp32():
    """TF32 off for cuBLAS matmuls and cuDNN convolutions inside the block, the caller's flags restored after.

    Training turns TF32 on for the model (`hardware.tf32`), but TF32 keeps 10 bits of mantissa: the mel
    product of the fbank and the resampling convolution of speed perturbation would then differ from
    the features of extraction by ~1e-3 in log-mel instead of ~1e-6. The flags are process-wide, so the
    block must not run concurrently with model code on another thread (the training step is one thread).
    """
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


def in_exact_fp32(fn):
    """Decorator: `fn` runs inside `exact_fp32()`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with exact_fp32():
            return fn(*args, **kwargs)

    return wrapper
