"""Checkpoints: the one schema, written and read here.

A checkpoint file is a dict of tensors and plain Python values (loadable with `weights_only=True`):

    schema         2
    model_name     registered builder name          model_args   its keyword arguments
    model          embedding-model state dict       features     FeatureSpec.to_dict(): fbank + mean_norm
    speakers       the classifier's speaker list    classifier   classifier state dict (None after export)
    step, epoch    optimizer steps / epochs done    resume       ResumeState.to_dict(), or None
    config         the training config as written, kept as a record of provenance only
    averaged_from  paths, for an averaged checkpoint

Inference needs only model_name, model_args, model and features: it never reads `config`, so
renaming or removing a config key does not break old checkpoints. Files without `schema` were written
before it existed (schema 1: features inside `config`, resume state at the top level) and are read too.

Files are written to a temporary name, fsynced and renamed, so a crash mid-write never leaves a
truncated checkpoint. Layout under `<exp>/checkpoints/`: `epoch_NNN.pt` at each epoch end (the last
`keep` are kept, for averaging), `latest.pt` mid-epoch (overwritten).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch
import torch.nn as nn

from speakerlab.features import FbankConfig, FeatureSpec
from speakerlab.models import build_model

SCHEMA = 2
_EPOCH_RE = re.compile(r"epoch_(\d+)\.pt$")
PathLike = Union[str, Path]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or not one of ours; the message names the file."""


@dataclass
class ResumeState:
    """What only resuming a run needs, beyond the weights."""

    optimizer: Dict[str, Any]
    scaler: Dict[str, Any]
    step_in_epoch: int = 0
    skipped_steps: int = 0
    rng_cpu: Optional[torch.Tensor] = None
    rng_cuda: List[torch.Tensor] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        # Not dataclasses.asdict: it would deep-copy every optimizer tensor.
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass
class Checkpoint:
    """One checkpoint in memory; `save_checkpoint` / `load_checkpoint` convert to and from the file."""

    model_name: str
    model_args: Dict[str, Any]
    model: Dict[str, torch.Tensor]
    features: FeatureSpec
    speakers: List[str] = field(default_factory=list)
    classifier: Optional[Dict[str, torch.Tensor]] = None
    step: int = 0
    epoch: int = 0
    resume: Optional[ResumeState] = None
    config: Dict[str, Any] = field(default_factory=dict)
    averaged_from: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"schema": SCHEMA, "model_name": self.model_name, "model_args": dict(self.model_args),
                "model": self.model, "features": self.features.to_dict(), "speakers": list(self.speakers),
                "classifier": self.classifier, "step": self.step, "epoch": self.epoch,
                "resume": None if self.resume is None else self.resume.to_dict(), "config": self.config,
                "averaged_from": list(self.averaged_from)}

    @classmethod
    def from_dict(cls, raw: Dict[str, Any], where: PathLike = "checkpoint") -> "Checkpoint":
        if not isinstance(raw, dict) or "model_name" not in raw or "model" not in raw:
            raise CheckpointError(f"{where}: not a speakerlab checkpoint (no model_name/model); for a 3D-Speaker "
                                  "state dict use --3dspeaker NAME --weights FILE")
        schema = raw.get("schema", 1)
        try:
            if schema == 1:
                return _from_schema1(raw)
            if schema != SCHEMA:
                raise CheckpointError(f"{where}: checkpoint schema {schema} is newer than this speakerlab ({SCHEMA})")
            resume = raw.get("resume")
            return cls(raw["model_name"], dict(raw["model_args"]), raw["model"], FeatureSpec.from_dict(raw["features"]),
                       list(raw.get("speakers", [])), raw.get("classifier"), int(raw.get("step", 0)),
                       int(raw.get("epoch", 0)), None if resume is None else ResumeState(**resume),
                       raw.get("config") or {}, list(raw.get("averaged_from", [])))
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed checkpoint (schema {schema}): {e!r}") from None


def _from_schema1(raw: Dict[str, Any]) -> Checkpoint:
    """Files written before the schema: features and sample rate lived in the stored training config."""
    config = raw.get("config") or {}
    f, data = config["features"], config.get("data", {})
    fbank = FbankConfig(sample_rate=int(data.get("sample_rate", 16000)), num_mel_bins=int(f["num_mel_bins"]),
                        frame_length_ms=float(f["frame_length_ms"]), frame_shift_ms=float(f["frame_shift_ms"]),
                        window_type=str(f["window_type"]), dither=0.0)
    resume = None
    if "optimizer" in raw:
        resume = ResumeState(raw["optimizer"], raw.get("scaler", {}), int(raw.get("step_in_epoch", 0)),
                             int(raw.get("skipped_steps", 0)), raw.get("rng_cpu"), list(raw.get("rng_cuda", [])))
    return Checkpoint(raw["model_name"], dict(raw["model_args"]), raw["model"],
                      FeatureSpec(fbank, bool(f.get("mean_norm", True))), list(raw.get("speakers", [])),
                      raw.get("classifier"), int(raw.get("step", 0)), int(raw.get("epoch", 0)), resume, config,
                      list(raw.get("averaged_from", [])))


def save_checkpoint(path: PathLike, ckpt: Checkpoint) -> None:
    """Atomically write `ckpt` to `path` (temp file in the same dir, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(ckpt.to_dict(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _load_raw(path: PathLike, map_location="cpu", mmap: bool = False) -> Dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {e}") from None


def load_checkpoint(path: PathLike, map_location="cpu") -> Checkpoint:
    """Read a checkpoint file (either schema) with `weights_only=True`: no code runs from the file."""
    return Checkpoint.from_dict(_load_raw(path, map_location), path)


def checkpoint_step(path: PathLike) -> int:
    """The global step a checkpoint file was written at; tensors are memory-mapped, not read."""
    return int(_load_raw(path, mmap=True).get("step", -1))


def resolve_checkpoint(path: PathLike) -> Path:
    """A checkpoint file as given, or for an exp dir / its checkpoints dir the latest checkpoint."""
    p = Path(path)
    if p.is_dir():
        found = latest_checkpoint(p / "checkpoints" if (p / "checkpoints").is_dir() else p)
        if found is None:
            raise CheckpointError(f"no checkpoint under {p}")
        return found
    return p


def checkpoint_files(ckpt_dir: PathLike) -> List[Path]:
    """Epoch checkpoints in `ckpt_dir`, oldest first."""
    files = [p for p in Path(ckpt_dir).glob("epoch_*.pt") if _EPOCH_RE.search(p.name)]
    return sorted(files, key=lambda p: int(_EPOCH_RE.search(p.name).group(1)))


def latest_checkpoint(ckpt_dir: PathLike) -> Optional[Path]:
    """The checkpoint with the highest global step (`latest.pt` or an epoch file), or None."""
    candidates = checkpoint_files(ckpt_dir)
    mid = Path(ckpt_dir) / "latest.pt"
    if mid.exists():
        candidates.append(mid)
    best, best_step = None, -1
    for p in candidates:
        step = checkpoint_step(p)
        if step > best_step:
            best, best_step = p, step
    return best


def prune_checkpoints(ckpt_dir: PathLike, keep: int) -> None:
    """Delete all but the newest `keep` (>= 1) epoch checkpoints."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the newest checkpoint is never deleted), got {keep}")
    files = checkpoint_files(ckpt_dir)
    for p in files[: max(0, len(files) - keep)]:
        p.unlink()


def rebuild_model(ckpt: Checkpoint) -> nn.Module:
    """The embedding model of a checkpoint, weights loaded, in eval mode: `(B, T, F) -> (B, D)`."""
    model = build_model(ckpt.model_name, **ckpt.model_args)
    model.load_state_dict(ckpt.model)
    return model.eval()


def average_checkpoints(paths: List[PathLike]) -> Checkpoint:
    """A checkpoint whose model weights are the mean of `paths`' (float tensors; others from the last).

    Resume state is dropped: the result is for extraction or fine-tuning (`train.init_from`).
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    ckpts = [load_checkpoint(p) for p in paths]
    names = {c.model_name for c in ckpts}
    if len(names) != 1:
        raise ValueError(f"cannot average checkpoints of different models: {sorted(names)}")
    last = ckpts[-1]
    avg = {}
    for key, value in last.model.items():
        if value.is_floating_point():
            avg[key] = sum(c.model[key].double() for c in ckpts).div(len(ckpts)).to(value.dtype)
        else:
            avg[key] = value
    return dataclasses.replace(last, model=avg, resume=None, averaged_from=[str(p) for p in paths])
