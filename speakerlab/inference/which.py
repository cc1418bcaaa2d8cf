"""Which model a model path stands for: `speakerlab-which MODEL` -> `PATH<tab>description`.

MODEL is a checkpoint file or an exp dir; an exp dir stands for the run's result (`checkpoint.run_result`:
checkpoints/best.pt under model selection, else its newest intact checkpoint, a corrupt one said on stderr).
The recipes embed the file it names and say it next to the EER, so a result line names the checkpoint that
made it. No checkpoint: one error line, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from speakerlab.checkpoint import Checkpoint, CheckpointError, run_result
from speakerlab.commands import CommandParser, run_command


def describe(path: Path, ckpt: Checkpoint) -> str:
    """Which model a checkpoint file holds: 'epoch 3, the lowest validation EER', 'epoch 5, step 400', ..."""
    if ckpt.averaged_from:
        return f"the average of {len(ckpt.averaged_from)} checkpoints"
    if path.name == "best.pt":
        if ckpt.epoch == 0:
            return "the model the run started from: training did not lower the validation EER"
        return f"epoch {ckpt.epoch}, the lowest validation EER"
    return f"epoch {ckpt.epoch}, step {ckpt.step}"


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-which", description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a checkpoint file or an exp dir")
    args = ap.parse_args(argv)

    def work():
        path, ckpt = run_result(args.model, warn=lambda m: print(m, file=sys.stderr))
        print(f"{path}\t{describe(Path(path), ckpt)}")

    return run_command(work, (CheckpointError,))


if __name__ == "__main__":
    sys.exit(main())
