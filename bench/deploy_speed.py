"""CPU speed of embedding extraction from audio: eager PyTorch, torch.compile, ONNX fp32 and ONNX int8 (static),
for CAM++, ERes2Net-base, ECAPA-TDNN c1024, ResNet34 and ReDimNet2-B2, and the ratio to 3D-Speaker's own path.

    python bench/deploy_speed.py --work /tmp/deploy_bench --markdown            # the table of modes
    python bench/deploy_speed.py --work /tmp/deploy_bench --peer /tmp/refs/3D-Speaker \\
        --peer-python /tmp/refs/venv3d/bin/python --peer-site bench/peer_site

Modes, each timed on the same waves: `eager`, the torch path (speakerlab.inference.embedder.Embedder: front end
then model); `compile`, the same module under torch.compile (compiled once per shape, before timing); `onnx`,
the waveform file of speakerlab-export --waveform on onnxruntime (speakerlab.inference.deploy.runtime.OnnxEmbedder);
`int8`, the same with the model part quantised statically (calibrated on 16 synthetic utterances), `int8dyn`
dynamically; both with their cosine to the fp32 file on the timed waves (random weights: a proxy; the trained
egs/mini model's EER is the accuracy check). Cells: 3 s and 10 s utterances, batch 1 and batch 8 (equal lengths, as the
runtimes batch). Figures: utterances/s (median call), real-time factor (seconds of compute per second of audio)
and peak RSS of the process that ran that model and mode (each (model, mode) in a fresh process, all its cells;
the peak is that of its largest cell; the ONNX modes' processes never import torch: their files are made
beforehand in a process of their own). Threads: 2 (torch.set_num_threads, onnxruntime intra-op threads).

Weights: CAM++ is 3D-Speaker's `speech_campplus_sv_zh-cn_16k-common` layout (192-dim) filled by the fixtures'
rule (tests/fixture_models.fill_state_dict), saved as the peer's file and read by speakerlab.sources as a
3D-Speaker state dict, so both sides run the same weights; the others are randomly initialised (speed does not
depend on the values).

The peer (`--peer DIR`, a checkout of modelscope/3D-Speaker, with `--peer-python` of its own environment): its
`speakerlab/bin/infer_sv.py --model_id iic/speech_campplus_sv_zh-cn_16k-common --wavs LIST`, unchanged, on
files of 3 s: it reads each file with torchaudio, computes Kaldi fbank with torchaudio, runs the model and
saves an .npy, one file at a time. Its weights come from a local modelscope cache (WORK/mscache); the machine
has no network, so `--peer-site` (bench/peer_site) puts a sitecustomize on the peer's path that asks modelscope
for its local cache only (snapshot_download's own local_files_only) and accepts a model id found there.
Its utterances/s are taken from the times its per-file lines arrive (first to last: no start-up, no model
load); ours two ways, each in a process of its own: per file as the peer works (read, resample check, embed at
batch 1), and as `speakerlab-embed --onnx` runs (its embed_scp call: files batched by equal length; the runtime
loaded before the clock starts, as the peer's model is). Rounds alternate the order and each ratio is of the
medians; the peer's embeddings are
compared with ours (same weights, same files).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ["campplus", "eres2net_base", "ecapa_tdnn_c1024", "resnet34", "redimnet2_b2"]
MODES = ["eager", "compile", "onnx", "int8", "int8dyn"]
CELLS = [(3.0, 1), (3.0, 8), (10.0, 1), (10.0, 8)]
PEER_MODEL_ID = "iic/speech_campplus_sv_zh-cn_16k-common"
PEER_FILE = "campplus_cn_common.bin"
THREADS = 2


def peer_weights(cache: Path) -> Path:
    """The fixture-filled CAM++ (192) state dict at the peer's modelscope cache path (created once)."""
    import torch

    from tests.fixture_models import fill_state_dict, load_fixture

    path = cache / "models" / PEER_MODEL_ID.replace("/", "--") / "snapshots" / "v1.0.0" / PEER_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(fill_state_dict(load_fixture("campplus")["state_dict"]), path)
    return path


def embedder_of(name: str, work: Path):
    """The torch Embedder of a bench model (see the module docstring for the weights)."""
    import torch

    from speakerlab.frontends import FeatureSettings, feature_spec
    from speakerlab.inference.embedder import Embedder, load_embedder
    from speakerlab.models import build_model, model_features

    if name == "campplus":
        return load_embedder(threedspeaker="campplus", weights=peer_weights(work / "mscache"), device="cpu")
    torch.manual_seed(0)
    spec = feature_spec(FeatureSettings(**model_features(name)), 16000)
    return Embedder(build_model(name).eval(), spec, "cpu", name)


def onnx_file(name: str, mode: str, work: Path) -> Path:
    """The waveform ONNX file of a bench model for `mode` (onnx: fp32, int8: static, int8dyn: dynamic); the model
    is exported once and all three written under `work`."""
    path = work / f"{name}.{mode}.onnx"
    if path.exists():
        return path
    import copy

    import onnx
    import torch

    from speakerlab.inference.deploy.export import waveform_metadata
    from speakerlab.inference.deploy.graph import (
        WaveFrontEnd,
        front_end_graph,
        merged_graph,
        model_graph,
        set_metadata,
        with_lengths,
    )
    from speakerlab.inference.deploy.quantize import quantize_model_graph

    embedder = embedder_of(name, work)
    source = types.SimpleNamespace(model_name=name, describe=lambda: f"{name} (bench/deploy_speed.py)")
    meta = waveform_metadata(embedder, source, 16000)
    front, model = front_end_graph(embedder.spec, 16000), model_graph(embedder.model, embedder.spec)
    rng = np.random.default_rng(1)
    fe = WaveFrontEnd(embedder.spec, 16000).eval()
    with torch.no_grad():
        feats = [
            fe(torch.from_numpy(0.1 * rng.standard_normal((1, 48000 + 777 * i)).astype(np.float32))) for i in range(16)
        ]
    graphs = {
        "onnx": model,
        "int8": quantize_model_graph(model, "static", [f.numpy() for f in feats], name),
        "int8dyn": quantize_model_graph(model, "dynamic", [], name),
    }
    for m, graph in graphs.items():
        full = with_lengths(merged_graph(copy.deepcopy(front), graph))
        set_metadata(full, meta)
        onnx.save(full, work / f"{name}.{m}.onnx")
    return path


def waves_of(seconds: float, batch: int) -> np.ndarray:
    return (
        0.1 * np.random.default_rng(int(seconds * 10) + batch).standard_normal((batch, int(seconds * 16000)))
    ).astype(np.float32)


def timed(call, x, min_calls: int = 3, min_seconds: float = 1.5) -> float:
    """Median seconds of `call(x)` after one warm-up, over >= min_calls calls and >= min_seconds."""
    call(x)
    times = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_seconds:
        t = time.perf_counter()
        call(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def worker(name: str, mode: str, work: Path) -> dict:
    """Every cell of one model and mode in this process -> {cells: [...], peak_rss_mb}. The ONNX modes run the
    torch-free runtime on files made beforehand (`prepare`), so their peak RSS is the runtime's: torch is never
    imported in their process."""
    cosine = None
    if mode in ("onnx", "int8", "int8dyn"):
        from speakerlab.inference.deploy.runtime import load_onnx

        runtime = load_onnx(onnx_file(name, mode, work), threads=THREADS)

        def call(x):
            return runtime(x)

        if mode != "onnx":  # agreement with the fp32 file on the cells' waves
            fp32 = load_onnx(onnx_file(name, "onnx", work), threads=THREADS)
            a = np.concatenate([fp32(waves_of(s, b)) for s, b in CELLS])
            q = np.concatenate([runtime(waves_of(s, b)) for s, b in CELLS])
            cos = (a * q).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(q, axis=1))
            cosine = {"mean": float(cos.mean()), "min": float(cos.min())}

    else:
        import torch

        torch.set_num_threads(THREADS)
        embedder = embedder_of(name, work)
        module = torch.nn.Sequential(embedder.features, embedder.model).eval()
        if mode == "compile":
            module = torch.compile(module, dynamic=False)

        def call(x):
            with torch.no_grad():
                return module(torch.from_numpy(x))

    cells = []
    for seconds, batch in CELLS:
        t = timed(call, waves_of(seconds, batch))
        cells.append({"seconds": seconds, "batch": batch, "utt_per_s": batch / t, "rtf": t / (batch * seconds)})
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"model": name, "mode": mode, "cells": cells, "peak_rss_mb": rss, "cosine_to_fp32": cosine}


def run_worker(name: str, mode: str, work: Path) -> dict:
    """`worker` in a fresh process (its own peak RSS); the ONNX files of `name` are made first, in a process of
    their own."""
    if mode in ("onnx", "int8", "int8dyn") and not (work / f"{name}.{mode}.onnx").exists():
        made = subprocess.run([sys.executable, __file__, "--prepare", name, "--work", str(work)], capture_output=True)
        if made.returncode != 0:
            return {"model": name, "mode": mode, "failed": made.stderr.decode().strip().splitlines()[-1:]}
    cmd = [sys.executable, __file__, "--worker", name, mode, "--work", str(work)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"model": name, "mode": mode, "failed": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(results) -> str:
    head = "| model | mode | " + " | ".join(f"{s:g} s x{b}: utt/s (RTF)" for s, b in CELLS)
    head += " | peak RSS MB | cosine to fp32 (mean / min) |"
    lines = [head, "|" + "---|" * (4 + len(CELLS))]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['model']} | {r['mode']} | failed: {r['failed']} |")
            continue
        cells = " | ".join(f"{c['utt_per_s']:.2f} ({c['rtf']:.4f})" for c in r["cells"])
        cos = r.get("cosine_to_fp32")
        agree = f"{cos['mean']:.4f} / {cos['min']:.4f}" if cos else ""
        lines.append(f"| {r['model']} | {r['mode']} | {cells} | {r['peak_rss_mb']:.0f} | {agree} |")
    return "\n".join(lines)


# ---- the peer ratio -------------------------------------------------------------------------------------------


def peer_files(work: Path, n: int) -> list:
    """`n` 3-s 16 kHz PCM files (noise with a voiced-like tone, fixed seed) and their list file."""
    import soundfile as sf

    folder = work / "peer_wavs"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    paths = []
    for i in range(n):
        t = np.arange(48000) / 16000
        wave = 0.05 * rng.standard_normal(48000) + 0.2 * np.sin(2 * np.pi * (110 + 5 * i) * t)
        path = folder / f"utt{i:03d}.wav"
        sf.write(path, wave.astype(np.float32), 16000, subtype="PCM_16")
        paths.append(path)
    (work / "peer_wavs.list").write_text("".join(f"{p}\n" for p in paths))
    return paths


def line_rate(cmd, env, marker: str, cwd=None) -> float:
    """Run `cmd`; utterances/s from the arrival times of its stdout lines containing `marker` (first to last)."""
    with open(Path(env["HOME"]) / "last_stderr.log", "w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=cwd)
        stamps = [time.perf_counter() for line in proc.stdout if marker in line]
        if proc.wait() != 0 or len(stamps) < 3:
            err.seek(0)
            last = err.read().strip().splitlines()[-1:]
            raise RuntimeError(f"{cmd[:3]} failed (exit {proc.returncode}, {len(stamps)} lines): {last}")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def ours_per_file(work: Path, list_file: Path) -> None:
    """Our side of the ratio, in its own process: each file read and embedded alone by the ONNX fp32 file."""
    from speakerlab.inference.deploy.runtime import load_onnx

    runtime = load_onnx(onnx_file("campplus", "onnx", work), threads=THREADS)
    out = {}
    for line in list_file.read_text().split():
        emb = runtime.embed_waves([runtime.read(line)])[0]
        out[Path(line).stem] = emb
        print(f"embedded {line}", flush=True)
    np.savez(work / "ours_peer_files.npz", **out)


def ours_command(work: Path, list_file: Path) -> None:
    """Our side as `speakerlab-embed --onnx wav.scp OUT` runs it (speakerlab.inference.cli.embed_scp with its
    defaults: files read in list order, batched by equal length, 32 a call), in its own process: prints the
    utterances/s of that call (the runtime loaded before, as the peer's rate leaves out its start-up and model
    load)."""
    from speakerlab.inference.cli import embed_scp
    from speakerlab.inference.deploy.runtime import load_onnx

    runtime = load_onnx(onnx_file("campplus", "onnx", work), threads=THREADS)
    scp = work / "peer_wavs.scp"
    scp.write_text("".join(f"{Path(p).stem} {p}\n" for p in list_file.read_text().split()))
    t = time.perf_counter()
    ids, _ = embed_scp(runtime, str(scp))
    print(f"rate {len(ids) / (time.perf_counter() - t)}", flush=True)


def command_rate(cmd, env) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    return float(next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("rate ")))


def peer_ratio(args, work: Path, rounds: int) -> dict:
    paths = peer_files(work, args.peer_files)
    onnx_file("campplus", "onnx", work)
    (work / "home").mkdir(exist_ok=True)  # the peer's HOME (modelscope writes there) and our stderr logs
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work / "home"),
        "PYTHONPATH": str(Path(args.peer_site).resolve()),
        "MODELSCOPE_CACHE": str(work / "mscache"),
        "OMP_NUM_THREADS": str(THREADS),
        # Its per-file lines must arrive when written, not in one block at exit (stdout is a pipe here).
        "PYTHONUNBUFFERED": "1",
    }
    peer_cmd = [
        args.peer_python,
        "speakerlab/bin/infer_sv.py",
        "--model_id",
        PEER_MODEL_ID,
        "--wavs",
        str(work / "peer_wavs.list"),
        "--local_model_dir",
        str(work / "peer_out"),
    ]
    ours_cmd = [sys.executable, __file__, "--ours-per-file", "--work", str(work)]
    batched_cmd = [sys.executable, __file__, "--ours-command", "--work", str(work)]
    ours_env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "HOME": env["HOME"]}
    peer, ours, batched = [], [], []
    for r in range(rounds):
        order = ["peer", "ours", "batched"] if r % 2 == 0 else ["batched", "ours", "peer"]
        for who in order:
            if who == "peer":
                peer.append(line_rate(peer_cmd, env, "The extracted embedding", cwd=args.peer))
            elif who == "ours":
                ours.append(line_rate(ours_cmd, ours_env, "embedded "))
            else:
                batched.append(command_rate(batched_cmd, ours_env))
    mine = np.load(work / "ours_peer_files.npz")
    theirs = {
        p.stem: np.load(work / "peer_out" / PEER_MODEL_ID.split("/")[1] / "embeddings" / f"{p.stem}.npy") for p in paths
    }
    diff = max(float(np.abs(mine[k] - v).max()) for k, v in theirs.items())
    scale = max(float(np.abs(v).max()) for v in theirs.values())
    return {
        "files": len(paths),
        "rounds": rounds,
        "peer_utt_per_s": peer,
        "ours_utt_per_s": ours,
        "ratio_of_medians": statistics.median(ours) / statistics.median(peer),
        "ours_command_utt_per_s": batched,
        "command_ratio_of_medians": statistics.median(batched) / statistics.median(peer),
        "max_abs_diff_embeddings": diff,
        "embedding_scale": scale,
    }


def compare_files(paths, rounds: int = 3) -> dict:
    """ONNX files side by side in one process: each cell timed on each file, in alternating order, `rounds`
    times; utterances/s are the medians (the int8 speed-up of a trained model, e.g. egs/mini's)."""
    from speakerlab.inference.deploy.runtime import load_onnx

    runtimes = {str(p): load_onnx(p, threads=THREADS) for p in paths}
    out = {p: {} for p in runtimes}
    for seconds, batch in CELLS:
        x, times = waves_of(seconds, batch), {p: [] for p in runtimes}
        for r in range(rounds):
            for p in list(runtimes)[:: 1 if r % 2 == 0 else -1]:
                times[p].append(timed(runtimes[p], x, min_calls=2, min_seconds=0.5))
        for p in runtimes:
            out[p][f"{seconds:g}s x{batch}"] = batch / statistics.median(times[p])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="ONNX files, peer files and outputs")
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--peer", help="a 3D-Speaker checkout (modelscope/3D-Speaker)")
    ap.add_argument("--peer-python", help="the python of the peer's own environment")
    ap.add_argument("--peer-site", help="folder of the peer's sitecustomize (modelscope local cache only)")
    ap.add_argument("--peer-files", type=int, default=40)
    ap.add_argument("--peer-rounds", type=int, default=4)
    ap.add_argument("--compare", nargs="+", type=Path, help="time these waveform ONNX files side by side")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--prepare", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--ours-per-file", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ours-command", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.worker:
        print(json.dumps(worker(*args.worker, args.work)))
        return 0
    if args.prepare:
        onnx_file(args.prepare, "onnx", args.work)
        return 0
    if args.ours_per_file:
        ours_per_file(args.work, args.work / "peer_wavs.list")
        return 0
    if args.ours_command:
        ours_command(args.work, args.work / "peer_wavs.list")
        return 0
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; threads {THREADS}", flush=True
    )
    if args.compare:
        print(json.dumps(compare_files(args.compare), indent=2), flush=True)
        return 0
    if args.peer:
        ratio = peer_ratio(args, args.work, args.peer_rounds)
        (args.work / "peer_ratio.json").write_text(json.dumps(ratio, indent=2))
        print(json.dumps(ratio, indent=2), flush=True)
        return 0
    results = []
    for name in args.models:
        for mode in args.modes:
            t = time.time()
            results.append(run_worker(name, mode, args.work))
            print(f"{name} {mode}: {time.time() - t:.0f} s wall", file=sys.stderr, flush=True)
            (args.work / "speed.json").write_text(json.dumps(results, indent=2))
    print(markdown(results) if args.markdown else json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
