"""Average the weights of a run's last N epoch checkpoints (a cheap, reliable EER gain).

    speakerlab-average --exp-dir exp/campplus --last 5   # -> exp/campplus/checkpoints/avg.pt

The result is a full checkpoint (model name + arguments, speaker map, config) without optimizer
state: use it for extraction or as `train.init` of a fine-tuning run.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Dict, List

import torch

from speakerlab.checkpoint import (
    Checkpoint,
    CheckpointError,
    PathLike,
    checkpoint_files,
    load_checkpoint,
    save_checkpoint,
)
from speakerlab.commands import CommandParser


def _mean_state(states: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Element-wise mean (in float64, stored in each tensor's dtype) of the floating-point tensors of
    state dicts with the same keys; other tensors (BatchNorm's counters) are the last one's."""
    last = states[-1]
    return {
        k: sum(s[k].double() for s in states).div(len(states)).to(v.dtype) if v.is_floating_point() else v
        for k, v in last.items()
    }


def average_checkpoints(paths: List[PathLike]) -> Checkpoint:
    """A checkpoint whose model and classifier weights are the means of `paths`' (float tensors; others from
    the last). The classifier is averaged with the embedding network it scores, so a fine-tuning run
    started from the average (stage 7) begins from a consistent pair; it is dropped (None) when a
    checkpoint lacks it or the speaker lists differ.

    Resume state is dropped: the result is for extraction or fine-tuning (`train.init`).
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    ckpts = [load_checkpoint(p) for p in paths]
    last = ckpts[-1]
    shapes = {k: v.shape for k, v in last.model.items()}
    for path, c in zip(paths, ckpts):
        if c.model_name != last.model_name or {k: v.shape for k, v in c.model.items()} != shapes:
            raise ValueError(
                f"cannot average checkpoints of different models: {path} holds {c.model_name} {c.model_args}, "
                f"{paths[-1]} {last.model_name} {last.model_args}"
            )
    same_classes = all(c.classifier is not None and c.speakers == last.speakers for c in ckpts)
    classifier = _mean_state([c.classifier for c in ckpts]) if same_classes else None
    return dataclasses.replace(
        last,
        model=_mean_state([c.model for c in ckpts]),
        classifier=classifier,
        resume=None,
        averaged_from=[str(p) for p in paths],
    )


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-average", description=__doc__.split("\n")[0])
    ap.add_argument("--exp-dir", required=True, help="the run whose newest epoch checkpoints to average")
    ap.add_argument("--last", type=int, default=5, help="number of newest epoch checkpoints to average")
    ap.add_argument("--out", help="output file (default <exp-dir>/checkpoints/avg.pt)")
    args = ap.parse_args(argv)
    if args.last < 1:
        ap.error(f"--last must be >= 1, got {args.last}")
    files = checkpoint_files(Path(args.exp_dir) / "checkpoints")
    if not files:
        print(f"error: no epoch checkpoints under {args.exp_dir}/checkpoints", file=sys.stderr)
        return 2
    chosen = files[-args.last :]
    if len(chosen) < args.last:
        print(
            f"average: only {len(chosen)} epoch checkpoint(s) kept; averaging those "
            f"(raise train.keep_checkpoints to keep more)",
            file=sys.stderr,
        )
    out = Path(args.out) if args.out else Path(args.exp_dir) / "checkpoints" / "avg.pt"
    try:
        save_checkpoint(out, average_checkpoints(chosen))
    except (CheckpointError, ValueError) as e:  # a damaged file, another model's, an --out it cannot write
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"average: {', '.join(p.name for p in chosen)} -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
