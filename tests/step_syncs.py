"""`torchrun --nproc_per_node=2 tests/step_syncs.py OUT speakerlab-train's arguments...`: the host syncs and the
collectives of each training step on gloo ranks; each rank writes OUT/rank<R>.json (tests/test_step_syncs.py runs
it and asserts on it; nothing in speakerlab knows of it).

A CPU has no device to wait for, so the script tells host from device as a GPU would: a tensor is on the host
when it was made from the loader (collate, numpy) or by a factory without a `device` argument, or from host
tensors only; every other tensor (parameters, gradients, `.to(device)`, factories given the run's device) is a
device tensor. A host sync is `item`, `tolist`, `cpu`, `numpy`, `bool`, `float`, `int` or `index` of a device
tensor, or what sizes its result by a device tensor's data (`nonzero`, `unique`, `masked_select`, indexing by a
bool mask); a torch function mode sees each. A copy of a device tensor to the host made by speakerlab's own code
(`.to("cpu")`, `.copy_` into a host tensor) is a host sync too, `non_blocking` or not, unless copied into pinned
memory without blocking (on CUDA only that stays asynchronous, and the copy is unreadable until a later sync).
A `.to(device)` given a torch.device is taken as a move to the run's device (on a CPU run the two are one name;
speakerlab spells a move to the host `.cpu()` or `.to("cpu")`). Collectives: every public `torch.distributed`
collective, wrapped. DDP's own (its gradient buckets, in C++) are not seen. Each record names the first speakerlab
frame that made it, `path:function`.

One interval runs from a `train_step` call to the next: the step, the loop's work after it and the check before
the next. An interval is `logging` when the loop logged, saved or ended an epoch in it.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

import speakerlab.train.loop as loop
from speakerlab.train.state import resume

SYNCS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}
SHAPE_SYNCS = {"nonzero", "argwhere", "unique", "masked_select"}  # their output's size is read on the host
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
)
PACKAGE = str(Path(loop.__file__).resolve().parents[1])  # .../speakerlab

intervals = []  # {"step": what its train_step makes, "logging": bool, "syncs": [...], "collectives": [...]}


def where() -> str:
    """`speakerlab/...py:function` of the innermost speakerlab frame of the caller, else `other`."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE):
            return f"speakerlab{path[len(PACKAGE) :]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "other"


def record(kind: str, name: str) -> None:
    if intervals:
        intervals[-1][kind].append(f"{name} {where()}")


def leaves(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from leaves(v)


def to_host(name: str, args, kwargs) -> bool:
    """A device tensor copied to the host by a call in speakerlab itself (torch's own moves within an op are not)."""
    if name not in ("to", "copy_") or not sys._getframe(2).f_code.co_filename.startswith(PACKAGE):
        return False  # frames: 0 this, 1 __torch_function__, 2 the caller
    source = args[1] if name == "copy_" else args[0]
    if not isinstance(source, torch.Tensor) or getattr(source, "_on_host", False):
        return False
    if name == "copy_":
        pinned = kwargs.get("non_blocking", args[2] if len(args) > 2 else False) and args[0].is_pinned()
        return getattr(args[0], "_on_host", False) and not pinned
    return any(isinstance(a, str) and torch.device(a).type == "cpu" for a in (*args[1:], kwargs.get("device")))


def bool_mask(t: torch.Tensor) -> bool:
    return t.dtype == torch.bool and not getattr(t, "_on_host", False)


class HostOrDevice(TorchFunctionMode):
    """Marks host tensors (`_on_host`) as they are made and records the host syncs of device tensors."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = list(leaves((args, kwargs)))
        host = all(getattr(t, "_on_host", False) for t in tensors)
        if not tensors:  # a factory: on the host unless told a device
            host = kwargs.get("device") is None
        if name in SYNCS | SHAPE_SYNCS and tensors and not getattr(tensors[0], "_on_host", False):
            record("syncs", name)
        elif name in ("__getitem__", "__setitem__") and any(bool_mask(t) for t in leaves(args[1:2])):
            record("syncs", f"{name} by a mask")
        elif to_host(name, args, kwargs):
            record("syncs", f"{name} the host")
        moved = name == "to" and any(isinstance(a, (torch.device, str)) for a in (*args[1:], kwargs.get("device")))
        out = func(*args, **kwargs)
        if (moved or name == "cpu") and any(out is t for t in tensors):
            out = out.clone()  # a GPU copies between host and device: the two must not be one tensor here
        if moved:  # to the run's device (on a CPU run the same device name as the host's)
            out._on_host = False
        elif host or name == "cpu":
            for t in leaves(out):
                t._on_host = True
        return out


def wrap_collective(name: str):
    real = getattr(dist, name)

    def counted(*args, **kwargs):
        record("collectives", name)
        return real(*args, **kwargs)

    setattr(dist, name, counted)


def mark_logging(fn):
    def marked(*args, **kwargs):
        if intervals:
            intervals[-1]["logging"] = True
        return fn(*args, **kwargs)

    return marked


def main(out: str, *train_args: str) -> None:
    for name in COLLECTIVES:
        wrap_collective(name)
    step = loop.train_step

    def counted_step(run, batches):
        intervals.append({"step": run.state.step + 1, "logging": False, "syncs": [], "collectives": []})
        return step(run, batches)

    loop.train_step = counted_step
    loop.log_step = mark_logging(loop.log_step)
    loop.save_mid_epoch = mark_logging(loop.save_mid_epoch)
    loop.end_epoch = mark_logging(loop.end_epoch)
    resume.save_mid_epoch = mark_logging(resume.save_mid_epoch)
    with HostOrDevice():
        code = loop.run(list(train_args))
    rank = int(os.environ["RANK"])
    Path(out, f"rank{rank}.json").write_text(json.dumps({"code": code, "intervals": intervals}, indent=1))
    # As tests/sharded_ranks.py: leave without the interpreter's teardown of gloo's threads.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
