"""`python tests/signal_points.py KIND N RANK -- <speakerlab.train.loop arguments>`: run training exactly like
`speakerlab-train` (under torchrun: as one of its workers), but the process of rank RANK sends itself
SIGTERM at the N-th event of KIND of this invocation:

    step        in the middle of the N-th optimizer step (after backward, before the update)
    write       half-way through writing the N-th checkpoint file (rank 0 writes them)
    validation  inside the N-th validation (rank 0 validates)
    loader      right after the N-th data-loader start-up (its workers forked, no batch read yet)
    twice       two SIGTERMs in a row in the middle of the N-th optimizer step

tests/test_preemption.py uses it; nothing in speakerlab knows of it (tests/crash_points.py is its SIGKILL twin).
"""

import io
import os
import signal
import sys

import torch

import speakerlab.train.state.selection
import speakerlab.train.state.validation
from speakerlab.train.loop import main


def term(times: int = 1) -> None:
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGTERM)


def signal_at(kind: str, n: int) -> None:
    count = {"value": 0}

    def hit() -> bool:
        count["value"] += 1
        return count["value"] == n

    if kind in ("step", "twice"):
        real_clip = torch.nn.utils.clip_grad_norm_

        def clip(*args, **kwargs):
            if hit():
                term(2 if kind == "twice" else 1)
            return real_clip(*args, **kwargs)

        torch.nn.utils.clip_grad_norm_ = clip
    elif kind == "write":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if not hasattr(f, "write") or not hit():
                return real_save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            term()
            f.write(data[len(data) // 2 :])

        torch.save = save
    elif kind == "validation":
        real_eer = speakerlab.train.state.validation.validation_eer

        def eer(*args, **kwargs):
            if hit():
                term()
            return real_eer(*args, **kwargs)

        # data.val's validation (model selection's) and each corpus's own: the modules that call it.
        speakerlab.train.state.selection.validation_eer = eer
        speakerlab.train.state.validation.validation_eer = eer
    elif kind == "loader":
        real_iter = torch.utils.data.DataLoader.__iter__

        def start(self):
            it = real_iter(self)
            if hit():
                term()
            return it

        torch.utils.data.DataLoader.__iter__ = start
    else:
        raise SystemExit(f"unknown kind {kind}")


if __name__ == "__main__":
    kind, n, rank, sep, *rest = sys.argv[1:]
    assert sep == "--"
    if os.environ.get("RANK", "0") == rank:
        signal_at(kind, int(n))
    sys.exit(main(rest))
