"""`speakerlab-pseudo-label` at VoxCeleb2-and-beyond scale: its wall time and peak RSS on N utterances of S speakers,
and the purity / NMI of what it writes, through the real command (`/usr/bin/time -v`).

    python bench/pseudo_label_scale.py --utts 1000000 --speakers 6000 --work /tmp/pl_scale
    python bench/pseudo_label_scale.py --utts 1000000 --speakers 6000 --work /tmp/pl_scale --estimate

The embeddings are made up (no model can embed 1 M utterances on this CPU): S speaker directions drawn at random in
`--dim` dimensions, each utterance its speaker's direction plus isotropic Gaussian noise of norm about `--noise`, so
that two utterances of one speaker have a cosine of about 1 / (1 + noise^2) and of two speakers about 0. Speakers
own unequal shares, as in VoxCeleb (log-normal, sigma 0.5: the largest about 5x the smallest). wav.scp names files
that do not exist: the command reads the lists, not the audio. The data dir, the embeddings (speakerlab's .npz) and
the true utt2spk are made once in `--work` and reused by later runs of the same size.
Prints the command, the machine, and one line of figures per run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scoring import machine  # noqa: E402  (bench/scoring.py: cores, CPU model, load average)

from speakerlab.dataio.tables.embeddings import write_embeddings  # noqa: E402

BLOCK = 100_000  # utterances made at a time (float32)


def make(work: Path, utts: int, speakers: int, dim: int, noise: float, seed: int) -> Path:
    """The data dir `work/data` (wav.scp), `work/emb.npz` and `work/truth/utt2spk`, unless there already."""
    tag = work / f"made-{utts}-{speakers}-{dim}-{noise}-{seed}"
    if tag.exists():
        return tag
    g = np.random.default_rng(seed)
    shares = np.exp(0.5 * g.standard_normal(speakers))
    who = np.sort(g.choice(speakers, size=utts, p=shares / shares.sum()))
    centres = g.standard_normal((speakers, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    emb = np.empty((utts, dim), dtype=np.float32)
    for lo in range(0, utts, BLOCK):
        part = who[lo : lo + BLOCK]
        emb[lo : lo + BLOCK] = centres[part] + noise / np.sqrt(dim) * g.standard_normal((len(part), dim), np.float32)
    ids = [f"spk{s:06d}-utt{i:08d}" for i, s in enumerate(who)]
    for d in ("data", "truth"):
        (work / d).mkdir(parents=True, exist_ok=True)
    (work / "data" / "wav.scp").write_text("".join(f"{u} /nonexistent/{u}.wav\n" for u in ids))
    (work / "truth" / "utt2spk").write_text("".join(f"{u} spk{s:06d}\n" for u, s in zip(ids, who)))
    write_embeddings(work / "emb.npz", ids, emb)
    tag.write_text("")
    return tag


def run(cmd: list) -> dict:
    """`cmd` under /usr/bin/time -v -> wall seconds, peak RSS (MB) and the command's own output."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1)) / 1024
    said = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("pseudo-label:")]
    return {"wall": wall, "rss": rss, "said": said}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--utts", type=int, default=1_000_000)
    ap.add_argument("--speakers", type=int, default=6000)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--noise", type=float, default=1.0, help="within-speaker noise norm (the direction's is 1)")
    ap.add_argument("--clusters", type=int, help="given to the command (default: --speakers)")
    ap.add_argument("--estimate", action="store_true", help="the command estimates the count (--estimate)")
    ap.add_argument("--sample", type=int, default=200_000, help="the command's --sample (k-means fit)")
    ap.add_argument("--threshold", type=float, default=0.7, help="the command's --threshold (with --estimate)")
    ap.add_argument("--estimate-sample", type=int, default=5000, help="the command's --estimate-sample")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"command: python bench/pseudo_label_scale.py {' '.join(sys.argv[1:])}")
    print(f"machine: {machine()}")
    t0 = time.perf_counter()
    make(args.work, args.utts, args.speakers, args.dim, args.noise, args.seed)
    print(f"made {args.utts} utterances of {args.speakers} speakers in {time.perf_counter() - t0:.0f} s (or reused)")
    estimate = ["--estimate", "--threshold", str(args.threshold), "--estimate-sample", str(args.estimate_sample)]
    count = estimate if args.estimate else ["--clusters", str(args.clusters or args.speakers)]
    out = args.work / ("pl_estimate" if args.estimate else "pl_given")
    cmd = ["speakerlab-pseudo-label", "--embeddings", str(args.work / "emb.npz"), "--data", str(args.work / "data")]
    cmd += ["--out", str(out), *count, "--sample", str(args.sample)]
    cmd += ["--true-labels", str(args.work / "truth" / "utt2spk")]
    shutil.rmtree(out, ignore_errors=True)  # the command writes into a new folder only
    print(" ".join(cmd))
    r = run(cmd)
    for line in r["said"]:
        print("  " + line)
    print(f"wall {r['wall']:.0f} s, peak RSS {r['rss']:.0f} MB")


if __name__ == "__main__":
    main()
