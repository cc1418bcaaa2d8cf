"""`python tests/crash_points.py`: a server of training runs that SIGKILL themselves. Per line on stdin, a JSON list
`[KIND, N, OUT_FILE, <speakerlab.train.loop arguments>...]`: it forks a child that trains exactly like `python -m
speakerlab.train` (stdout and stderr to OUT_FILE) but is SIGKILLed at the N-th event of KIND,

    write  half-way through writing the N-th checkpoint file (a torn temporary file is left)
    load   while reading the N-th training crop
    step   in the middle of the N-th optimizer step (after backward, before the update)

and answers with the child's exit code as `subprocess` gives it (-9: SIGKILL), one line on stdout. Each child is a
fresh copy of a process that imported torch (with torch._dynamo, which the optimizer imports) and speakerlab once and
ran nothing: a new interpreter per run cost seconds of CPU.

tests/test_reliability.py uses it to kill runs at chosen points; nothing in speakerlab knows of it.
"""

import io
import json
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


def child(kind: str, n: int, out: str, args: list) -> None:
    """In the forked child: output to `out`, the kill point set, training; never returns."""
    code = 1
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        kill_at(kind, n)
        code = main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)  # sys.exit's own rule
    except BaseException:  # noqa: BLE001 - reported as an unforked run would, then the exit code
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import torch._dynamo  # noqa: F401 - what every run's optimizer imports first (torch._disable_dynamo): seconds

    for line in sys.stdin:
        kind, n, out, *args = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(kind, int(n), out, args)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(code, flush=True)


if __name__ == "__main__":
    serve()
