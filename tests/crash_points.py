"""`python tests/crash_points.py KIND N -- <speakerlab.train.loop arguments>`: run training exactly like
`python -m speakerlab.train`, but SIGKILL the process at the N-th event of KIND:

    write  half-way through writing the N-th checkpoint file (a torn temporary file is left)
    load   while reading the N-th training crop
    step   in the middle of the N-th optimizer step (after backward, before the update)

tests/test_reliability.py uses it to kill runs at chosen points; nothing in speakerlab knows of it.
"""

import io
import os
import signal
import sys

import torch

import speakerlab.dataio.loaders.batches
from speakerlab.train.loop import main


def kill_at(kind: str, n: int) -> None:
    count = {"value": 0}

    def hit() -> bool:
        count["value"] += 1
        return count["value"] == n

    if kind == "write":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if not hasattr(f, "write") or not hit():
                return real_save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = save
    elif kind == "load":
        real_item = speakerlab.dataio.loaders.batches.CropDataset.__getitem__

        def item(self, index):
            if hit():
                os.kill(os.getpid(), signal.SIGKILL)
            return real_item(self, index)

        speakerlab.dataio.loaders.batches.CropDataset.__getitem__ = item
    elif kind == "step":
        real_clip = torch.nn.utils.clip_grad_norm_

        def clip(*args, **kwargs):
            if hit():
                os.kill(os.getpid(), signal.SIGKILL)
            return real_clip(*args, **kwargs)

        torch.nn.utils.clip_grad_norm_ = clip
    else:
        raise SystemExit(f"unknown kind {kind}")


if __name__ == "__main__":
    kind, n, sep, *rest = sys.argv[1:]
    assert sep == "--"
    kill_at(kind, int(n))
    sys.exit(main(rest))
