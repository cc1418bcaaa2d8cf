"""Checkpoints: everything needed to resume a run, or to rebuild the embedding model alone.

A checkpoint is a dict of tensors and plain Python values (loadable with `weights_only=True`):
model name + arguments + state, classifier state, optimizer and GradScaler state, global step,
epoch, step within the epoch, RNG state, the resolved config and the speaker map. Files are written
to a temporary name and renamed, so a crash mid-write never leaves a truncated checkpoint.

Layout under `<exp>/checkpoints/`: `epoch_NNN.pt` at each epoch end (the last `keep` are kept, for
averaging), `latest.pt` mid-epoch (overwritten).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
import torch.nn as nn

from speakerlab.models import build_model

_EPOCH_RE = re.compile(r"epoch_(\d+)\.pt$")


def save_checkpoint(path: Union[str, Path], state: Dict[str, Any]) -> None:
    """Atomically write `state` to `path` (temp file in the same dir, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Union[str, Path], map_location="cpu", mmap: bool = False) -> Dict[str, Any]:
    """Load a checkpoint with `weights_only=True` (no arbitrary code from the file).

    `mmap=True` maps tensors lazily: cheap when only metadata is needed."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        raise RuntimeError(f"checkpoint {path} cannot be loaded: {e}") from None


def checkpoint_files(ckpt_dir: Union[str, Path]) -> List[Path]:
    """Epoch checkpoints in `ckpt_dir`, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    files = [p for p in ckpt_dir.glob("epoch_*.pt") if _EPOCH_RE.search(p.name)]
    return sorted(files, key=lambda p: int(_EPOCH_RE.search(p.name).group(1)))


def latest_checkpoint(ckpt_dir: Union[str, Path]) -> Optional[Path]:
    """The checkpoint with the highest global step (`latest.pt` or an epoch file), or None."""
    candidates = checkpoint_files(ckpt_dir)
    mid = Path(ckpt_dir) / "latest.pt"
    if mid.exists():
        candidates.append(mid)
    best, best_step = None, -1
    for p in candidates:
        step = load_checkpoint(p, mmap=True).get("step", -1)
        if step > best_step:
            best, best_step = p, step
    return best


def prune_checkpoints(ckpt_dir: Union[str, Path], keep: int) -> None:
    """Delete all but the newest `keep` epoch checkpoints."""
    files = checkpoint_files(ckpt_dir)
    for p in files[:max(0, len(files) - keep)]:
        p.unlink()


def rebuild_model(ckpt: Dict[str, Any]) -> nn.Module:
    """The embedding model of a checkpoint, weights loaded, in eval mode: `(B, T, F) -> (B, D)`."""
    model = build_model(ckpt["model_name"], **ckpt["model_args"])
    model.load_state_dict(ckpt["model"])
    return model.eval()


def average_checkpoints(paths: List[Union[str, Path]]) -> Dict[str, Any]:
    """A checkpoint whose model weights are the mean of `paths`' (float tensors; others from the last).

    Resume-only state (optimizer, scaler) is dropped: the result is for extraction or fine-tuning.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    ckpts = [load_checkpoint(p) for p in paths]
    names = {c["model_name"] for c in ckpts}
    if len(names) != 1:
        raise ValueError(f"cannot average checkpoints of different models: {sorted(names)}")
    out = {k: v for k, v in ckpts[-1].items() if k not in ("optimizer", "scaler")}
    avg = {}
    for key, value in ckpts[-1]["model"].items():
        if value.is_floating_point():
            avg[key] = sum(c["model"][key].double() for c in ckpts).div(len(ckpts)).to(value.dtype)
        else:
            avg[key] = value
    out["model"] = avg
    out["averaged_from"] = [str(p) for p in paths]
    return out
