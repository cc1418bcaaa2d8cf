"""Seconds of `speakerlab-export --format onnx` (torch.export, then the file's own check against PyTorch) for
registered models at their full size, random weights (the export does not depend on them), one process each.

    OMP_NUM_THREADS=1 python bench/export_time.py [--models eres2net_base eres2netv2] [--tree DIR]

--tree runs the command on another checkout's code (its directory first on PYTHONPATH), so that a change is timed
against its parent in one sitting: `git worktree add /tmp/before HEAD~1`, then this script with and without
`--tree /tmp/before`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scoring import machine  # noqa: E402


def save_checkpoint_of(name: str, path: Path) -> None:
    """A checkpoint of `name` at its registry defaults, 80-bin fbank, random weights."""
    import torch

    from speakerlab.checkpoint import Checkpoint, save_checkpoint
    from speakerlab.frontends import FbankConfig, FeatureSpec
    from speakerlab.models import build_model

    torch.manual_seed(0)
    state = build_model(name, feat_dim=80).state_dict()
    save_checkpoint(path, Checkpoint(model_name=name, model_args={}, model=state, features=FeatureSpec(FbankConfig())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["eres2net_base", "eres2netv2"])
    ap.add_argument("--tree", help="a checkout whose speakerlab the command runs (default: the installed one)")
    args = ap.parse_args(argv)
    print(f"# {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"# {machine()}, {time.ctime()}")
    print(f"# OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, code {args.tree or 'installed'}")
    command = shutil.which("speakerlab-export", path=os.path.dirname(sys.executable)) or "speakerlab-export"
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(args.tree).resolve()), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            ckpt, out = Path(tmp) / f"{name}.pt", Path(tmp) / f"{name}.onnx"
            save_checkpoint_of(name, ckpt)
            began = time.perf_counter()
            r = subprocess.run(
                [command, "--checkpoint", str(ckpt), "--format", "onnx", "--out", str(out)],
                env=env,
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - began
            if r.returncode != 0:
                print(r.stdout[-2000:], r.stderr[-4000:], file=sys.stderr)
                return r.returncode
            check = [line for line in r.stderr.splitlines() if "max |diff|" in line]
            print(f"{name}: {seconds:.1f} s, {out.stat().st_size / 1e6:.1f} MB; {check[-1] if check else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
