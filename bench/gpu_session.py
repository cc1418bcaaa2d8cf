"""The Python steps of bench/gpu_session.sh.

    python bench/gpu_session.py env                                   # the machine, for the log
    python bench/gpu_session.py measure OUT_DIR --deadline T [--dry-run]   # steps 3-6 in one process
    python bench/gpu_session.py data DIR --utts 512 --seconds 4       # a synthetic Kaldi data dir
    python bench/gpu_session.py extract OUT.json --data DIR --models campplus eres2net_base
    python bench/gpu_session.py rows OUT_DIR                          # RESULTS.md rows of the JSON files

`measure` runs, each logged and timed, a step that fails not stopping the others: a synthetic data dir,
the auto per-card batch of each model, bench/train_step.py's rows (fp32, tf32, bf16 eager; bf16 eager through the
data loader), extraction throughput, then the bf16 compiled rows (their compiles are the longest steps: the time
budget cuts them first). One process: torch is imported once (seconds each time on a loaded small machine).
gpu_session.sh then writes the RESULTS.md rows (`rows`), also when its hard limit stopped `measure`.

`extract` times `python -m speakerlab.inference.extract` (sharded streaming, loader workers, the default batching of
the device) on an untrained checkpoint of each model: what matters here is the speed, not the embeddings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def env() -> int:
    """GPU, driver, torch, free memory, Python and the packages that the GPU image may lack."""
    print(
        f"python {platform.python_version()} ({sys.executable}), torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    if shutil.which("nvidia-smi"):
        query = "name,driver_version,memory.total,memory.used,clocks.max.sm,power.limit"
        r = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr.strip())
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            free, total = torch.cuda.mem_get_info(i)
            print(
                f"cuda:{i} {p.name}: {p.multi_processor_count} SMs, capability {p.major}.{p.minor}, "
                f"free {free / 2**30:.1f} of {total / 2**30:.1f} GiB, bf16 {torch.cuda.is_bf16_supported()}"
            )
    else:
        print(f"no CUDA device: CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    from importlib import metadata

    for name in ("soundfile", "kaldiio", "webdataset", "triton", "onnxruntime", "scipy", "tensorboard", "pytest"):
        try:
            print(f"  {name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            print(f"  {name} missing")
    return 0


def data(out: Path, utts: int, seconds: float, speakers: int = 16) -> int:
    """`utts` wavs of `seconds` (voiced-like harmonics + noise, a pitch per speaker), wav.scp and utt2spk."""
    from speakerlab.dataio.audio import sf

    rng = np.random.default_rng(0)
    sr, t = 16000, np.arange(int(seconds * 16000)) / 16000
    (out / "wav").mkdir(parents=True, exist_ok=True)
    scp, u2s = [], []
    for i in range(utts):
        spk = f"spk{i % speakers:03d}"
        f0 = 90 + 10 * (i % speakers) + 20 * np.sin(2 * np.pi * 0.5 * t + i)
        phase = 2 * np.pi * np.cumsum(f0) / sr
        x = 0.1 * sum(np.sin(k * phase) / k for k in range(1, 6)) + 0.01 * rng.standard_normal(t.size)
        path = out / "wav" / f"{spk}-u{i:05d}.wav"
        sf.write(path, x, sr, subtype="PCM_16")
        scp.append(f"{spk}-u{i:05d} {path}\n")
        u2s.append(f"{spk}-u{i:05d} {spk}\n")
    (out / "wav.scp").write_text("".join(scp))
    (out / "utt2spk").write_text("".join(u2s))
    print(f"data: {utts} utterances of {seconds:g} s, {speakers} speakers -> {out}")
    return 0


def listed_again(data_dir: Path, out: Path, copies: int) -> int:
    """A data dir that lists each utterance of `data_dir` `copies` times (ids suffixed, the same wav files): an epoch
    longer than the loader rows' timed steps. Their DataLoader's workers start again at every epoch, so 3-step
    epochs of the 768 utterances timed the workers' start (the H100's first loader rows, bench/RESULTS.md)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("wav.scp", "utt2spk"):
        rows = [line.split(maxsplit=1) for line in (data_dir / name).read_text().splitlines()]
        (out / name).write_text("".join(f"{utt}-c{c} {rest}\n" for c in range(copies) for utt, rest in rows))
    print(f"data: {data_dir} listed {copies} times -> {out}")
    return 0


def extract(out: Path, data_dir: Path, models, model_args: str, batch_size: int, workers: int) -> int:
    """Extraction throughput per model: utterances/s and seconds of audio per second (wall clock)."""
    from speakerlab.checkpoint import Checkpoint, save_checkpoint
    from speakerlab.dataio.audio import audio_info
    from speakerlab.dataio.tables.lists import read_wav_scp
    from speakerlab.frontends import FeatureSpec
    from speakerlab.inference.extract import main as extract_main
    from speakerlab.models import build_model

    table = read_wav_scp(str(data_dir / "wav.scp"))
    audio_s = sum(audio_info(path) / 16000 for _, path in table.values())
    rows = []
    work = out.parent / "extract_work"
    for name in models:
        args = json.loads(model_args).get(name, {})
        ckpt = work / f"{name}.pt"
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        model = build_model(name, **args).state_dict()
        save_checkpoint(ckpt, Checkpoint(model_name=name, model_args=args, model=model, features=FeatureSpec()))
        emb = work / f"{name}.npz"
        for p in (emb, emb.with_suffix(".parts")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        argv = ["--checkpoint", str(ckpt), "--data", str(data_dir), "--out", str(emb), "--feats", "no"]
        argv += ["--batch-size", str(batch_size), "--num-workers", str(workers)]
        t0 = time.perf_counter()
        rc = extract_main(argv)
        dt = time.perf_counter() - t0
        row = {"model": name, "rc": rc, "utterances": len(table), "audio_s": round(audio_s, 1), "seconds": round(dt, 2)}
        row.update(utt_per_s=round(len(table) / dt, 1), realtime_x=round(audio_s / dt, 1), batch_size=batch_size)
        row.update(device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
        row.update(torch=torch.__version__, command="python -m speakerlab.inference.extract " + " ".join(argv))
        print(
            f"extraction {name}: {len(table)} utterances ({audio_s:.0f} s of audio) in {dt:.1f} s: "
            f"{row['utt_per_s']} utt/s, {row['realtime_x']}x real time (exit {rc})",
            flush=True,
        )
        rows.append(row)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


def rows(out_dir: Path) -> int:
    """bench/RESULTS.md rows of every train_step JSON under `out_dir` -> `out_dir/rows.md` (and stdout)."""
    from bench.train_step import print_row

    lines = []
    for path in sorted(out_dir.glob("train_*.json")):
        for row in json.loads(path.read_text()):
            if row.get("status") == "ok":
                lines.append(row)
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        for row in lines:
            print_row(row, markdown=True)
    (out_dir / "rows.md").write_text(buffer.getvalue())
    print(buffer.getvalue(), end="")
    print(f"{len(lines)} rows -> {out_dir / 'rows.md'}")
    return 0


MODELS = ["campplus", "eres2net_base"]
# --dry-run: tiny models, batches and crops; torch.compile through dynamo alone (inductor's C++ build takes
# minutes on a small CPU): every step and code path of the real session, in seconds.
TINY = {
    "campplus": {"embedding_size": 16, "growth_rate": 8, "init_channels": 16, "m_channels": 4, "fcm_blocks": [1, 1]},
    "eres2net_base": {"embedding_size": 16, "m_channels": 8, "num_blocks": [1, 1, 1, 1]},
}
TINY["campplus"]["num_layers"] = [1, 1, 1]


def measure(out: Path, deadline: float, dry: bool) -> int:
    from bench import train_step

    if dry:
        tiny = json.dumps(TINY)
        sizes = ["--model-args", tiny, "--batches", "4", "--crop", "0.5", "--steps", "1", "--warmup", "1"]
        sizes += ["--workers", "0", "--compile-backend", "eager"]
        probe = ["--model-args", tiny, "--crop", "0.5", "--probe-max", "8", "--probe-min", "4"]
        data_opts, extract_opts = (16, 1.0), dict(model_args=tiny, batch_size=4, workers=0)
        copies = 2
        precisions = ["fp32", "bf16"]  # tf32 is fp32 on a CPU
    else:
        sizes = ["--batches", "256", "--crop", "3", "--steps", "20", "--warmup", "5", "--workers", "8"]
        probe = ["--crop", "3", "--probe-max", "1024"]
        data_opts, extract_opts = (768, 4.0), dict(model_args="{}", batch_size=64, workers=8)
        copies = 9  # 6,912 listed: the 25 steps of 256 in one epoch
        precisions = ["fp32", "tf32", "bf16"]
    bench = ["--models", *MODELS, "--deadline", str(deadline), "--markdown"]
    steps = [
        ("data", lambda: data(out / "data", *data_opts) or listed_again(out / "data", out / "data_epoch", copies)),
        (
            "train_probe",
            lambda: train_step.main(
                [*bench, "--probe", "--precisions", "bf16", *probe, "--json", str(out / "train_probe.json")]
            ),
        ),
        (
            "train_eager",
            lambda: train_step.main(
                [
                    *bench,
                    "--precisions",
                    *precisions,
                    "--compile",
                    "eager",
                    *sizes,
                    "--json",
                    str(out / "train_eager.json"),
                ]
            ),
        ),
        (
            "train_loader",
            lambda: train_step.main(
                [
                    *bench,
                    "--precisions",
                    "bf16",
                    "--compile",
                    "eager",
                    "--no-synthetic",
                    "--data",
                    str(out / "data_epoch"),
                    *sizes,
                    "--json",
                    str(out / "train_loader.json"),
                ]
            ),
        ),
        ("extract", lambda: extract(out / "extract.json", out / "data", MODELS, **extract_opts)),
        (
            "train_compiled",
            lambda: train_step.main(
                [
                    *bench,
                    "--precisions",
                    "bf16",
                    "--compile",
                    "default",
                    *sizes,
                    "--json",
                    str(out / "train_compiled.json"),
                ]
            ),
        ),
    ]
    status = 0
    for name, run in steps:
        if time.time() > deadline:
            print(f"== {name}: skipped, past the time budget", flush=True)
            continue
        t0 = time.time()
        print(f"== {name}", flush=True)
        try:
            rc = run()
        except Exception:  # noqa: BLE001 - one failed step must not stop the session
            import traceback

            traceback.print_exc()
            rc = 1
        print(f"== {name}: exit {rc} in {time.time() - t0:.0f}s", flush=True)
        status = status or rc
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("env")
    p = sub.add_parser("measure")
    p.add_argument("out", type=Path)
    p.add_argument("--deadline", type=float, required=True, help="unix time: later steps are skipped")
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("data")
    p.add_argument("out", type=Path)
    p.add_argument("--utts", type=int, default=512)
    p.add_argument("--seconds", type=float, default=4.0)
    p = sub.add_parser("extract")
    p.add_argument("out", type=Path)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--models", nargs="+", default=["campplus", "eres2net_base"])
    p.add_argument("--model-args", default="{}")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=4)
    p = sub.add_parser("rows")
    p.add_argument("out_dir", type=Path)
    a = ap.parse_args(argv)
    if a.step == "env":
        return env()
    if a.step == "measure":
        return measure(a.out, a.deadline, a.dry_run)
    if a.step == "data":
        return data(a.out, a.utts, a.seconds)
    if a.step == "extract":
        return extract(a.out, a.data, a.models, a.model_args, a.batch_size, a.workers)
    return rows(a.out_dir)


if __name__ == "__main__":
    sys.exit(main())
