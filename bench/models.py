"""Model costs: parameters, forward MACs for 3 s, CPU fwd+bwd time, GPU samples/s.

    python bench/models.py                       # every registered model
    python bench/models.py --models campplus --repeats 7
    python bench/models.py --reference-root /path/to/3D-Speaker   # also time the reference code

CPU: median of `--repeats` forward+backward passes of a (16, 200, 80) batch with 2 threads (after
one warm-up). With `--reference-root` (a checkout of the reference implementation; nothing of it is
part of this project), each model's reference class is built with the same arguments and timed in
the same run, interleaved, so machine noise hits both alike. GPU (when available): training
samples/s at batch 64 x 200 frames in bf16 autocast and in fp32 (TF32 on).
"""
from __future__ import annotations

import argparse
import importlib
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
    "eres2net_base": ("speakerlab.models.eres2net.ERes2Net", "ERes2Net", {"feat_dim": 80, "embedding_size": 192, "m_channels": 32}),
    "eres2net_large": ("speakerlab.models.eres2net.ERes2Net", "ERes2Net", {"feat_dim": 80, "embedding_size": 192, "m_channels": 64}),
    "eres2netv2": ("speakerlab.models.eres2net.ERes2NetV2", "ERes2NetV2", {"feat_dim": 80, "embedding_size": 192}),
    "ecapa_tdnn_c1024": ("speakerlab.models.ecapa_tdnn.ECAPA_TDNN", "ECAPA_TDNN",
                         {"input_size": 80, "lin_neurons": 192, "channels": [1024, 1024, 1024, 1024, 3072]}),
    "resnet34": ("speakerlab.models.resnet.ResNet", "ResNet", {"feat_dim": 80, "embedding_size": 192, "m_channels": 32}),
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


def gpu_samples_per_s(model, precision, batch=64, frames=200, steps=20) -> float:
    dev = torch.device("cuda")
    model = model.to(dev).train()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, frames, 80, device=dev)
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


def reference_model(name, root):
    if name not in REFERENCE:
        return None
    mod, cls, kwargs = REFERENCE[name]
    saved = {k: v for k, v in sys.modules.items() if k == "speakerlab" or k.startswith("speakerlab.")}
    for k in saved:  # the reference package has the same top-level name: import it in isolation
        del sys.modules[k]
    sys.path.insert(0, str(root))
    try:
        return getattr(importlib.import_module(mod), cls)(**kwargs)
    except ImportError:  # this architecture is not in the given reference checkout
        return None
    finally:
        sys.path.remove(str(root))
        for k in [k for k in sys.modules if k == "speakerlab" or k.startswith("speakerlab.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list_models())
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reference-root", type=Path)
    ap.add_argument("--no-gpu", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gpu = torch.cuda.is_available() and not args.no_gpu
    print(f"# command: python {' '.join(map(shlex.quote, sys.argv))}")
    print(f"# cpu: {platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}"
          + (f"; gpu: {torch.cuda.get_device_name()}" if gpu else ""))
    head = f"{'model':<18}{'params':>12}{'GMACs(3s)':>11}{'cpu fwd+bwd s':>15}"
    head += f"{'reference s':>13}" if args.reference_root else ""
    head += f"{'gpu bf16 /s':>13}{'gpu fp32 /s':>13}" if gpu else ""
    print(head)
    x = torch.randn(16, 200, 80)
    for name in args.models:
        model = build_model(name)
        params = sum(p.numel() for p in model.parameters())
        gmacs = macs(model) / 1e9
        ref = reference_model(name, args.reference_root) if args.reference_root else None
        fwd_bwd(model, x)
        if ref is not None:
            fwd_bwd(ref, x)
        ours, theirs = [], []
        for _ in range(args.repeats):  # interleaved: drifting machine load hits both alike
            ours.append(fwd_bwd(model, x))
            if ref is not None:
                theirs.append(fwd_bwd(ref, x))
        row = f"{name:<18}{params:>12,}{gmacs:>11.2f}{statistics.median(ours):>15.3f}"
        if args.reference_root:
            row += f"{statistics.median(theirs):>13.3f}" if theirs else f"{'-':>13}"
        if gpu:
            row += f"{gpu_samples_per_s(build_model(name), 'bf16'):>13.0f}{gpu_samples_per_s(build_model(name), 'fp32'):>13.0f}"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
