"""Training-step throughput: samples/s per model x precision x per-device batch.

    python bench/train_step.py --models campplus eres2net_base --precisions bf16 fp32 --batches 32 64
    python bench/train_step.py --data egs/mini/data/train --models campplus   # data pipeline included

Each row times full optimizer steps (fbank -> model -> AAM loss -> backward -> SGD) after warm-up:
"synthetic" feeds random waves already on the device (the data pipeline excluded); "loader" feeds
the real DataLoader of `--data` (audio reading and crops included). Prints the command and the
machine so figures can be quoted with them.

Precisions: `bf16`, `fp16` (autocast, GradScaler), `tf32` (fp32 with TF32 matmul/convolution on
Ampere and newer), `fp32` (TF32 off). MFU (model FLOP utilisation) = measured FLOP/s over the card's
dense peak for that precision; the FLOPs of one step are counted once with torch's FlopCounterMode
(matmul and convolution, forward and backward). `--markdown` prints rows in bench/RESULTS.md's
layout (`model | precision | pipeline | per-card batch | samples/s | MFU % | GPU | torch | date | command`).
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speakerlab.config import load_config  # noqa: E402
from speakerlab.engine.batch_plan import BatchPlan  # noqa: E402
from speakerlab.engine.distributed import DistInfo  # noqa: E402
from speakerlab.engine.precision import resolve_precision  # noqa: E402
from speakerlab.engine.setup import (  # noqa: E402,E501
    build_frontend,
    build_net,
    build_optimizer,
    load_train_data,
    make_features,
    make_loader,
)

# Dense peak TFLOP/s per card and precision (vendor data sheets, SXM parts; no sparsity).
PEAK_TFLOPS = {
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "V100": {"fp16": 125.0, "fp32": 15.7, "tf32": 15.7},
}


def peak_tflops(gpu_name: str, precision: str):
    for key, peaks in PEAK_TFLOPS.items():
        if key in gpu_name:
            return peaks.get(precision)
    return None


def step_flops(net, feats, labels) -> float:
    """FLOPs of one forward + backward of `net` on this batch (matmul and convolution)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = net(feats, labels)
        loss.backward()
    net.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def bench_one(name, precision, batch, args, device):
    raw = {
        "model": {"name": name},
        "data": {"train": args.data or "unused", "crop_seconds": args.crop},
        "hardware": {
            "device": device.type,
            "precision": "fp32" if precision == "tf32" else precision,
            "num_workers": args.workers,
        },
    }
    cfg = load_config(raw=raw)
    prec = resolve_precision(cfg.hardware.precision, device, tf32=precision != "fp32")
    num_speakers = 1000
    data = None
    if args.data:
        data = load_train_data(cfg, lambda m: None)
        num_speakers = len(data.speakers)
    net = build_net(cfg, num_speakers, prec.autocast).to(device).train()
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    opt = build_optimizer(cfg, net)
    scaler = prec.grad_scaler()
    features = make_features(cfg, device)
    crop = int(args.crop * 16000)
    frontend = build_frontend(cfg, features, num_speakers) if data is not None else None

    def batches():
        if data is None:
            while True:
                waves = torch.randn(batch, crop, device=device) * 0.1
                yield features(waves), torch.randint(0, num_speakers, (batch,), device=device)
        plan = BatchPlan(batch * (len(data.utts) // batch), 1, batch, len(data.utts) // batch)
        loader, sampler = make_loader(cfg, data, data.spk2idx, plan, DistInfo(), device.type == "cuda")
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for b in loader:
                yield frontend(b)
            epoch += 1

    it = batches()
    feats0, labels0 = next(it)
    flops = step_flops(net, feats0, labels0)

    def step():
        feats, labels = next(it)
        loss, _ = net(feats, labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    dt = time.perf_counter() - t0
    return batch * args.steps / dt, dt / args.steps, flops * args.steps / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["campplus"])
    ap.add_argument("--precisions", nargs="+", default=None, help="default: bf16 fp32 on GPU, fp32 on CPU")
    ap.add_argument("--batches", nargs="+", type=int, default=None, help="default: 64 128 on GPU, 16 on CPU")
    ap.add_argument("--data", help="Kaldi data dir: also time with the real data loader")
    ap.add_argument("--crop", type=float, default=2.0, help="crop seconds")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="rows for bench/RESULTS.md")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precisions = args.precisions or (["bf16", "tf32", "fp32"] if device.type == "cuda" else ["fp32"])
    batches = args.batches or ([64, 128] if device.type == "cuda" else [16])
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"# command: python {' '.join(map(shlex.quote, sys.argv))}")
    print(
        f"# device: {device.type} ({gpu}), torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"crop {args.crop}s, {args.steps} timed steps after {args.warmup} warm-up"
    )
    print(f"{'model':<18}{'precision':<10}{'batch':>6}  {'pipeline':<10}{'samples/s':>10}{'s/step':>9}{'MFU %':>8}")
    command = "python " + " ".join(map(shlex.quote, sys.argv))
    for name in args.models:
        for precision in precisions:
            for batch in batches:
                pipes = ["synthetic"] + (["loader"] if args.data else [])
                for pipe in pipes:
                    saved, args_data = args.data, (args.data if pipe == "loader" else None)
                    args.data = args_data
                    try:
                        sps, sec, flop_s = bench_one(name, precision, batch, args, device)
                        peak = peak_tflops(gpu, precision) if device.type == "cuda" else None
                        mfu = f"{100 * flop_s / (peak * 1e12):.1f}" if peak else "-"
                        if args.markdown:
                            print(
                                f"| {name} | {precision} | {pipe} | {batch} | {sps:.0f} | {mfu} | {gpu} | "
                                f"{torch.__version__} | {time.strftime('%Y-%m-%d')} | `{command}` |",
                                flush=True,
                            )
                        else:
                            print(
                                f"{name:<18}{precision:<10}{batch:>6}  {pipe:<10}{sps:>10.1f}{sec:>9.3f}{mfu:>8}",
                                flush=True,
                            )
                    except torch.OutOfMemoryError:
                        print(f"{name:<18}{precision:<10}{batch:>6}  {pipe:<10}{'OOM':>10}", flush=True)
                    finally:
                        args.data = saved
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
