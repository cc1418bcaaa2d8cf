"""Which torch device a command runs on, and the numeric switches of a device that a step must not
inherit: shared by training and the inference commands."""

from __future__ import annotations

import contextlib
import functools

import torch


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """`auto` -> this rank's CUDA device when CUDA is available, else CPU; `cuda` -> `cuda:<local_rank>`."""
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
