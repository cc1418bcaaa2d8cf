"""Start-up and loader memory at VoxBlink2 scale: a training run on N utterances of S speakers (synthetic Kaldi
lists: wav.scp, utt2spk, spk2utt, utt2num_samples, every line pointing at one of 8 real 3 s wav files).

    python bench/startup_scale.py --utts 1000000 --speakers 100000 --work /tmp/startup_scale
    python bench/startup_scale.py --utts 10000000 --speakers 1000000 --work /tmp/startup_scale --steps 10000
    python bench/startup_scale.py --utts 1000000 --speakers 100000 --work /tmp/startup_scale --python-lists

Each run is a fresh process (`--child`), as `speakerlab-train` starts:

    first step   seconds from the process start to the end of the first optimizer step: interpreter and imports,
                 the config, the lists read and checked (speakerlab.train.data), the model and an AAM head of S
                 classes (embedding 192) built, the loader's workers started, one step of CAM++ (tiny) on CPU
    main peak    the main process's peak RSS (ru_maxrss) at that moment
    worker       each loader worker's RSS, its anonymous and file-backed parts (RssAnon, RssFile: memory-mapped
                 lists are file pages of the page cache, shared by every process that maps them) and private
                 memory (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup: pages no other process
                 maps, e.g. heap pages copied on write) after the first
                 step and every 1000 steps of the epoch's first `--steps` (the loader alone: batches are drawn
                 and dropped, no model step, so 10k steps take minutes, not hours, on a 2-core machine)

`--cold` removes the lists' `.compact/` first, so they are parsed (a first start without the prepare stage);
otherwise a run maps what the prepare stage, or an earlier run, kept there. `--python-lists` runs the worker
phase on the same lists held as Python lists of str / int (what a loader held before speakerlab.dataio.compact):
the reference for copy-on-write growth. Imports run from cached bytecode, as in a normal environment (this
sandbox sets PYTHONDONTWRITEBYTECODE, which the child drops). Prints a JSON line per run and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CLIPS, SECONDS, SR = 8, 3.0, 16000
CONFIG = """
data: {{train: {data}, crop_seconds: 0.5}}
features: {{num_mel_bins: 40, dither: 0.0}}
model:
  name: campplus
  args: {{feat_dim: 40, embedding_size: 192, growth_rate: 8, bn_size: 2, init_channels: 16, m_channels: 4,
         fcm_blocks: [1, 1], num_layers: [1, 1, 1]}}
loss: {{margin: 0.2}}
optim: {{name: sgd, lr: 0.1, warmup_epochs: 0}}
train: {{epochs: 1, global_batch_size: {batch}, log_every_steps: 1000000, save_every_steps: 0}}
hardware: {{device: cpu, precision: fp32, per_device_batch: {batch}, num_workers: 2, prefetch_factor: 2,
           pin_memory: false}}
"""


def make_corpus(work: Path, utts: int, speakers: int) -> Path:
    """The data dir (written once per size, reused): ids `id<spk>-<video>-<n>` as VoxBlink2's, speakers of
    utts / speakers utterances each, paths into a VoxBlink2-like tree of CLIPS real wav files."""
    import numpy as np
    import soundfile as sf

    data = work / f"data_{utts}_{speakers}"
    if (data / ".done").exists():
        return data
    clips = work / "corpora" / "voxblink2" / "audio" / "id000000" / "DwgYRqnQZHM"
    clips.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in range(CLIPS):
        sf.write(str(clips / f"{k:05d}.wav"), 0.1 * rng.standard_normal(int(SECONDS * SR)), SR, subtype="PCM_16")
    data.mkdir(parents=True, exist_ok=True)
    per = utts // speakers
    samples = int(SECONDS * SR)
    files = {n: open(data / n, "w") for n in ("wav.scp", "utt2spk", "spk2utt", "utt2num_samples")}
    for s in range(speakers):
        ids = [f"id{s:07d}-yt{(s * 7919) % 10**9:09d}-{n:05d}" for n in range(per)]
        spk = f"id{s:07d}"
        files["wav.scp"].write("".join(f"{u} {clips}/{(s + n) % CLIPS:05d}.wav\n" for n, u in enumerate(ids)))
        files["utt2spk"].write("".join(f"{u} {spk}\n" for u in ids))
        files["utt2num_samples"].write("".join(f"{u} {samples}\n" for u in ids))
        files["spk2utt"].write(f"{spk} {' '.join(ids)}\n")
    for f in files.values():
        f.close()
    (data / ".done").write_text("")
    return data


def memory(pid: int) -> dict:
    """RSS, peak RSS and private memory (GiB) of a process, from /proc."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    private = sum(int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean", "Private_Dirty")))
    kib = lambda key: int(status[key].split()[0]) / 2**20  # noqa: E731
    return {
        "rss": kib("VmRSS"),
        "peak": kib("VmHWM"),
        "anon": kib("RssAnon"),  # anonymous pages: the heap, inherited at the fork or the process's own
        "file": kib("RssFile"),  # file pages mapped: page cache, the same physical pages in every process
        "private": private / 2**20,
    }


def child(args) -> dict:
    import torch

    from speakerlab.train.build import build_run, load_train_config
    from speakerlab.train.loop import train_step
    from speakerlab.train.resume import resume

    torch.set_num_threads(1)
    cfg_path = Path(args.work) / f"config_{args.utts}.yaml"
    cfg_path.write_text(CONFIG.format(data=args.data, batch=args.batch))
    exp = Path(args.work) / f"exp_{args.utts}_{os.getpid()}"
    cfg, init = load_train_config([str(cfg_path)], [], None)
    built = time.time()
    run = build_run(cfg, exp, init)
    resume(run)
    lists_built = time.time() - built
    run.sampler.set_epoch(0, 0)
    run.net.train()
    if args.python_lists:  # the same lists as Python objects, as a loader held them before the compact lists
        dataset = run.loader.dataset
        dataset.paths = [dataset.paths[i] for i in range(len(dataset))]
        dataset.labels, dataset.lengths = dataset.labels.tolist(), dataset.lengths.tolist()
    batches = iter(run.loader)
    train_step(run, batches)
    first = time.time()
    workers = [w.pid for w in batches._workers]
    out = {
        "utts": args.utts,
        "speakers": args.speakers,
        "python_lists": args.python_lists,
        "first_step_at": first,
        "build_run_s": lists_built,
        "main_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "workers": {0: [memory(p) for p in workers]},
    }
    for step in range(1, args.steps + 1):
        for _ in range(run.plan.accumulation):
            next(batches)
        if step % 1000 == 0:
            out["workers"][step] = [memory(p) for p in workers]
    out["main_end_gib"] = memory(os.getpid())["rss"]
    del batches
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--utts", type=int, default=1_000_000)
    ap.add_argument("--speakers", type=int, default=100_000)
    ap.add_argument("--work", default="/tmp/startup_scale")
    ap.add_argument("--steps", type=int, default=10_000, help="loader steps after the first training step")
    ap.add_argument("--batch", type=int, default=16, help="global = per-device batch")
    ap.add_argument("--python-lists", action="store_true")
    ap.add_argument("--cold", action="store_true", help="remove the lists' .compact/ first: they are parsed")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    work = Path(args.work)
    t = time.time()
    data = make_corpus(work, args.utts, args.speakers)
    print(f"# lists of {args.utts} utterances in {data} ({time.time() - t:.0f} s to write or find)", flush=True)
    if args.cold:
        shutil.rmtree(data / ".compact", ignore_errors=True)
    mapped = (data / ".compact" / "meta.json").is_file()
    cmd = [sys.executable, __file__, "--child", f"--data={data}", *sys.argv[1:]]
    # Imports from cached bytecode, as in a normal environment (a sandbox may set PYTHONDONTWRITEBYTECODE).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["OMP_NUM_THREADS"] = "1"
    start = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stderr[-3000:], file=sys.stderr)
        return 1
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["first_step_s"] = out.pop("first_step_at") - start
    out["lists"] = "mapped (.compact/ of an earlier read)" if mapped else "parsed (then kept in .compact/)"
    out["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}"
    print(json.dumps(out))
    steps = list(out["workers"])
    print(f"| utterances | speakers | first step s | main peak GiB | worker RSS/anon/private GiB at steps {steps} |")
    rows = " ; ".join(
        ", ".join(f"{w['rss']:.2f}/{w['anon']:.2f}/{w['private']:.2f}" for w in ws) for ws in out["workers"].values()
    )
    print(f"| {args.utts:,} | {args.speakers:,} | {out['first_step_s']:.1f} | {out['main_peak_gib']:.2f} | {rows} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
