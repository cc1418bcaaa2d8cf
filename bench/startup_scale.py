"""Start-up and loader memory at VoxBlink2 scale: a training run on N utterances of S speakers (synthetic Kaldi
lists: wav.scp, utt2spk, spk2utt, utt2num_samples, every line pointing at one of 8 real 3 s wav files).

    python bench/startup_scale.py --utts 1000000 --speakers 100000 --work /tmp/startup_scale
    python bench/startup_scale.py --utts 10000000 --speakers 1000000 --work /tmp/startup_scale --steps 10000
    python bench/startup_scale.py --utts 1000000 --speakers 100000 --work /tmp/startup_scale --python-lists
    python bench/startup_scale.py --utts 1000000 --speakers 100000 --work /tmp/startup_scale --feats
    python bench/startup_scale.py --utts 1000000 --speakers 100000 --work /tmp/startup_scale --shards

The training source is the audio files (default), the feature store (`--feats`: data.feats) or tar shards
(`--shards`: data.shards), each fabricated cheaply for the same lists and kept in `--work`:

    --feats    feats.ark holds the fbank (the config's options) of the 8 clips; every line of feats.scp points at
               its clip's matrix; feats.json as speakerlab-feature-store writes it (options, wav.scp's digest)
    --shards   the index of all N utterances as speakerlab-shards writes it (seed 0, PER_SHARD samples a shard),
               but tar files only for the shards the run's loader reads in the epoch's first `--steps` steps (all
               of them would be N x ~7 KB); each sample is one SHARD_SECONDS clip, so a worker's shuffle buffer
               holds far less than real files' bytes would (its memory is the lists', not the buffer's)

Each run is a fresh process (`--child`), as `speakerlab-train` starts:

    first step   seconds from the process start to the end of the first optimizer step: interpreter and imports,
                 the config, the lists read and checked (speakerlab.train.inputs.loader), the model and an AAM head of S
                 classes (embedding 192) built, the loader's workers started, one step of CAM++ (tiny) on CPU
    main peak    the main process's peak RSS (ru_maxrss) at that moment
    worker       each loader worker's RSS, its anonymous and file-backed parts (RssAnon, RssFile: memory-mapped
                 lists are file pages of the page cache, shared by every process that maps them) and private
                 memory (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup: pages no other process
                 maps, e.g. heap pages copied on write) after the first
                 step and every 1000 steps of the epoch's first `--steps` (the loader alone: batches are drawn
                 and dropped, no model step, so 10k steps take minutes, not hours, on a 2-core machine)

`--cold` removes the lists' `.compact/` first, so they are parsed (a first start without the prepare stage);
otherwise a run maps what the prepare stage, or an earlier run, kept there (feats.scp is parsed at every start).
`--python-lists` runs the worker phase of the audio source on the same lists held as Python lists of str / int
(what a loader held before speakerlab.dataio.tables.compact): the reference for copy-on-write growth. Imports run from
cached bytecode, as in a normal environment (this sandbox sets PYTHONDONTWRITEBYTECODE, which the child drops).
Prints a JSON line per run and a table.
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
SHARD_SECONDS, PER_SHARD = 0.1, 10_000
CONFIG = """
data: {{train: {data}, crop_seconds: 0.5{source}}}
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
    clips = clip_dir(work)
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


def clip_dir(work: Path) -> Path:
    return work / "corpora" / "voxblink2" / "audio" / "id000000" / "DwgYRqnQZHM"


def make_store(work: Path, data: Path, cfg_path: Path) -> None:
    """The feature store of `data` (see the module doc): CLIPS matrices, N lines of feats.scp."""
    import dataclasses

    import kaldiio
    import torch

    from speakerlab.config import load_config
    from speakerlab.dataio.audio import read_audio
    from speakerlab.features.fbank import Fbank
    from speakerlab.features.store import FEATS_ARK, FEATS_CONF, FEATS_SCP, lists_digest
    from speakerlab.frontends import feature_spec

    if (data / FEATS_CONF).is_file():
        return
    cfg = load_config(str(cfg_path))
    fbank = Fbank(feature_spec(cfg.features, cfg.data.sample_rate).fbank)
    with torch.no_grad(), kaldiio.WriteHelper(f"ark,scp:{data / FEATS_ARK},{data / 'clips.scp'}") as writer:
        for clip in sorted(clip_dir(work).glob("*.wav")):
            writer(clip.name, fbank(torch.from_numpy(read_audio(str(clip), SR)).unsqueeze(0))[0].numpy())
    where = dict(line.split() for line in (data / "clips.scp").read_text().splitlines())  # clip -> ark:offset
    lines = 0
    with open(data / "wav.scp") as scp, open(data / FEATS_SCP, "w") as out:
        for line in scp:
            utt, path = line.split()
            out.write(f"{utt} {where[Path(path).name]}\n")
            lines += 1
    meta = {"fbank": dataclasses.asdict(fbank.config), "utterances": lines, "wav_scp_sha1": lists_digest(data)}
    (data / FEATS_CONF).write_text(json.dumps(meta))  # last, as the store command: the store is complete


def make_shards(work: Path, data: Path, out: Path, cfg_path: Path, steps: int) -> None:
    """The shards of `data` under `out` (see the module doc): the whole index once, then the tar files of the
    shards that the epoch's first `steps` steps read (written when missing)."""
    import io

    import numpy as np
    import soundfile as sf
    import webdataset

    from speakerlab.config import load_config
    from speakerlab.dataio.loaders.shard_stream import TAG_SHARD_ORDER, ShardStream
    from speakerlab.dataio.loaders.shards import FORMAT, SHARDS_JSON
    from speakerlab.dataio.tables.compact import read_compact

    lists = read_compact(data)
    n, samples = len(lists), int(SHARD_SECONDS * SR)
    speakers = [s.decode() for s in lists.speakers.tolist()]
    if not (out / SHARDS_JSON).is_file():
        out.mkdir(parents=True, exist_ok=True)
        order = np.random.default_rng(0).permutation(n)  # speakerlab-shards' order for seed 0
        np.save(out / "utts.npy", lists.utts().fixed()[order])
        np.save(out / "labels.npy", lists.labels[order])
        np.save(out / "num_samples.npy", np.full(n, samples, dtype=np.int64))
        files = [
            {"file": f"shard-{k:06d}.tar", "count": min(PER_SHARD, n - a)} for k, a in enumerate(range(0, n, PER_SHARD))
        ]
        options = {"seed": 0, "sample_rate": SR, "shard_mb": None, "per_shard": PER_SHARD}
        index = {"format": FORMAT, "data": str(data), "options": options, "sample_rate": SR}
        (out / SHARDS_JSON).write_text(json.dumps({**index, "speakers": speakers, "total": n, "shards": files}))
    cfg = load_config(str(cfg_path))
    hw, mb = cfg.hardware, cfg.hardware.per_device_batch
    stream = ShardStream(out, mb, mb, 1, seed=cfg.train.seed, crop_samples=samples)
    order = np.random.default_rng([cfg.train.seed, 0, TAG_SHARD_ORDER]).permutation(len(stream.files))
    at = np.concatenate([[0], np.cumsum(stream.counts[order])])  # epoch positions of the shards in that order
    needed = set()
    for worker in range(hw.num_workers):  # its run of micro-batches; what its prefetch and buffer read beyond
        _, first, count, _ = stream.worker_plan(worker, hw.num_workers)
        batches = min(count, -(-(steps + 1) // hw.num_workers) + hw.prefetch_factor + 2)
        last = first + min(count * mb, batches * mb + cfg.data.shuffle_buffer)
        needed |= {int(order[k]) for k in np.flatnonzero((at[:-1] < last) & (at[1:] > first))}
    wave = io.BytesIO()
    sf.write(wave, np.zeros(samples, dtype=np.int16), SR, format="WAV", subtype="PCM_16")
    utts, labels = np.load(out / "utts.npy", mmap_mode="r"), np.load(out / "labels.npy", mmap_mode="r")
    for s in sorted(needed):
        path = out / stream.files[s]
        if path.exists():
            continue
        with open(f"{path}.tmp", "wb") as f:
            writer = webdataset.TarWriter(f, encoder=False)
            for i in range(int(stream.offsets[s]), int(stream.offsets[s + 1])):
                meta = {"utt": utts[i].decode(), "spk": speakers[labels[i]], "num_samples": samples}
                writer.write({"__key__": f"{i:09d}", "wav": wave.getvalue(), "json": json.dumps(meta).encode()})
            writer.close()
        os.replace(f"{path}.tmp", path)


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
    from speakerlab.train.state.resume import resume
    from speakerlab.train.step import train_step

    torch.set_num_threads(1)
    exp = Path(args.work) / f"exp_{args.utts}_{os.getpid()}"
    cfg, init = load_train_config([args.config], [], None)
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
        "source": source(args),
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


def source(args) -> str:
    return "feats" if args.feats else "shards" if args.shards else "audio"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--utts", type=int, default=1_000_000)
    ap.add_argument("--speakers", type=int, default=100_000)
    ap.add_argument("--work", default="/tmp/startup_scale")
    ap.add_argument("--steps", type=int, default=10_000, help="loader steps after the first training step")
    ap.add_argument("--batch", type=int, default=16, help="global = per-device batch")
    ap.add_argument("--python-lists", action="store_true", help="the audio source's lists as Python objects")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--feats", action="store_true", help="train from a feature store of the lists (data.feats)")
    kind.add_argument("--shards", action="store_true", help="train from tar shards of the lists (data.shards)")
    ap.add_argument("--cold", action="store_true", help="remove the lists' .compact/ first: they are parsed")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.python_lists and (args.feats or args.shards):
        ap.error("--python-lists holds the audio source's lists (not with --feats or --shards)")
    if args.child:
        print(json.dumps(child(args)))
        return 0
    work = Path(args.work)
    t = time.time()
    data = make_corpus(work, args.utts, args.speakers)
    print(f"# lists of {args.utts} utterances in {data} ({time.time() - t:.0f} s to write or find)", flush=True)
    shards = work / f"shards_{args.utts}_{args.speakers}"
    extra = {"audio": "", "feats": ", feats: true", "shards": f", shards: {shards}"}[source(args)]
    cfg_path = work / f"config_{args.utts}_{source(args)}.yaml"
    cfg_path.write_text(CONFIG.format(data=data, batch=args.batch, source=extra))
    t = time.time()
    if args.feats:
        make_store(work, data, cfg_path)
    if args.shards:
        make_shards(work, data, shards, cfg_path, args.steps)
    if args.feats or args.shards:
        print(f"# {source(args)} of the lists ({time.time() - t:.0f} s to write or find)", flush=True)
    if args.cold:
        shutil.rmtree(data / ".compact", ignore_errors=True)
    mapped = (data / ".compact" / "meta.json").is_file()
    cmd = [sys.executable, __file__, "--child", f"--config={cfg_path}", *sys.argv[1:]]
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
    head = "| source | utterances | speakers | first step s | main peak GiB | worker RSS/anon/private GiB at steps"
    print(f"{head} {steps} |")
    rows = " ; ".join(
        ", ".join(f"{w['rss']:.2f}/{w['anon']:.2f}/{w['private']:.2f}" for w in ws) for ws in out["workers"].values()
    )
    first, peak = out["first_step_s"], out["main_peak_gib"]
    print(f"| {source(args)} | {args.utts:,} | {args.speakers:,} | {first:.1f} | {peak:.2f} | {rows} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
