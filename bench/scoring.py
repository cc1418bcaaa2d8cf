"""Scoring benchmark: parse + score + metrics of a large random trial list, end to end.

    python bench/scoring.py                                  # 10 M trials over 100 k embeddings, dim 256
    python bench/scoring.py --trials 1000000 --repeats 3     # smaller, three timed runs

Generates random embeddings (speakers of `--utts-per-speaker` utterances: a speaker centre plus noise) and
a random trial list without repeated pairs (`--target-fraction` same-speaker pairs) in a temporary
directory, then times, in a fresh child process each run (so its peak RSS is the scoring's own), the wall
and CPU seconds of: loading the .npz, parsing the list (`speakerlab.dataio.trials`), cosine scoring
(`speakerlab.scoring.score.Scorer`) and EER + minDCF at p_target 0.01 and 0.05 (`speakerlab.scoring.metrics`). `--write`
also times writing the scores file (not part of the total). The last line reads
`N trials over M embeddings: T s, peak RSS R MB` with the best wall time of the runs and the largest peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _id_chars(n_spk: int, per_spk: int) -> np.ndarray:
    """Ids `spk%05d/utt%04d` as a `(M, 16)` uint8 matrix (fixed width, so no per-id Python string)."""
    spk = np.repeat(np.arange(n_spk), per_spk)
    utt = np.tile(np.arange(per_spk), n_spk)
    out = np.zeros((len(spk), 16), np.uint8)
    out[:, 0:3] = np.frombuffer(b"spk", np.uint8)
    out[:, 8:12] = np.frombuffer(b"/utt", np.uint8)
    for j in range(5):
        out[:, 3 + j] = (spk // 10 ** (4 - j)) % 10 + 48
    for j in range(4):
        out[:, 12 + j] = (utt // 10 ** (3 - j)) % 10 + 48
    return out


def generate(root: Path, n_trials: int, n_emb: int, dim: int, per_spk: int, target_fraction: float, seed: int):
    rng = np.random.default_rng(seed)
    n_spk = max(2, n_emb // per_spk)
    n_emb = n_spk * per_spk
    chars = _id_chars(n_spk, per_spk)
    centres = rng.standard_normal((n_spk, dim)).astype(np.float32)
    emb = np.repeat(centres, per_spk, axis=0) + 2.0 * rng.standard_normal((n_emb, dim), dtype=np.float32)
    ids = np.array([bytes(r).decode() for r in chars])
    np.savez(root / "embeddings.npz", ids=ids, embeddings=emb)
    # Targets: two utterances of one speaker; nontargets: any two utterances. Repeated pairs are dropped.
    n_tar = int(n_trials * target_fraction)
    a = rng.integers(0, n_emb, n_tar)
    b = (a // per_spk) * per_spk + rng.integers(0, per_spk, n_tar)
    keys = np.r_[
        a.astype(np.int64) * n_emb + b,
        rng.integers(0, n_emb, n_trials + n_trials // 10) * n_emb + rng.integers(0, n_emb, n_trials + n_trials // 10),
    ]
    keys = np.unique(keys[(keys // n_emb) != (keys % n_emb)])
    keys = rng.permutation(keys)[:n_trials]
    a, b = keys // n_emb, keys % n_emb
    target = (a // per_spk) == (b // per_spk)
    label = np.zeros((2, 10), np.uint8)
    label[0, :10] = np.frombuffer(b"nontarget\n", np.uint8)
    label[1, :7] = np.frombuffer(b"target\n", np.uint8)
    with open(root / "trials", "wb") as f:
        for lo in range(0, len(keys), 1 << 20):
            sl = slice(lo, lo + (1 << 20))
            n = len(a[sl])
            sp = np.full((n, 1), 32, np.uint8)
            rows = np.concatenate([chars[a[sl]], sp, chars[b[sl]], sp, label[target[sl].astype(np.int64)]], axis=1)
            f.write(rows[rows != 0].tobytes())
    return len(keys), n_emb


def measure(root: Path, write: bool) -> dict:
    """One timed run (in this process): load, parse, score, metrics; wall and CPU seconds of each."""
    from speakerlab.scoring.metrics import verification_metrics
    from speakerlab.scoring.score import Scorer, read_embeddings

    wall, cpu, got = {}, {}, {}

    def stage(name, fn):
        w0, c0 = time.perf_counter(), time.process_time()
        got[name] = fn()
        # CPU seconds of all threads: on an idle machine the wall time is about this over the cores used.
        wall[name], cpu[name] = time.perf_counter() - w0, time.process_time() - c0

    stage("load", lambda: Scorer(*read_embeddings(root / "embeddings.npz")))
    scorer = got["load"]
    stage("parse", lambda: scorer.trial_list(root / "trials"))
    tl = got["parse"]
    stage("score", lambda: scorer.scores(tl))
    stage("metrics", lambda: verification_metrics(got["score"], tl.target, (0.01, 0.05)))
    wall["total"], cpu["total"] = sum(wall.values()), sum(cpu.values())
    if write:
        from speakerlab.scoring.report import write_scores

        stage("write_scores", lambda: write_scores(root / "out.scores", tl, got["score"]))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    m = got["metrics"]
    return {"wall": wall, "cpu": cpu, "rss_mb": rss, "eer": m["eer"], "min_dcf": m["min_dcf"], "n": len(tl)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10_000_000)
    ap.add_argument("--embeddings", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--utts-per-speaker", type=int, default=50)
    ap.add_argument("--target-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--write", action="store_true", help="also time writing the scores file")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # child mode: time the case in this directory
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(Path(args.measure), args.write)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_scoring_") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        n, m = generate(
            root, args.trials, args.embeddings, args.dim, args.utts_per_speaker, args.target_fraction, args.seed
        )
        size = (root / "trials").stat().st_size / 2**20
        print(
            f"generated {n} trials ({size:.0f} MB) over {m} embeddings of dim {args.dim} "
            f"in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        runs = []
        for r in range(args.repeats):
            cmd = [sys.executable, __file__, "--measure", str(root)] + (["--write"] if args.write else [])
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            runs.append(res)
            parts = ", ".join(f"{k} {v:.2f} ({res['cpu'][k]:.2f})" for k, v in res["wall"].items())
            print(
                f"run {r + 1}: wall (CPU) s: {parts}; peak RSS {res['rss_mb']:.0f} MB; EER {res['eer'] * 100:.2f}% "
                f"minDCF {', '.join(f'{v:.4f}' for v in res['min_dcf'].values())}",
                flush=True,
            )
        totals = [r["wall"]["total"] for r in runs]
        if len(runs) > 1:
            print(
                f"total over {len(runs)} runs: best {min(totals):.2f} s, median {float(np.median(totals)):.2f} s, "
                f"worst {max(totals):.2f} s"
            )
        print(f"{n} trials over {m} embeddings: {min(totals):.2f} s, peak RSS {max(r['rss_mb'] for r in runs):.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
