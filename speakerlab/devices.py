"""Which torch device a command runs on: shared by training and the inference commands."""

from __future__ import annotations

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
