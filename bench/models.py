"""Model costs: parameters, forward MACs for 3 s, CPU fwd+bwd time, GPU samples/s.

    python bench/models.py                       # every registered model
    python bench/models.py --models campplus --repeats 7
    python bench/models.py --reference-root /path/to/3D-Speaker   # also time the reference code

CPU: median of `--repeats` forward+backward passes of a (16, 200, 80) batch with 2 threads (after
one warm-up). With `--reference-root` (a checkout of the reference implementation; nothing of it is
part of this project), each model's reference class is built with the same arguments and timed in
the same run, interleaved, so machine noise hits both alike. The reference's `speakerlab` is imported
in isolation from our (possibly editable-installed) package of the same name; a root without
speakerlab/models/ is a usage error, a reference module that fails to import or build prints
"failed" and the reason, and exits 1; models REFERENCE has no counterpart for print "n/a" and say so.
Every registered model is covered by default, each at its builder's default input width. GPU (when
available): training samples/s at batch 64 x 200 frames in bf16 autocast and in fp32 (TF32 on).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import inspect
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speakerlab.models import build_model, list_models  # noqa: E402

# Where the reference implementation keeps each architecture (module, class, constructor kwargs).
REFERENCE = {
    "campplus": ("speakerlab.models.campplus.DTDNN", "CAMPPlus", {"feat_dim": 80, "embedding_size": 512}),
    "eres2net_base": (
        "speakerlab.models.eres2net.ERes2Net",
        "ERes2Net",
        {"feat_dim": 80, "embedding_size": 192, "m_channels": 32},
    ),
    "eres2net_large": (
        "speakerlab.models.eres2net.ERes2Net",
        "ERes2Net",
        {"feat_dim": 80, "embedding_size": 192, "m_channels": 64},
    ),
    "eres2netv2": ("speakerlab.models.eres2net.ERes2NetV2", "ERes2NetV2", {"feat_dim": 80, "embedding_size": 192}),
    "ecapa_tdnn_c1024": (
        "speakerlab.models.ecapa_tdnn.ECAPA_TDNN",
        "ECAPA_TDNN",
        {"input_size": 80, "lin_neurons": 192, "channels": [1024, 1024, 1024, 1024, 3072]},
    ),
    "resnet34": (
        "speakerlab.models.resnet.ResNet",
        "ResNet",
        {"feat_dim": 80, "embedding_size": 192, "m_channels": 32},
    ),
}


def macs(model, frames=300, feat_dim=80) -> float:
    """Forward multiply-accumulates for one `(1, frames, feat_dim)` input (FLOPs / 2)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model.eval()(torch.randn(1, frames, feat_dim))
    return counter.get_total_flops() / 2


def fwd_bwd(model, x) -> float:
    model.train()
    t = time.perf_counter()
    model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def gpu_samples_per_s(model, precision, batch=64, frames=200, steps=20, feat_dim=80) -> float:
    dev = torch.device("cuda")
    model = model.to(dev).train()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, frames, feat_dim, device=dev)
    ctx = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if precision == "bf16" else torch.enable_grad

    def step():
        with ctx():
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - t)


class ReferenceError_(RuntimeError):
    """The reference checkout cannot be used (missing, or a module of it does not import)."""


class _ReferenceFinder(importlib.abc.MetaPathFinder):
    """Resolves `speakerlab` and `speakerlab.*` under the reference root only, ahead of every other finder.

    The reference package has our top-level name; with this project installed editable, setuptools'
    finder in sys.meta_path maps `speakerlab` to our tree whatever sys.path says, so putting the root on
    sys.path alone imports our package again (and its missing reference modules used to show as "-")."""

    def __init__(self, root: Path):
        self.root = str(root)

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "speakerlab" and not fullname.startswith("speakerlab."):
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, path if path is not None else [self.root])


def check_reference_root(root: Path) -> Path:
    root = root.resolve()
    if not (root / "speakerlab" / "models").is_dir():
        raise ReferenceError_(
            f"--reference-root {root}: no speakerlab/models/ there (give the root of a 3D-Speaker checkout)"
        )
    return root


def reference_model(name, root: Path):
    """The reference implementation of `name` built with REFERENCE's arguments, or None when REFERENCE lists no
    counterpart. Its `speakerlab` is imported in isolation (our modules are set aside and put back) and every
    module loaded must come from under `root`; anything else raises ReferenceError_ saying why."""
    if name not in REFERENCE:
        return None
    mod, cls, kwargs = REFERENCE[name]
    ours = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "speakerlab" or k.startswith("speakerlab.")}
    finder = _ReferenceFinder(root)
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module(mod)
        where = Path(getattr(module, "__file__", "") or "").resolve()
        if root not in where.parents:
            raise ReferenceError_(f"{mod} was loaded from {where}, not from under {root}")
        return getattr(module, cls)(**kwargs)
    except ReferenceError_:
        raise
    except Exception as e:  # an import or constructor failure: say which and why
        raise ReferenceError_(f"{mod}.{cls}{tuple(kwargs.items())!s} from {root}: {type(e).__name__}: {e}") from e
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "speakerlab" or k.startswith("speakerlab.")]:
            del sys.modules[k]
        sys.modules.update(ours)


def model_feat_dim(name) -> int:
    """The builder's default input width (80 for fbank models; ReDimNet2 takes 72 bins)."""
    from speakerlab.models.registry import _BUILDERS

    param = inspect.signature(_BUILDERS[name]).parameters.get("feat_dim")
    return 80 if param is None or param.default is param.empty else int(param.default)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list_models())
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference-root", type=Path)
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.models) - set(list_models()))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; registered: {', '.join(list_models())}")
    if args.reference_root:
        try:
            args.reference_root = check_reference_root(args.reference_root)
        except ReferenceError_ as e:
            ap.error(str(e))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gpu = torch.cuda.is_available() and not args.no_gpu
    print(f"# command: python {' '.join(map(shlex.quote, sys.argv))}")
    print(
        f"# cpu: {platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"
        + (f"; gpu: {torch.cuda.get_device_name()}" if gpu else "")
    )
    head = f"{'model':<20}{'params':>12}{'GMACs(3s)':>11}{'cpu fwd+bwd s':>15}"
    head += f"{'reference s':>13}" if args.reference_root else ""
    head += f"{'gpu bf16 /s':>13}{'gpu fp32 /s':>13}" if gpu else ""
    print(head)
    notes, failed = [], False
    for name in args.models:
        feat_dim = model_feat_dim(name)
        x = torch.randn(16, 200, feat_dim)
        model = build_model(name)
        params = sum(p.numel() for p in model.parameters())
        gmacs = macs(model, feat_dim=feat_dim) / 1e9
        ref, ref_cell = None, ""
        if args.reference_root:
            try:
                ref = reference_model(name, args.reference_root)
                ref_cell = "" if ref is not None else "n/a"
                if ref is None:
                    notes.append(f"# reference {name}: n/a, bench/models.py's REFERENCE lists no counterpart")
            except ReferenceError_ as e:
                ref_cell, failed = "failed", True
                notes.append(f"# reference {name}: failed: {e}")
        fwd_bwd(model, x)
        if ref is not None:
            fwd_bwd(ref, x)
        ours, theirs = [], []
        for _ in range(args.repeats):  # interleaved: drifting machine load hits both alike
            ours.append(fwd_bwd(model, x))
            if ref is not None:
                theirs.append(fwd_bwd(ref, x))
        row = f"{name:<20}{params:>12,}{gmacs:>11.2f}{statistics.median(ours):>15.3f}"
        if args.reference_root:
            row += f"{statistics.median(theirs):>13.3f}" if theirs else f"{ref_cell:>13}"
        if gpu:
            row += (
                f"{gpu_samples_per_s(build_model(name), 'bf16', feat_dim=feat_dim):>13.0f}"
                f"{gpu_samples_per_s(build_model(name), 'fp32', feat_dim=feat_dim):>13.0f}"
            )
        print(row, flush=True)
    for line in notes:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
