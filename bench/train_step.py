"""Training-step throughput: samples/s and MFU per model x precision x compile x per-card batch x pipeline.

    python bench/train_step.py --models campplus eres2net_base --precisions bf16 tf32 fp32 --batches 256
    python bench/train_step.py --compile eager default --data DIR      # also the real data loader of DIR
    python bench/train_step.py --probe --models campplus eres2net_base  # the auto per-card batch of each

Each row times full optimizer steps (features -> model -> AAM loss -> backward -> SGD) after warm-up
(compilation happens there): "synthetic" feeds random waves already on the device through the fbank (the
loader excluded); "loader" feeds the real DataLoader of `--data` through the training input pipeline (audio
reading, crops, fbank). Crops are 3 s, the recipes' length. Prints the command and the machine.

Precisions: `bf16`, `fp16` (autocast, GradScaler), `tf32` (fp32 with TF32 matmul/convolution),
`fp32` (TF32 off). The features are exact fp32 in every case (speakerlab.devices.exact_fp32).
MFU = achieved model FLOP/s over the card's dense peak for the precision used (PEAK_TFLOPS): model
FLOPs per sample are the embedding model's forward MACs at the crop length (bench/models.py's counter)
x 2 (FLOPs) x 3 (forward + backward); the classifier and the features are not counted.
`--markdown` prints bench/RESULTS.md rows; `--json FILE` writes every row with its figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import macs  # noqa: E402
from speakerlab.config import load_config  # noqa: E402
from speakerlab.models import model_features  # noqa: E402
from speakerlab.train import build as setup  # noqa: E402
from speakerlab.train.hardware.batch_plan import BatchPlan, CudaMemory, MemoryProbe, find_max_batch, probe_sizes  # noqa: E402
from speakerlab.train.hardware.precision import resolve_precision  # noqa: E402
from speakerlab.train.hardware.speedups import CompileFailed, apply_switches, resolve_switches  # noqa: E402
from speakerlab.train.inputs.loader import load_train_lists, make_loader  # noqa: E402
from speakerlab.train.launch.distributed import DistInfo  # noqa: E402

# Dense (no sparsity) peak TFLOP/s per GPU, by precision: bf16/fp16 and tf32 on tensor cores, fp32 on the
# CUDA cores. Matched in this order against torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3" is the
# SXM part). Sources: NVIDIA H100 Tensor Core GPU datasheet (SXM, PCIe and NVL columns; the sheet's
# tensor figures are with sparsity, halved here), H100 PCIe product brief PB-11133-001 (FP32 51, TF32
# 378, BF16 756), the H200 datasheet (SXM: the H100 SXM figures; NVL: the H100 NVL ones), the A100
# datasheet (FP32 19.5, TF32 156, BF16 312); the SXM figures agree with glennklockwood.com/garden/processors/h100
# (FP32 66.9, TF32 494.7, BF16 989.4).
PEAK_TFLOPS = (
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)


def peak_tflops(gpu_name: str, precision: str):
    """The dense peak of `precision` on the card named `gpu_name`, or None when the card is not listed."""
    for key, peaks in PEAK_TFLOPS:
        if key in gpu_name:
            return peaks.get(precision)
    return None


def bench_config(name, precision, args, device, data=None):
    hardware = {
        "device": device.type,
        "num_workers": args.workers,
        "precision": "fp32" if precision == "tf32" else precision,
    }
    raw = {
        "model": {"name": name, "args": json.loads(args.model_args).get(name, {})},
        "data": {"train": data or "unused", "crop_seconds": args.crop},
        "hardware": hardware,
    }
    features = model_features(name)  # e.g. ReDimNet2's 72-bin log-mel, as conf/*/redimnet2_*.yaml train them
    if features:
        raw["features"] = features
    return load_config(raw=raw)


def build(name, precision, args, device, num_speakers=1000, data=None):
    """(cfg, net, precision) of one row: TF32 as the row says (fp32: off), the model in train mode."""
    cfg = bench_config(name, precision, args, device, data)
    prec = resolve_precision(cfg.hardware.precision, device, tf32=precision != "fp32")
    return cfg, setup.build_net(cfg, num_speakers, prec.autocast).to(device).train(), prec


def bench_one(name, precision, compile_mode, batch, pipeline, args, device):
    """(samples/s, s/step, timing) of `steps` timed optimizer steps after `warmup` ones; timing: the row's seconds
    and its warm-up's (cuDNN's autotuning, compiles), also printed: where a session's minutes go (an H200's eager
    rows took 257 s for 40 s of steps)."""
    began = time.perf_counter()
    data = None
    if pipeline == "loader":
        data = load_train_lists(bench_config(name, precision, args, device, args.data), lambda m: None)
    num_speakers = len(data.speakers) if data is not None else 1000
    cfg, net, prec = build(name, precision, args, device, num_speakers, args.data if data is not None else None)
    compile_setting = False if compile_mode == "eager" else (True if compile_mode == "default" else compile_mode)
    switches = resolve_switches(compile_setting, args.channels_last, "auto", net.model, device)
    apply_switches(switches, net, lambda m: print(f"# {m}", flush=True), backend=args.compile_backend)
    opt = setup.build_optimizer(cfg, net)
    scaler = prec.grad_scaler()
    features = setup.make_features(cfg, device)
    crop = int(args.crop * cfg.data.sample_rate)

    def batches():
        if data is None:
            while True:
                waves = torch.randn(batch, crop, device=device) * 0.1
                yield features(waves), torch.randint(0, num_speakers, (batch,), device=device)
        pipeline = setup.build_inputs(cfg, features, num_speakers)
        steps = len(data) // batch
        plan = BatchPlan(batch * steps, 1, batch, steps)
        loader, sampler = make_loader(cfg, data, plan, DistInfo(), device.type == "cuda")
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for b in loader:
                yield pipeline(b)
            epoch += 1

    it = batches()
    net.classifier.set_margin(0.2)

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

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    dt = time.perf_counter() - t0
    total = time.perf_counter() - began
    print(
        f"# {name} {precision} {compile_mode}: {total:.1f} s, of which set-up {total - warm - dt:.1f} s, "
        f"{args.warmup} warm-up steps {warm:.1f} s, {args.steps} timed steps {dt:.1f} s",
        flush=True,
    )
    return batch * args.steps / dt, dt / args.steps, dict(row_s=round(total, 1), warmup_s=round(warm, 1))


def probe_one(name, precision, args, device) -> dict:
    """The per-card batch `auto` picks for this model and precision (up to --probe-max), with its tries."""
    cfg, net, _ = build(name, precision, args, device)
    shape = tuple(setup.example_input(cfg, args.crop).shape[1:])  # one crop's model input
    memory = CudaMemory(device) if device.type == "cuda" else FixedMemory()
    probe = MemoryProbe(net, shape, 1000, device, cfg.hardware.memory_margin, memory)
    chosen = find_max_batch(probe, probe_sizes(args.probe_max, args.probe_max, lower=args.probe_min))
    return {"model": name, "precision": precision, "chosen": chosen, "tries": probe.describe()}


class FixedMemory:
    """A CPU stand-in for CudaMemory (dry runs): every size fits."""

    def usable(self):
        return 1 << 50

    def start(self):
        pass

    def peak(self):
        return 0


def machine(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["campplus"])
    ap.add_argument("--model-args", default="{}", help="JSON {model: {arg: value}} (tiny models for dry runs)")
    ap.add_argument("--precisions", nargs="+", default=None, help="default: bf16 tf32 fp32 on GPU, fp32 on CPU")
    ap.add_argument("--compile", nargs="+", default=["eager"], help="eager, default or a torch.compile mode")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend (eager: dynamo only)")
    ap.add_argument("--channels-last", default="auto", choices=["auto", "true", "false"])
    ap.add_argument("--batches", nargs="+", type=int, default=None, help="default: 256 on GPU, 16 on CPU")
    ap.add_argument("--data", help="Kaldi data dir: also time with the real data loader ('loader' rows)")
    ap.add_argument("--synthetic", action=argparse.BooleanOptionalAction, default=True, help="'synthetic' rows")
    ap.add_argument("--crop", type=float, default=3.0, help="crop seconds")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    ap.add_argument("--markdown", action="store_true", help="rows for bench/RESULTS.md")
    ap.add_argument("--json", help="write the rows (with every figure) to this file")
    ap.add_argument("--deadline", type=float, default=0, help="unix time after which rows are skipped (0: none)")
    ap.add_argument("--probe", action="store_true", help="print the auto per-card batch instead of timing")
    ap.add_argument("--probe-max", type=int, default=1024)
    ap.add_argument("--probe-min", type=int, default=16)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)
    args.channels_last = {"true": True, "false": False}.get(args.channels_last, "auto")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precisions = args.precisions or (["bf16", "tf32", "fp32"] if device.type == "cuda" else ["fp32"])
    batches = args.batches or ([256] if device.type == "cuda" else [16])
    gpu = machine(device)
    command = "python " + shlex.join(["bench/train_step.py", *without_deadline(argv)])
    print(f"# command: {command}")
    print(
        f"# device: {device.type} ({gpu}), torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"crop {args.crop}s, {args.steps} timed steps after {args.warmup} warm-up"
    )
    rows = []
    if args.probe:
        for name in args.models:
            for precision in precisions:
                row = probe_one(name, precision, args, device)
                print(f"probe {name} {precision}: per-card batch {row['chosen']} ({row['tries']})", flush=True)
                rows.append({**row, "gpu": gpu, "torch": torch.__version__, "command": command})
        write_json(args.json, rows)
        return 0
    head = f"{'model':<16}{'precision':<10}{'compile':<9}{'batch':>6}  {'pipeline':<10}"
    print(f"{head}{'samples/s':>10}{'s/step':>9}{'MFU %':>7}")
    pipelines = (["synthetic"] if args.synthetic else []) + (["loader"] if args.data else [])
    for name in args.models:
        began = time.perf_counter()
        cfg, net, _ = build(name, "fp32", args, torch.device("cpu"))
        _, frames, bins = setup.example_input(cfg, args.crop).shape  # (1, frames, bins): the fbank models benched here
        gflops = macs(net.model, frames, bins) * 2 * 3 / 1e9  # per sample, fwd + bwd
        del net
        print(f"# {name}: {gflops:.3g} GFLOP per sample counted on the CPU in {time.perf_counter() - began:.1f} s")
        for precision in precisions:
            for mode in args.compile:
                for batch in batches:
                    for pipe in pipelines:
                        row = {"model": name, "precision": precision, "compile": mode, "batch": batch}
                        row.update(pipeline=pipe, gpu=gpu, torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
                        row.update(command=command, crop_s=args.crop, model_gflops_per_sample=round(gflops, 3))
                        if args.deadline and time.time() > args.deadline:
                            row["status"] = "skipped: past --deadline"
                        else:
                            try:
                                sps, sec, timing = bench_one(name, precision, mode, batch, pipe, args, device)
                                peak = peak_tflops(gpu, precision) if device.type == "cuda" else None
                                mfu = 100 * sps * gflops * 1e9 / (peak * 1e12) if peak else None
                                row.update(status="ok", samples_per_s=round(sps, 1), s_per_step=round(sec, 4))
                                row.update(peak_tflops=peak, mfu_percent=None if mfu is None else round(mfu, 2))
                                row.update(timing)
                            except torch.OutOfMemoryError:
                                row["status"] = "OOM"
                            except CompileFailed as e:  # the first-batch check: a speed of wrong gradients is no row
                                row["status"] = "wrong gradients" if "differ" in str(e) else "compile failed"
                                print(f"# {name} {precision}: {e}", flush=True)
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                        rows.append(row)
                        print_row(row, args.markdown)
                        write_json(args.json, rows)  # after every row: a run stopped at a time limit keeps its rows
    return 0


def without_deadline(argv):
    """The command line to quote: --deadline (a time of that session) and --json (a path) left out."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--deadline", "--json"):
            skip = True
        else:
            out.append(a)
    return out


def print_row(row, markdown: bool) -> None:
    ok = row["status"] == "ok"
    sps = f"{row['samples_per_s']:.0f}" if ok else row["status"]
    mfu = f"{row['mfu_percent']:.1f}" if ok and row.get("mfu_percent") is not None else "-"
    pipeline = f"{row['pipeline']}, {'eager' if row['compile'] == 'eager' else 'compiled ' + row['compile']}"
    if markdown:
        print(
            f"| {row['model']} | {row['precision']} | {pipeline} | {row['batch']} | {sps} | {mfu} | {row['gpu']} | "
            f"{row['torch']} | {row['date']} | `{row['command']}` |",
            flush=True,
        )
    else:
        sec = f"{row['s_per_step']:.3f}" if ok else "-"
        print(
            f"{row['model']:<16}{row['precision']:<10}{row['compile']:<9}{row['batch']:>6}  {row['pipeline']:<10}"
            f"{sps:>10}{sec:>9}{mfu:>7}",
            flush=True,
        )


def write_json(path, rows) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
