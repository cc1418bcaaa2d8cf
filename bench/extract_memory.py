"""Extraction memory benchmark: peak RSS of `python -m speakerlab.inference.extract` as the data dir grows.

    python bench/extract_memory.py --source data/test --checkpoint exp/mini/checkpoints/avg.pt \
        --work /tmp/extract_memory --sizes 3000 9000 27000 --path audio feats --procs 1 2

For each size N a data dir of N utterances is made in `--work` by repeating the files of `--source`
(ids `rKKK-<utt>`); for the feature-store path its feats.scp points N entries at the store of the
source's files (built once, `python -m speakerlab.features.store`), so no audio or fbank is copied.
Each case runs the command with default options (`--procs 2`: under torchrun, 2 processes, CPU) and
reports its wall time, utterances per second, and peak RSS: the largest single process (the extractor
itself; loader workers are separate processes) and the largest sum over the whole process tree,
sampled every 0.1 s from /proc. `--src` names the speakerlab checkout to run (PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent


def make_dir(source: Path, root: Path, n: int, feats: bool) -> Path:
    """A data dir of n utterances repeating the files of `source` (and, with `feats`, its store)."""
    scp = [line.split(maxsplit=1) for line in (source / "wav.scp").read_text().splitlines() if line.strip()]
    root.mkdir(parents=True, exist_ok=True)
    rows = sorted((f"r{i // len(scp):03d}-{scp[i % len(scp)][0]}", i % len(scp)) for i in range(n))
    (root / "wav.scp").write_text("".join(f"{u} {scp[k][1]}\n" for u, k in rows))
    if feats:
        store = dict(line.split(maxsplit=1) for line in (source / "feats.scp").read_text().splitlines())
        (root / "feats.scp").write_text("".join(f"{u} {store[scp[k][0]]}\n" for u, k in rows))
        meta = (source / "feats.json").read_text()
        (root / "feats.json").write_text(meta)  # (written after wav.scp: the store is up to date)
    return root


def _tree(pid: int) -> List[int]:
    """pid and all its descendants (from /proc/*/stat parent links)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_case(cmd: List[str], src: Path, log: Path) -> Dict:
    """Run `cmd`, sampling the RSS of its process tree -> wall, peak of one process, peak of the tree."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    peaks = {"process": 0.0, "tree": 0.0}
    with open(log, "wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=src, stdout=f, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                rss = [_rss_mb(p) for p in _tree(proc.pid)]
                peaks["process"] = max(peaks["process"], max(rss, default=0.0))
                peaks["tree"] = max(peaks["tree"], sum(rss))
                done.wait(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        sampler.join()
    # ru_maxrss of the child (and its reaped children): the exact single-process peak.
    peaks["process"] = max(peaks["process"], usage.ru_maxrss / 1024)
    return {"wall": wall, "rc": os.waitstatus_to_exitcode(status), **peaks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, help="data dir whose files are repeated (wav.scp)")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sizes", type=int, nargs="+", default=[3000, 9000, 27000])
    ap.add_argument("--path", nargs="+", choices=["audio", "feats"], default=["audio", "feats"])
    ap.add_argument("--procs", type=int, nargs="+", default=[1], help="1: one process; 2: torchrun, 2 processes")
    ap.add_argument("--src", default=str(ROOT), help="speakerlab checkout to run")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more options for the command")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    source, work, src = Path(args.source).resolve(), Path(args.work).resolve(), Path(args.src).resolve()
    if "feats" in args.path and not (source / "feats.json").exists():
        subprocess.run([sys.executable, "-m", "speakerlab.features.store", "--data", str(source)], check=True, cwd=ROOT)
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    for path in args.path:
        for procs in args.procs:
            for n in args.sizes:
                data = make_dir(source, work / f"{path}_{n}", n, path == "feats")
                out = work / f"{path}_{n}_{procs}.npz"
                cmd = [sys.executable, "-m", "speakerlab.inference.extract"]
                if procs > 1:
                    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}"]
                    cmd += ["--master_port=29577", "-m", "speakerlab.inference.extract"]
                cmd += ["--checkpoint", str(args.checkpoint), "--data", str(data), "--out", str(out)]
                cmd += ["--device", "cpu", "--feats", "yes" if path == "feats" else "no", *args.extra]
                res = run_case(cmd, src, work / f"{path}_{n}_{procs}.log")
                if res["rc"] != 0:
                    print((work / f"{path}_{n}_{procs}.log").read_text()[-3000:], file=sys.stderr)
                    raise SystemExit(f"extraction failed with exit code {res['rc']}")
                print(
                    f"{path} procs {procs} N {n}: wall {res['wall']:.1f} s, {n / res['wall']:.0f} utt/s, peak RSS "
                    f"process {res['process']:.0f} MB, tree {res['tree']:.0f} MB | {' '.join(cmd[1:])}"
                )
    print(f"machine at the end: load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
