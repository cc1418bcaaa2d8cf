"""Clustering time and peak memory of long recordings, and what capping the clustered units (`max_units`) costs
in DER, on simulated sub-segment embeddings (no audio: the clustering stage alone).

    OMP_NUM_THREADS=1 python bench/diarization_scale.py --hours 3 --compare-minutes 30 --recordings 3

A recording: speech turns of 1-12 s, each of another of `--speakers` speakers, 0-1 s apart, cut into the
pipeline's sub-segments (1.5 s windows every 0.75 s); a sub-segment's embedding is its speaker's direction plus
Gaussian noise (`--noise` per unit length: at 1.0 a sub-segment's cosine to its speaker's centre is about 0.7, as
a small model's are on the mini conversations), `--dim` wide. Printed: sub-segments, clustering seconds and the
process's peak RSS for the long recording (capped: the uncapped affinity of 3 hours alone would be N^2 x 8 bytes,
1.3 GB, and its `argsort` as much again); then for `--recordings` recordings of `--compare-minutes` minutes, the
DER (collar 0.25, pyannote.metrics) of capped and uncapped clustering against the simulated truth.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np

from speakerlab.dataio.tables.rttm import Turn
from speakerlab.diarization.clustering.cluster import MAX_UNITS, SpeakerCount, cluster
from speakerlab.diarization.der import der
from speakerlab.diarization.pipeline import labels_to_turns, subsegments


def recording(seed: int, seconds: float, speakers: int, dim: int, noise: float):
    """(pieces [(region, start, end)], embeddings (N, dim) float32, reference turns)."""
    g = np.random.default_rng(seed)
    centres = g.standard_normal((speakers, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    regions, owners, t, who = [], [], 0.0, 0
    while t < seconds:
        t += g.uniform(0.0, 1.0)
        length = g.uniform(1.0, 12.0)
        who = (who + 1 + int(g.integers(speakers - 1))) % speakers
        regions.append((t, t + length))
        owners.append(who)
        t += length
    pieces = subsegments(regions, 1.5, 0.75)
    truth = np.array([owners[r] for r, _, _ in pieces])
    emb = centres[truth] + noise / np.sqrt(dim) * g.standard_normal((len(pieces), dim))
    ref = [Turn(s, e, f"s{k}") for (s, e), k in zip(regions, owners)]
    return pieces, emb.astype(np.float32), ref


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--compare-minutes", type=float, default=30.0)
    ap.add_argument("--recordings", type=int, default=3)
    ap.add_argument("--speakers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=192)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--max-units", type=int, default=MAX_UNITS)
    ap.add_argument("--method", default="spectral")
    args = ap.parse_args()
    print("command: python " + " ".join(sys.argv))
    count = SpeakerCount(1, 20)
    cluster(np.eye(8, 4, dtype=np.float32), count, args.method)  # imports (scipy, sklearn) outside the timing

    pieces, emb, _ = recording(0, args.hours * 3600, args.speakers, args.dim, args.noise)
    base = peak_rss_mb()
    t0 = time.perf_counter()
    labels = cluster(emb, count, args.method, max_units=args.max_units)
    took = time.perf_counter() - t0
    print(
        f"{args.hours:g} h: {len(pieces)} sub-segments, max_units {args.max_units}: clustering {took:.1f} s, "
        f"{len(np.unique(labels))} speakers (true {args.speakers}), peak RSS {peak_rss_mb():.0f} MB "
        f"(before clustering {base:.0f} MB)"
    )

    rows = {"capped": [], "uncapped": []}
    for seed in range(1, args.recordings + 1):
        pieces, emb, ref = recording(seed, args.compare_minutes * 60, args.speakers, args.dim, args.noise)
        for name, cap in (("capped", args.max_units), ("uncapped", 0)):
            t0 = time.perf_counter()
            labels = cluster(emb, count, args.method, max_units=cap)
            took = time.perf_counter() - t0
            turns = labels_to_turns(pieces, labels)
            d = der({f"r{seed}": ref}, {f"r{seed}": turns})["der"]
            rows[name].append((d, took, len(np.unique(labels))))
            print(
                f"{args.compare_minutes:g} min #{seed}: {len(pieces)} sub-segments, {name}: DER {100 * d:.2f} %, "
                f"{len(np.unique(labels))} speakers, clustering {took:.1f} s"
            )
    for name, r in rows.items():
        print(
            f"mean over {len(r)}: {name}: DER {100 * np.mean([x[0] for x in r]):.2f} %, "
            f"clustering {np.mean([x[1] for x in r]):.1f} s"
        )


if __name__ == "__main__":
    main()
