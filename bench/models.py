"""Model costs: parameters, forward MACs for 3 s, CPU fwd+bwd time, GPU samples/s.

    python bench/models.py                       # every registered model
    python bench/models.py --models campplus --repeats 7
    python bench/models.py --reference-root /path/to/3D-Speaker --reference-root /path/to/redimnet2

CPU: median of `--repeats` forward+backward passes of a (16, 200, F) batch with 2 threads (after
one warm-up), F the builder's default input width (80; 72 for ReDimNet2). GPU (when available):
training samples/s at batch 64 x 200 frames in bf16 autocast and in fp32 (TF32 on).

`--reference-root DIR` (repeatable) names a checkout of a reference implementation (nothing of it
is part of this project), recognised by its layout: a 3D-Speaker checkout has speakerlab/models/,
the official ReDimNet2 code (PalabraAI/redimnet2) has redimnet2/redimnet2.py; any other directory,
or two of the same kind, is a usage error naming it. Each model REFERENCE lists is then also built
from the reference class and timed in the same run on the same input tensor, interleaved with ours in
alternating order so machine noise hits both alike; the table gains the reference's time and the ratio ours/reference,
and a note per model gives the reference's class, parameters and GMACs next to ours (like with like).

- 3D-Speaker: the class with the arguments in REFERENCE, taking (B, T, 80) fbank like ours.
- ReDimNet2 B0-B6: `redimnet2.redimnet2.ReDimNet2Wrap(**reference_kwargs)` with each size's official
  constructor settings from tests/data/redimnet2/b<i>.json. Its forward is
  `spec(waveform) -> (B, 72, T) log-mel -> unsqueeze(1) -> backbone -> pool -> bn -> linear`; we time
  the model body only, as ours takes features: `spec` (the mel front-end, 'tf' for these sizes) is
  replaced by a transpose (B, T, 72) -> (B, 72, T), a view, the same first step as our forward.
  The official code imports torchaudio at module level for its other ('pt') front-end; torchaudio
  is not a dependency here, so when it is not installed a stand-in module without attributes is put
  in sys.modules for the reference import only (the 'tf' front-end, needing scipy, is what is built);
  the constructor's own prints are swallowed.

Each reference package is imported in isolation: its top-level package (`speakerlab` for 3D-Speaker,
which is our own package's name, also when ours is installed editable; `redimnet2`) resolves under
its root only, through a meta-path finder ahead of every other, our modules of that name are set
aside and put back, and the reference's modules are dropped from sys.modules afterwards, so nothing
of it leaks into our imports. A reference that fails to import, build or run prints "failed" and the
reason, and the bench exits 1; a model with no counterpart in REFERENCE, or whose project's root was
not given, prints "n/a" and says why.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import platform
import shlex
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speakerlab.models import build_model, list_models  # noqa: E402

REDIMNET2_FIXTURES = ROOT / "tests" / "data" / "redimnet2"


@dataclass(frozen=True)
class Project:
    """A reference implementation: its top-level package and the path under a checkout's root that marks it."""

    name: str
    package: str
    marker: str  # relative to the root; a directory when it ends in "/"
    torchaudio_stand_in: bool = False  # import it with a stand-in torchaudio when the real one is missing


PROJECTS = {
    p.name: p
    for p in (
        Project("3D-Speaker", "speakerlab", "speakerlab/models/"),
        Project("ReDimNet2", "redimnet2", "redimnet2/redimnet2.py", torchaudio_stand_in=True),
    )
}


class _MelMajor(nn.Module):
    """Stands in for ReDimNet2Wrap's `spec` front-end: our (B, T, F) features -> its (B, F, T) log-mel layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


def _redimnet2_body(model: nn.Module) -> nn.Module:
    if not isinstance(getattr(model, "spec", None), nn.Module):
        raise TypeError(f"{type(model).__name__} has no `spec` front-end module to replace")
    model.spec = _MelMajor()
    return model


@dataclass(frozen=True)
class Reference:
    """Where a project keeps an architecture: module, class, and its constructor arguments (given, or the
    `reference_kwargs` of a test fixture); `adapt` turns the built model into one taking our input."""

    project: str
    module: str
    cls: str
    kwargs: dict = field(default_factory=dict)
    fixture: Optional[Path] = None
    adapt: Optional[Callable[[nn.Module], nn.Module]] = None
    adapted: str = ""

    def constructor_kwargs(self) -> dict:
        if self.fixture is None:
            return dict(self.kwargs)
        with open(self.fixture) as f:
            return json.load(f)["reference_kwargs"]

    def describe(self, root: Path) -> str:
        if self.fixture is None:
            args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        else:
            args = f"**reference_kwargs of {self.fixture.relative_to(ROOT)}"
        return f"{self.module}.{self.cls}({args}) from {root}" + (f", {self.adapted}" if self.adapted else "")


def _3dspeaker(module, cls, **kwargs) -> Reference:
    return Reference("3D-Speaker", module, cls, kwargs)


def redimnet2_reference(size) -> Reference:
    """The official `ReDimNet2Wrap` of one fixture (`tests/data/redimnet2/<size>.json`), taking our (B, T, 72)."""
    return Reference(
        "ReDimNet2",
        "redimnet2.redimnet2",
        "ReDimNet2Wrap",
        fixture=REDIMNET2_FIXTURES / f"{size}.json",
        adapt=_redimnet2_body,
        adapted="front-end `spec` replaced by a (B, T, 72) -> (B, 72, T) transpose",
    )


# Where each reference implementation keeps each architecture.
REFERENCE = {
    # memory_efficient=False: 3D-Speaker's default (True) recomputes the dense layers in backward;
    # ours does not, so the default would time extra work on the reference side.
    "campplus": _3dspeaker(
        "speakerlab.models.campplus.DTDNN", "CAMPPlus", feat_dim=80, embedding_size=512, memory_efficient=False
    ),
    "eres2net_base": _3dspeaker(
        "speakerlab.models.eres2net.ERes2Net", "ERes2Net", feat_dim=80, embedding_size=192, m_channels=32
    ),
    "eres2net_large": _3dspeaker(
        "speakerlab.models.eres2net.ERes2Net", "ERes2Net", feat_dim=80, embedding_size=192, m_channels=64
    ),
    "eres2netv2": _3dspeaker("speakerlab.models.eres2net.ERes2NetV2", "ERes2NetV2", feat_dim=80, embedding_size=192),
    "ecapa_tdnn_c1024": _3dspeaker(
        "speakerlab.models.ecapa_tdnn.ECAPA_TDNN",
        "ECAPA_TDNN",
        input_size=80,
        lin_neurons=192,
        channels=[1024, 1024, 1024, 1024, 3072],
    ),
    "resnet34": _3dspeaker("speakerlab.models.resnet.ResNet", "ResNet", feat_dim=80, embedding_size=192, m_channels=32),
    **{f"redimnet2_b{i}": redimnet2_reference(f"b{i}") for i in range(7)},
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
    """The reference checkout cannot be used (not recognised, or a module of it does not import or build)."""


class _ReferenceFinder(importlib.abc.MetaPathFinder):
    """Resolves `package` and `package.*` under the reference root only, ahead of every other finder.

    3D-Speaker's package has our top-level name; with this project installed editable, setuptools'
    finder in sys.meta_path maps `speakerlab` to our tree whatever sys.path says, so putting the root on
    sys.path alone imports our package again (and its missing reference modules used to show as "-").
    For `redimnet2` it keeps an installed copy from being taken for the checkout. A module of the package that
    is not under the root is not found at all, rather than looked up by the finders after this one."""

    def __init__(self, root: Path, package: str):
        self.root = str(root)
        self.package = package

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path if path is not None else [self.root])
        if spec is None:  # final: no other finder (our editable install's) may supply it
            raise ModuleNotFoundError(f"No module named {fullname!r} under {self.root}", name=fullname)
        return spec


def _torchaudio_stand_in() -> types.ModuleType:
    """An empty `torchaudio` for importing a reference that imports it at module level but, as built here,
    never uses it; any use raises AttributeError saying so."""
    module = types.ModuleType("torchaudio", "bench/models.py's stand-in: torchaudio is not installed")

    def __getattr__(attr):
        raise AttributeError(f"torchaudio is not installed; bench/models.py's stand-in for it has no {attr!r}")

    module.__getattr__ = __getattr__
    return module


def detect_project(root: Path) -> Project:
    """The project whose layout `root` has; ReferenceError_ naming the directory when none (or several) fit."""
    found = [
        p
        for p in PROJECTS.values()
        if ((root / p.marker).is_dir() if p.marker.endswith("/") else (root / p.marker).is_file())
    ]
    if len(found) != 1:
        layouts = "; ".join(f"{p.name}: {p.marker}" for p in PROJECTS.values())
        what = "none" if not found else "several (" + ", ".join(p.name for p in found) + ")"
        raise ReferenceError_(f"--reference-root {root}: {what} of the known layouts there ({layouts})")
    return found[0]


def check_reference_roots(roots) -> dict:
    """`{project name: resolved root}` for the `--reference-root` directories; ReferenceError_ for a directory
    of no known layout or two of the same project."""
    out = {}
    for root in roots:
        root = Path(root).resolve()
        project = detect_project(root)
        if project.name in out:
            raise ReferenceError_(f"--reference-root {out[project.name]} and {root} are both {project.name} checkouts")
        out[project.name] = root
    return out


@contextlib.contextmanager
def _isolated(project: Project, root: Path):
    """Imports of `project.package` resolve under `root` only while inside; our modules of that name are set
    aside before and put back after, and the reference's are dropped."""

    def ours_or_theirs(k):
        return k == project.package or k.startswith(project.package + ".")

    ours = {k: sys.modules.pop(k) for k in list(sys.modules) if ours_or_theirs(k)}
    finder = _ReferenceFinder(root, project.package)
    sys.meta_path.insert(0, finder)
    stand_in = None
    if (
        project.torchaudio_stand_in
        and "torchaudio" not in sys.modules
        and importlib.util.find_spec("torchaudio") is None
    ):
        stand_in = sys.modules["torchaudio"] = _torchaudio_stand_in()
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        if stand_in is not None and sys.modules.get("torchaudio") is stand_in:
            del sys.modules["torchaudio"]
        for k in [k for k in sys.modules if ours_or_theirs(k)]:
            del sys.modules[k]
        sys.modules.update(ours)


def reference_model(name, roots: dict):
    """`(model, note)`: the reference implementation of `name` built as REFERENCE says, or `(None, why not)` when
    REFERENCE lists no counterpart or no root of its project was given. Every module the reference is built
    from must come from under its root; anything else raises ReferenceError_ saying why."""
    ref = REFERENCE.get(name)
    if ref is None:
        return None, "n/a, bench/models.py's REFERENCE lists no counterpart"
    return build_reference(ref, roots)


def build_reference(ref: Reference, roots: dict):
    """`(model, note)` for one Reference, as `reference_model` describes."""
    project = PROJECTS[ref.project]
    root = roots.get(project.name)
    if root is None:
        return None, f"n/a, no --reference-root of a {project.name} checkout ({project.marker}) given"
    what = ref.describe(root)
    with _isolated(project, root):
        try:
            kwargs = ref.constructor_kwargs()
            module = importlib.import_module(ref.module)
            where = Path(getattr(module, "__file__", "") or "").resolve()
            if root not in where.parents:
                raise ReferenceError_(f"{ref.module} was loaded from {where}, not from under {root}")
            with contextlib.redirect_stdout(io.StringIO()):  # ReDimNet2's constructor prints
                model = getattr(module, ref.cls)(**kwargs)
            if ref.adapt is not None:
                model = ref.adapt(model)
        except ReferenceError_:
            raise
        except Exception as e:  # an import or constructor failure: say which and why
            raise ReferenceError_(f"{what}: {type(e).__name__}: {e}") from e
    return model, what


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
    ap.add_argument(
        "--reference-root",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a 3D-Speaker or ReDimNet2 (PalabraAI/redimnet2) checkout to time against; repeatable",
    )
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.models) - set(list_models()))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; registered: {', '.join(list_models())}")
    try:
        roots = check_reference_roots(args.reference_root)
    except ReferenceError_ as e:
        ap.error(str(e))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gpu = torch.cuda.is_available() and not args.no_gpu
    print(f"# command: python {' '.join(map(shlex.quote, sys.argv if argv is None else ['bench/models.py', *argv]))}")
    print(
        f"# cpu: {platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"
        + (f"; gpu: {torch.cuda.get_device_name()}" if gpu else "")
    )
    for project, root in roots.items():
        print(f"# reference {project}: {root}")
    head = f"{'model':<20}{'params':>12}{'GMACs(3s)':>11}{'cpu fwd+bwd s':>15}"
    head += f"{'reference s':>13}{'ours/ref':>10}" if roots else ""
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
        if roots:
            try:
                ref, note = reference_model(name, roots)
                if ref is None:
                    ref_cell = "n/a"
                else:  # the same workload? its size and MACs next to ours, and one pass to see it runs
                    ref_params = sum(p.numel() for p in ref.parameters())
                    ref_gmacs = macs(ref, feat_dim=feat_dim) / 1e9
                    note += f"; params {ref_params:,} (ours {params:,}), GMACs(3s) {ref_gmacs:.2f} (ours {gmacs:.2f})"
                    fwd_bwd(ref, x)
                notes.append(f"# reference {name}: {note}")
            except Exception as e:  # ReferenceError_ from the import or build, anything from running it
                ref, ref_cell, failed = None, "failed", True
                reason = str(e) if isinstance(e, ReferenceError_) else f"running it: {type(e).__name__}: {e}"
                notes.append(f"# reference {name}: failed: {reason}")
        fwd_bwd(model, x)
        ours, theirs = [], []
        # Interleaved, so drifting machine load hits both alike, and in alternating order (ours first on
        # even repeats, the reference first on odd ones), so neither always runs right after the other.
        for i in range(args.repeats):
            if ref is not None and i % 2:
                theirs.append(fwd_bwd(ref, x))
            ours.append(fwd_bwd(model, x))
            if ref is not None and not i % 2:
                theirs.append(fwd_bwd(ref, x))
        row = f"{name:<20}{params:>12,}{gmacs:>11.2f}{statistics.median(ours):>15.3f}"
        if roots:
            if theirs:
                row += f"{statistics.median(theirs):>13.3f}{statistics.median(ours) / statistics.median(theirs):>10.2f}"
            else:
                row += f"{ref_cell:>13}{'-':>10}"
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
