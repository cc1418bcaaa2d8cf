"""Average the weights of a run's last N epoch checkpoints (a cheap, reliable EER gain).

    speakerlab-average --exp-dir exp/campplus --last 5   # -> exp/campplus/checkpoints/avg.pt

The result is a full checkpoint (model name + arguments, speaker map, config) without optimizer
state: use it for extraction or as `train.init` of a fine-tuning run.
"""

from __future__ import annotations

import sys
from pathlib import Path

from speakerlab.checkpoint import CheckpointError, average_checkpoints, checkpoint_files, save_checkpoint
from speakerlab.commands import CommandParser


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
