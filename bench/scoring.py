"""Scoring benchmark: `python -m speakerlab.scoring.score` as a user runs it, end to end, in a child process.

    python bench/scoring.py --work /tmp/bench_scoring                      # 10 M trials, 100 k embeddings
    python bench/scoring.py --work /tmp/bench_scoring --asnorm --repeats 3  # + --mean-sub --asnorm-top-n 300
    python bench/scoring.py --work W --src /path/to/other/checkout --src .  # old vs new, alternating

Data (generated once into `--work` with `--seed`, reused while the sizes match): `--embeddings` random
embeddings of dim `--dim` with VoxCeleb-shaped ids `id1SSSS/VVVVVVVVVVV/UUUUU.wav` (speaker, video,
utterance; `--utts-per-speaker` utterances, a speaker centre plus noise), a trial list of `--trials`
unique unordered pairs without self-trials (`--target-fraction` same-speaker pairs; the label follows
from the speaker part of the ids), a cohort of `--cohort` embeddings of other speakers
(`--cohort-per-speaker` each) and its utt2spk.

Each run is the whole command in a fresh process: import, parse, score, metrics, writing P.scores,
P.json, P.result, the table and both pictures. Wall seconds come from the parent's clock, CPU seconds
(user + system, all threads: less sensitive than wall time to other work on a shared machine) and
peak RSS from the child's own rusage (os.wait4). `--src` (repeatable) names speakerlab checkouts to run
(PYTHONPATH); their runs alternate within each repeat. The last lines give best, median and worst wall
time and the largest peak RSS per source, with the machine (cores, CPU, load average at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
_ALNUM = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", np.uint8)


def _digits(out: np.ndarray, col: int, values: np.ndarray, width: int) -> None:
    for j in range(width):
        out[:, col + j] = (values // 10 ** (width - 1 - j)) % 10 + 48


def vox_ids(spk: np.ndarray, utt: np.ndarray, videos_per_speaker: int, rng) -> np.ndarray:
    """Speaker and utterance numbers `(M,)` -> `(M, 29)` uint8 ids `id1SSSS/VVVVVVVVVVV/UUUUU.wav`, the
    video part (11 characters, random per speaker and video) as in VoxCeleb."""
    n_spk = int(spk.max()) + 1
    video_text = _ALNUM[rng.integers(0, len(_ALNUM), (n_spk, videos_per_speaker, 11))]
    out = np.zeros((len(spk), 29), np.uint8)
    out[:, 0:3] = np.frombuffer(b"id1", np.uint8)
    _digits(out, 3, spk, 4)
    out[:, 7] = out[:, 19] = ord("/")
    out[:, 8:19] = video_text[spk, utt % videos_per_speaker]
    _digits(out, 20, utt, 5)
    out[:, 25:29] = np.frombuffer(b".wav", np.uint8)
    return out


def _write_trials(path: Path, chars: np.ndarray, a: np.ndarray, b: np.ndarray, target: np.ndarray) -> None:
    label = np.zeros((2, 10), np.uint8)
    label[0, :10] = np.frombuffer(b"nontarget\n", np.uint8)
    label[1, :7] = np.frombuffer(b"target\n", np.uint8)
    with open(path, "wb") as f:
        for lo in range(0, len(a), 1 << 20):
            sl = slice(lo, lo + (1 << 20))
            sp = np.full((len(a[sl]), 1), 32, np.uint8)
            rows = np.concatenate([chars[a[sl]], sp, chars[b[sl]], sp, label[target[sl].astype(np.int64)]], axis=1)
            f.write(rows[rows != 0].tobytes())


def generate(work: Path, args) -> Dict:
    """Write embeddings.npz, trials, cohort.npz, cohort_utt2spk into `work` (skipped when `work/data.json`
    says they were made with the same settings) -> the settings and counts."""
    want = {k: getattr(args, k) for k in ("trials", "embeddings", "dim", "utts_per_speaker", "target_fraction")}
    want.update(cohort=args.cohort, cohort_per_speaker=args.cohort_per_speaker, seed=args.seed)
    stamp = work / "data.json"
    if stamp.is_file() and json.loads(stamp.read_text()).get("settings") == want:
        return json.loads(stamp.read_text())
    work.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    rng = np.random.default_rng(args.seed)
    per = args.utts_per_speaker
    n_spk = max(2, args.embeddings // per)
    n_emb = n_spk * per
    spk, utt = np.repeat(np.arange(n_spk), per), np.tile(np.arange(per), n_spk)
    chars = vox_ids(spk, utt, max(1, per // 5), rng)
    centres = rng.standard_normal((n_spk, args.dim), dtype=np.float32)
    emb = np.repeat(centres, per, axis=0) + 2.0 * rng.standard_normal((n_emb, args.dim), dtype=np.float32)
    ids = chars.view("S29")[:, 0].astype(str)
    np.savez(work / "embeddings.npz", ids=ids, embeddings=emb)
    # Targets: two utterances of one speaker; nontargets: any two. Unordered pairs (a < b), each once.
    n_tar = int(args.trials * args.target_fraction)
    ta = rng.integers(0, n_emb, n_tar + n_tar // 4)
    tb = spk[ta] * per + rng.integers(0, per, len(ta))
    na = rng.integers(0, n_emb, args.trials + args.trials // 10)
    nb = rng.integers(0, n_emb, len(na))
    a, b = np.r_[ta, na], np.r_[tb, nb]
    keep = a != b
    lo, hi = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    keys = np.unique(lo.astype(np.int64) * n_emb + hi)
    is_tar = spk[keys // n_emb] == spk[keys % n_emb]
    tar, non = keys[is_tar], keys[~is_tar]
    n_tar = min(n_tar, len(tar))
    keys = rng.permutation(np.r_[rng.permutation(tar)[:n_tar], rng.permutation(non)[: args.trials - n_tar]])
    a, b = keys // n_emb, keys % n_emb
    swap = rng.random(len(a)) < 0.5  # enrol / test order at random; the pair stays unique unordered
    a, b = np.where(swap, b, a), np.where(swap, a, b)
    _write_trials(work / "trials", chars, a, b, spk[a] == spk[b])
    # Cohort: other speakers (numbers after the eval speakers), `cohort_per_speaker` embeddings each.
    c_spk_n = max(1, args.cohort // args.cohort_per_speaker)
    c_spk = np.repeat(np.arange(c_spk_n), args.cohort_per_speaker) + n_spk
    c_utt = np.tile(np.arange(args.cohort_per_speaker), c_spk_n)
    c_chars = vox_ids(c_spk, c_utt, 1, rng)
    c_ids = c_chars.view("S29")[:, 0].astype(str)
    c_centres = rng.standard_normal((c_spk_n, args.dim), dtype=np.float32)
    c_emb = np.repeat(c_centres, args.cohort_per_speaker, axis=0)
    c_emb += 2.0 * rng.standard_normal(c_emb.shape, dtype=np.float32)
    np.savez(work / "cohort.npz", ids=c_ids, embeddings=c_emb)
    (work / "cohort_utt2spk").write_text("".join(f"{u} {u.split('/')[0]}\n" for u in c_ids))
    info = {"settings": want, "n_trials": len(keys), "n_target": int((spk[a] == spk[b]).sum()), "n_emb": n_emb}
    info["trials_mb"] = round((work / "trials").stat().st_size / 2**20)
    stamp.write_text(json.dumps(info))
    return info


def command(work: Path, out: Path, asnorm: bool) -> List[str]:
    cmd = [sys.executable, "-m", "speakerlab.scoring.score", "--embeddings", str(work / "embeddings.npz")]
    cmd += ["--trials", str(work / "trials"), "--out", str(out)]
    if asnorm:
        cmd += ["--cohort", str(work / "cohort.npz"), "--cohort-utt2spk", str(work / "cohort_utt2spk")]
        cmd += ["--mean-sub", "--asnorm-top-n", "300"]
    return cmd


def run_once(cmd: List[str], src: Path, log: Path) -> Dict:
    """One run of `cmd` with `src` on PYTHONPATH -> wall seconds, CPU seconds (user + system, all threads),
    peak RSS (MB), exit code."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    with open(log, "wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=src, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS alone
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall": wall, "cpu": cpu, "rss_mb": usage.ru_maxrss / 1024, "rc": proc.returncode}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    return f"{os.cpu_count()} cores, {cpu}, load average {load}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True, help="data and outputs (kept: the data is reused)")
    ap.add_argument("--trials", type=int, default=10_000_000)
    ap.add_argument("--embeddings", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--utts-per-speaker", type=int, default=50)
    ap.add_argument("--target-fraction", type=float, default=0.1)
    ap.add_argument("--cohort", type=int, default=6000, help="cohort embeddings")
    ap.add_argument("--cohort-per-speaker", type=int, default=1, help="cohort embeddings per speaker")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--asnorm", action="store_true", help="--mean-sub --asnorm-top-n 300 with the cohort")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--src", action="append", help="speakerlab checkout(s) to run (default: this one)")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    work = Path(args.work).resolve()
    t0 = time.perf_counter()
    info = generate(work, args)
    print(
        f"data: {info['n_trials']} trials ({info['n_target']} target, {info['trials_mb']} MB) over {info['n_emb']} "
        f"embeddings of dim {args.dim}, cohort {args.cohort} ({time.perf_counter() - t0:.1f} s)",
    )
    print(f"machine: {machine()}")
    srcs = [Path(s).resolve() for s in (args.src or [str(ROOT)])]
    runs: Dict[Path, List[Dict]] = {s: [] for s in srcs}
    for r in range(args.repeats):
        for k, src in enumerate(srcs):
            out = work / f"out{k}" / "bench"
            cmd = command(work, out, args.asnorm)
            res = run_once(cmd, src, work / f"run{k}.log")
            if res["rc"] != 0:
                print((work / f"run{k}.log").read_text()[-3000:], file=sys.stderr)
                raise SystemExit(f"{src}: the command failed with exit code {res['rc']}")
            runs[src].append(res)
            result = Path(f"{out}.result").read_text().strip()
            print(
                f"run {r + 1} {src}: wall {res['wall']:.2f} s, CPU {res['cpu']:.2f} s, "
                f"peak RSS {res['rss_mb']:.0f} MB, load {os.getloadavg()[0]:.2f} | {result}"
            )
    print("command: PYTHONPATH=SRC " + " ".join(command(work, work / "outK" / "bench", args.asnorm)))
    for src, rs in runs.items():
        walls, cpus = [r["wall"] for r in rs], [r["cpu"] for r in rs]
        print(
            f"{src}: {info['n_trials']} trials over {info['n_emb']} embeddings{' + AS-norm' if args.asnorm else ''}: "
            f"wall best {min(walls):.2f} s, median {float(np.median(walls)):.2f} s, worst {max(walls):.2f} s; "
            f"CPU best {min(cpus):.2f} s, worst {max(cpus):.2f} s ({len(rs)} runs), "
            f"peak RSS {max(r['rss_mb'] for r in rs):.0f} MB"
        )
    print(f"machine at the end: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
