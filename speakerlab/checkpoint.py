"""Checkpoints: the one schema, written and read here.

A checkpoint file is a dict of tensors and plain Python values (loadable with `weights_only=True`):

    schema         2
    model_name     registered builder name          model_args   its keyword arguments
    model          embedding-model state dict       features     FeatureSpec.to_dict(): front-end kind, its
                                                                 settings, mean_norm (no kind: kaldi_fbank)
    speakers       the classifier's speaker list    classifier   classifier state dict (None after export)
    step, epoch    optimizer steps / epochs done    resume       ResumeState.to_dict(), or None
    config         the training config as written, kept as a record of provenance only
    averaged_from  paths, for an averaged checkpoint

Inference needs only model_name, model_args, model and features: it never reads `config`, so
renaming or removing a config key does not break old checkpoints. Files without `schema` were written
before it existed (schema 1: features inside `config`, resume state at the top level) and are read too.

Every file also carries `digest`, a BLAKE2b hash of all the above (tensor bytes included), checked
on load: a corrupted file is an error naming it, never a silently wrong model.

Files are written to a temporary name, fsynced and renamed, so a crash mid-write never leaves a
truncated checkpoint (a failed write removes its temporary file; `remove_stale_temp_files` clears
those of a killed run). Layout under `<exp>/checkpoints/`: `epoch_NNN.pt` at the end of epoch NNN
(the last `keep` are kept, for averaging), `partial_NNN.pt` during epoch NNN (overwritten, removed
when the epoch ends). The names alone order them, so the newest is found without opening any file.
`best.pt` (train.keep_best) is the model of the lowest validation EER, without resume state: what
`run_result` hands back for the exp dir.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.models import load_model
from speakerlab.outputs import OutputError, output_file

SCHEMA = 2
_EPOCH_RE = re.compile(r"epoch_(\d+)\.pt$")
_NAME_RE = re.compile(r"(epoch|partial)_(\d+)\.pt$")
PathLike = Union[str, Path]


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or not one of ours; the message names the file."""


@dataclass(kw_only=True)
class ResumeState:
    """What only resuming a run needs, beyond the weights."""

    optimizer: Dict[str, Any]
    scaler: Dict[str, Any]
    step_in_epoch: int = 0
    skipped_steps: int = 0
    rng_cpu: Optional[torch.Tensor] = None
    rng_cuda: List[torch.Tensor] = field(default_factory=list)
    selection: Dict[str, Any] = field(default_factory=dict)  # model selection so far (train.keep_best)

    def to_dict(self) -> Dict[str, Any]:
        # Not dataclasses.asdict: it would deep-copy every optimizer tensor.
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(kw_only=True)
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
    digest: str = ""  # as read from a file (not written by to_dict): which weights these are, e.g. for embeddings

    def to_dict(self) -> Dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model_name": self.model_name,
            "model_args": dict(self.model_args),
            "model": self.model,
            "features": self.features.to_dict(),
            "speakers": list(self.speakers),
            "classifier": self.classifier,
            "step": self.step,
            "epoch": self.epoch,
            "resume": None if self.resume is None else self.resume.to_dict(),
            "config": self.config,
            "averaged_from": list(self.averaged_from),
        }

    @classmethod
    def from_dict(cls, raw: Dict[str, Any], where: PathLike = "checkpoint") -> "Checkpoint":
        if not isinstance(raw, dict) or "model_name" not in raw or "model" not in raw:
            raise CheckpointError(
                f"{where}: not a speakerlab checkpoint (no model_name/model); for a 3D-Speaker "
                "state dict use --3dspeaker NAME --weights FILE"
            )
        schema = raw.get("schema", 1)
        try:
            if schema == 1:
                return _from_schema1(raw)
            if schema != SCHEMA:
                raise CheckpointError(f"{where}: checkpoint schema {schema} is newer than this speakerlab ({SCHEMA})")
            resume = raw.get("resume")
            return cls(
                model_name=raw["model_name"],
                model_args=dict(raw["model_args"]),
                model=raw["model"],
                features=FeatureSpec.from_dict(raw["features"]),
                speakers=list(raw.get("speakers", [])),
                classifier=raw.get("classifier"),
                step=int(raw.get("step", 0)),
                epoch=int(raw.get("epoch", 0)),
                resume=None if resume is None else ResumeState(**resume),
                config=raw.get("config") or {},
                averaged_from=list(raw.get("averaged_from", [])),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed checkpoint (schema {schema}): {e!r}") from None


def _from_schema1(raw: Dict[str, Any]) -> Checkpoint:
    """Files written before the schema: features and sample rate lived in the stored training config."""
    config = raw.get("config") or {}
    f, data = config["features"], config.get("data", {})
    fbank = FbankConfig(
        sample_rate=int(data.get("sample_rate", 16000)),
        num_mel_bins=int(f["num_mel_bins"]),
        frame_length_ms=float(f["frame_length_ms"]),
        frame_shift_ms=float(f["frame_shift_ms"]),
        window_type=str(f["window_type"]),
        dither=0.0,
    )
    resume = None
    if "optimizer" in raw:
        resume = ResumeState(
            optimizer=raw["optimizer"],
            scaler=raw.get("scaler", {}),
            step_in_epoch=int(raw.get("step_in_epoch", 0)),
            skipped_steps=int(raw.get("skipped_steps", 0)),
            rng_cpu=raw.get("rng_cpu"),
            rng_cuda=list(raw.get("rng_cuda", [])),
        )
    return Checkpoint(
        model_name=raw["model_name"],
        model_args=dict(raw["model_args"]),
        model=raw["model"],
        features=FeatureSpec(fbank, bool(f.get("mean_norm", True))),
        speakers=list(raw.get("speakers", [])),
        classifier=raw.get("classifier"),
        step=int(raw.get("step", 0)),
        epoch=int(raw.get("epoch", 0)),
        resume=resume,
        config=config,
        averaged_from=list(raw.get("averaged_from", [])),
    )


def content_digest(value: Any) -> str:
    """BLAKE2b of a checkpoint's contents: dict keys sorted, tensors by dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=20)

    def feed(v):
        if isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v, key=str):
                h.update(repr(k).encode())
                feed(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for item in v:
                feed(item)
            h.update(b"]")
        elif isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(v).encode())

    feed(value)
    return h.hexdigest()


def save_checkpoint(path: PathLike, ckpt: Checkpoint) -> None:
    """Atomically write `ckpt` to `path` (temp file in the same dir, fsync, rename), with its digest.

    A failed write (a full disk, say) removes its temporary file and raises CheckpointError naming
    `path`; whatever `path` held before is untouched."""
    path = Path(path)
    raw = ckpt.to_dict()
    raw["digest"] = content_digest(raw)
    try:
        with output_file(path, "wb") as f:  # its temporary files are `.<name>.tmp<pid>` (remove_stale_temp_files)
            torch.save(raw, f)
    except (OSError, OutputError) as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {e}; the previous checkpoints are intact") from None


def remove_stale_temp_files(ckpt_dir: PathLike) -> List[Path]:
    """Delete the temporary files a killed run left mid-write in `ckpt_dir`; return them."""
    stale = sorted(Path(ckpt_dir).glob(".*.pt.tmp*"))
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def load_raw(path: PathLike, map_location="cpu", mmap: bool = False) -> Any:
    """What a weights file holds, read with `weights_only=True`: a checkpoint's dict, or any state dict."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a folder, not a weights file")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        raise CheckpointError(f"checkpoint {path} cannot be loaded: {why_not_weights(path, e)}") from None


def why_not_weights(path: Path, error: Exception) -> str:
    """What `path` is, when `torch.load(weights_only=True)` refused it: text or another format, a damaged
    PyTorch file, or one holding Python objects. One line; never the advice to lift weights_only (that would
    run code from the file)."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch.save's zip archive, or a legacy pickle
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if found:
            return (
                f"it holds Python objects ({found.group(1)}), not only weights; speakerlab reads weights only and "
                "runs no code from a file (save the state dict alone)"
            )
        first = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
        return f"a damaged or incomplete PyTorch file ({first})" if "weights_only" not in first else "a damaged file"
    if not head:
        return "it is empty, not a PyTorch weights file"
    try:
        head.decode("utf-8")
        kind = "a text file"
    except UnicodeDecodeError as e:
        kind = "a text file" if e.start >= len(head) - 3 else "binary data of another format"  # a cut character
    return f"it is {kind}, not a PyTorch weights file (torch.save writes a zip archive or a pickle)"


def load_checkpoint(path: PathLike, map_location="cpu") -> Checkpoint:
    """Read a checkpoint file (either schema) with `weights_only=True` (no code runs from the file) and
    check its digest (files written before digests existed have none to check)."""
    return checkpoint_from_raw(load_raw(path, map_location), path)


def checkpoint_from_raw(raw: Any, path: PathLike) -> Checkpoint:
    """`load_checkpoint` of what `torch.load` returned for `path`: the digest checked, the schema read."""
    stored = ""
    if isinstance(raw, dict) and "digest" in raw:
        stored = raw.pop("digest")
        if content_digest(raw) != stored:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: its contents do not match the digest written "
                "with it (a damaged or partly overwritten file)"
            )
    ckpt = Checkpoint.from_dict(raw, path)
    ckpt.digest = stored
    return ckpt


def _order(path: Path) -> int:
    """Position of a checkpoint file in its run, from the name alone: epoch_N after partial_N (epoch N
    in progress) after epoch_{N-1}."""
    m = _NAME_RE.search(path.name)
    n = int(m.group(2))
    return 2 * n if m.group(1) == "epoch" else 2 * n - 1


def run_checkpoints(ckpt_dir: PathLike) -> List[Path]:
    """Every checkpoint of a run in `ckpt_dir`, newest first (by name; no file is opened)."""
    d = Path(ckpt_dir)
    named = [p for p in d.glob("*.pt") if _NAME_RE.search(p.name)]
    return sorted(named, key=_order, reverse=True)


def load_latest(
    ckpt_dir: PathLike, map_location="cpu", warn: Callable[[str], None] = lambda m: None
) -> Optional[Tuple[Path, Checkpoint]]:
    """The newest intact checkpoint of a run, or None when there is none. A newer file that cannot be
    read or fails its digest is reported through `warn` and passed over; when every file is bad the
    error names them all."""
    bad = []
    for path in run_checkpoints(ckpt_dir):
        try:
            return path, load_checkpoint(path, map_location)
        except CheckpointError as e:
            bad.append(str(e))
            warn(f"warning: {e}; using the previous checkpoint")
    if bad:
        raise CheckpointError(f"no intact checkpoint in {ckpt_dir}:\n  " + "\n  ".join(bad))
    return None


def load_given(path: PathLike, warn: Callable[[str], None] = lambda m: None) -> Tuple[Path, Checkpoint]:
    """A checkpoint file as given, or for an exp dir / its checkpoints dir the newest intact one."""
    p = Path(path)
    if p.is_dir():
        found = load_latest(p / "checkpoints" if (p / "checkpoints").is_dir() else p, warn=warn)
        if found is None:  # other .pt files there are not a run's: name one to give it by path
            other = next(iter(sorted((p / "checkpoints" if (p / "checkpoints").is_dir() else p).glob("*.pt"))), None)
            hint = f" (for {other.name} there, give that file)" if other else ""
            raise CheckpointError(f"no checkpoint under {p}: a run's are checkpoints/epoch_N.pt or partial_N.pt{hint}")
        return found
    return p, load_checkpoint(p)


def run_result(path: PathLike, warn: Callable[[str], None] = lambda m: None) -> Tuple[Path, Checkpoint]:
    """The model a run hands back: for an exp dir its `checkpoints/best.pt` (model selection) when that is there
    and intact, else, as `load_given`, its newest intact checkpoint (a corrupt best.pt reported through `warn`);
    a checkpoint file as given."""
    best = Path(path) / "checkpoints" / "best.pt"
    if Path(path).is_dir() and best.exists():
        try:
            return best, load_checkpoint(best)
        except CheckpointError as e:
            warn(f"warning: {e}; using the newest intact checkpoint of the run instead")
    return load_given(path, warn)


def checkpoint_files(ckpt_dir: PathLike) -> List[Path]:
    """Epoch checkpoints in `ckpt_dir`, oldest first."""
    files = [p for p in Path(ckpt_dir).glob("epoch_*.pt") if _EPOCH_RE.search(p.name)]
    return sorted(files, key=lambda p: int(_EPOCH_RE.search(p.name).group(1)))


def latest_checkpoint(ckpt_dir: PathLike) -> Optional[Path]:
    """The newest checkpoint file of a run (by name, not opened), or None."""
    files = run_checkpoints(ckpt_dir)
    return files[0] if files else None


def prune_checkpoints(ckpt_dir: PathLike, keep: int) -> None:
    """Delete all but the newest `keep` (>= 1) epoch checkpoints."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the newest checkpoint is never deleted), got {keep}")
    files = checkpoint_files(ckpt_dir)
    for p in files[: max(0, len(files) - keep)]:
        p.unlink()


def rebuild_model(ckpt: Checkpoint) -> nn.Module:
    """The embedding model of a checkpoint in memory (an average, say), weights loaded, in eval mode: `(B, T, F) ->
    (B, D)`. A file is read through speakerlab.sources."""
    return load_model(ckpt.model_name, ckpt.model_args, ckpt.model)
