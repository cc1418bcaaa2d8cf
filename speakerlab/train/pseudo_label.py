"""Pseudo-labels for unlabelled training data: cluster its embeddings, write a labelled data dir.

    speakerlab-pseudo-label --embeddings exp/dino/embeddings/train.npz --data data/train_unlabelled \
        --out data/train_pl1 [--clusters 400 | --estimate] [--drop 0.2] [--true-labels data/train/utt2spk]

Clustering (spherical k-means on the L2-normalised embeddings, cosine): k-means (scikit-learn) on a random sample
of `--sample` utterances, seeded by k-means++ on at most max(SEED_ROWS, 3 k) of them, then every utterance assigned
to its nearest centroid in blocks of `BLOCK` rows (one matrix product each): memory O(block x k), time O(N x k x D).
1 M utterances into 6,000 clusters take about 5 minutes on a 2-core CPU (bench/pseudo_label_scale.py).

The count is `--clusters`, or with `--estimate` the number of clusters of average-linkage AHC (scipy) on a sample of
`--estimate-sample` utterances cut at cosine distance `--threshold`, scaled from the sample to the whole set: a
random n of N utterances holds only some speakers (at 1 M utterances of 6 k speakers, 5,000 hold about 3.4 k of
them), so the count S is the one whose expected number of speakers in the sample, S (1 - (1 - n/N)^(N/S)), is the
c clusters found (speakers of equal size assumed; unequal ones make S a little low). The printed line says what
was found and what it was scaled to.

Confidence rule: an utterance's margin is its cosine to its own centroid minus that to the second nearest;
the round(`--drop` x N) utterances with the lowest margins are dropped (they sit between two clusters), then every
cluster left with fewer than `--min-size` utterances. The rest get `utt2spk` lines `<utt> pl<cluster>`, with
their wav.scp and spk2utt lines; the data dir is then prepared as any (speakerlab-prepare). Written again over an
earlier one (another start, count or drop), it keeps nothing of it that could disagree.

With `--true-labels` (an utt2spk of the same utterances; for measuring only) the purity (the share of
utterances in their cluster's majority speaker) and the NMI are printed for all utterances and for the kept.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from speakerlab.commands import CommandParser, run_command
from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.dataio.tables.lists import ListError, load_data_dir, read_utt2spk, write_lists
from speakerlab.outputs import OutputError, check_folder_output

BLOCK = 8192  # rows per assignment block
# k-means++ seeds come from at most max(SEED_ROWS, 3 k) sampled rows: its cost is rows x k x D x ~log k, and on
# all 200 k rows of a 1 M-utterance set at k = 6,000 it had not finished in 26 min; from 18 k rows it takes 43 s,
# the 35 Lloyd iterations on the 200 k after it 114 s (bench/RESULTS.md, "Pseudo-labels of 1 M utterances").
SEED_ROWS = 10_000


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length `(N, D) -> (N, D)` float32."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def estimate_count(x: np.ndarray, threshold: float, sample: int, seed: int) -> tuple:
    """(the count for all of `x`, the clusters found, the rows clustered): average-linkage AHC on cosine distance cut
    at `threshold`, on at most `sample` rows of the unit embeddings `x (N, D)`, scaled by `whole_set_count`."""
    from scipy.cluster.hierarchy import fcluster, linkage

    rows = np.random.default_rng(seed).permutation(len(x))[:sample]
    tree = linkage(x[rows], method="average", metric="cosine")
    found = int(fcluster(tree, t=threshold, criterion="distance").max())
    return whole_set_count(found, len(rows), len(x)), found, len(rows)


def whole_set_count(found: int, n: int, total: int) -> int:
    """The speakers S of `total` utterances (equal shares) whose random `n` are expected to hold `found` of them:
    S (1 - (1 - n/total)^(total/S)) = found, its root (scipy's brentq; the left side grows with S); `total` when even
    that is short of `found` (nearly every sampled utterance a cluster of its own: the sample says little)."""
    from scipy.optimize import brentq

    if n >= total:
        return found

    def short(s: float) -> float:
        return s * -np.expm1((total / s) * np.log1p(-n / total)) - found

    return total if short(total) <= 0 else int(round(brentq(short, found, total)))


def kmeans_centroids(x: np.ndarray, k: int, sample: int, seed: int) -> np.ndarray:
    """Unit centroids `(k, D)` of k-means on at most `sample` rows of the unit embeddings `x (N, D)`; its k-means++
    seeds drawn from the first max(SEED_ROWS, 3 k) of those rows (module doc)."""
    try:
        from sklearn.cluster import KMeans, kmeans_plusplus
    except ImportError:
        raise ImportError("speakerlab-pseudo-label needs scikit-learn (pip install scikit-learn)") from None
    rows = np.random.default_rng(seed).permutation(len(x))[: max(sample, k)]
    fit = x[rows]
    seed_rows = max(SEED_ROWS, 3 * k)
    init = "k-means++" if len(fit) <= seed_rows else kmeans_plusplus(fit[:seed_rows], k, random_state=seed)[0]
    km = KMeans(n_clusters=k, init=init, n_init=1, random_state=seed).fit(fit)
    return unit(km.cluster_centers_)


def assign(x: np.ndarray, centroids: np.ndarray) -> tuple:
    """(nearest centroid (N,), its cosine (N,), cosine minus the second nearest's (N,)) in blocks of BLOCK rows."""
    best, cos, margin = (np.empty(len(x), dtype=np.int64), np.empty(len(x), np.float32), np.empty(len(x), np.float32))
    for lo in range(0, len(x), BLOCK):
        sim = x[lo : lo + BLOCK] @ centroids.T
        top2 = np.partition(-sim, 1, axis=1)[:, :2] if sim.shape[1] > 1 else np.concatenate([-sim, -sim + 2], 1)
        best[lo : lo + BLOCK] = sim.argmax(axis=1)
        cos[lo : lo + BLOCK] = -top2[:, 0]
        margin[lo : lo + BLOCK] = top2[:, 1] - top2[:, 0]
    return best, cos, margin


def keep_confident(labels: np.ndarray, margin: np.ndarray, drop: float, min_size: int) -> np.ndarray:
    """Which utterances keep their pseudo-label `(N,) bool`: the confidence rule of the module doc."""
    keep = np.ones(len(labels), dtype=bool)
    keep[np.argsort(margin, kind="stable")[: int(round(drop * len(labels)))]] = False
    sizes = np.bincount(labels[keep], minlength=labels.max() + 1)
    return keep & (sizes[labels] >= min_size)


def purity(clusters: np.ndarray, truth: np.ndarray) -> float:
    """Share of utterances whose cluster's most frequent true speaker is theirs."""
    pairs = np.unique(np.stack([clusters, truth]), axis=1, return_counts=True)
    best: Dict[int, int] = {}
    for (c, _), n in zip(pairs[0].T, pairs[1]):
        best[int(c)] = max(best.get(int(c), 0), int(n))
    return sum(best.values()) / len(clusters)


@dataclass
class Outcome:
    clusters: int
    kept: int
    total: int
    measured: List[str]


def pseudo_label(args) -> Outcome:
    out = check_folder_output(args.out)
    if Path(args.out).resolve() == Path(args.data).resolve():  # its lists would replace those of the utterances
        raise OutputError(f"--out {args.out} is the --data dir: give another folder for the labelled data dir")
    ids, emb = read_embeddings(args.embeddings)
    data = load_data_dir(args.data, need_speakers=False)
    missing = sorted(set(data.utts) - set(ids))
    if missing:
        raise ListError(
            f"{args.embeddings}: no embedding for '{missing[0]}' of {Path(args.data) / 'wav.scp'} "
            f"({len(missing)} missing); embed the whole data dir"
        )
    truth = true_speakers(args.true_labels, data.utts) if args.true_labels else None  # its errors before any write
    index = {u: i for i, u in enumerate(ids)}
    x = emb[[index[u] for u in data.utts]]
    del emb  # at most two N x D copies alive at once (1 M x 192: 0.77 GB each), not three
    x = unit(x)
    k = args.clusters
    if args.estimate:
        k, found, n = estimate_count(x, args.threshold, args.estimate_sample, args.seed)
        sampled = "sampled " if n < len(x) else ""
        if found < 2:  # one cluster (a cut above every distance, or collapsed embeddings): nothing to train on
            raise ListError(
                f"--estimate: AHC at --threshold {args.threshold} made 1 cluster of {n} {sampled}utterances: "
                "lower --threshold or give --clusters"
            )
        if found > n / 2:  # fewer than two utterances per cluster: nothing to scale from, nor to train on
            raise ListError(
                f"--estimate: AHC at --threshold {args.threshold} made {found} clusters of {n} {sampled}utterances, "
                "too few utterances per cluster to estimate the count: raise --threshold"
                + (", raise --estimate-sample" if n < len(x) else "")
                + " or give --clusters"
            )
        print(
            f"pseudo-label: AHC found {found} clusters in {n} of {len(x)} utterances: {k} for all of them",
            file=sys.stderr,
        )
    if not 2 <= k <= len(x):
        raise ListError(f"{k} clusters for {len(x)} utterances: give --clusters between 2 and {len(x)}")
    labels, _, margin = assign(x, kmeans_centroids(x, k, args.sample, args.seed))
    keep = keep_confident(labels, margin, args.drop, args.min_size)
    left = len(np.unique(labels[keep]))
    if left < 2:  # nothing a margin loss could learn from: say so before writing a data dir that training refuses
        raise ListError(
            f"{k} clusters of {len(x)} utterances leave {left} cluster(s) of --min-size {args.min_size} or more after "
            f"--drop {args.drop:g}: lower --min-size or --drop, or change the count"
        )
    utts = [u for u, kept in zip(data.utts, keep) if kept]
    chosen = labels[keep]
    write_lists(out, utts, data.wav, {u: f"pl{c:06d}" for u, c in zip(utts, chosen)})
    measured = []
    if truth is not None:
        measured = [measure("all", labels, truth), measure("kept", chosen, truth[keep])]
    return Outcome(len(np.unique(chosen)), int(keep.sum()), len(x), measured)


def true_speakers(path, utts: List[str]) -> np.ndarray:
    """The speaker of each of `utts` in the utt2spk `path` as a number `(N,)`; a ListError naming it when one lacks."""
    truth_of = {u: s for u, (_, s) in read_utt2spk(path).items()}
    lacking = [u for u in utts if u not in truth_of]
    if lacking:
        raise ListError(f"{path}: no speaker for '{lacking[0]}' ({len(lacking)} utterances)")
    names = {s: i for i, s in enumerate(sorted(set(truth_of.values())))}
    return np.array([names[truth_of[u]] for u in utts])


def measure(what: str, clusters: np.ndarray, truth: np.ndarray) -> str:
    from sklearn.metrics import normalized_mutual_info_score

    nmi = normalized_mutual_info_score(truth, clusters)
    return (
        f"{what}: {len(clusters)} utterances, {len(np.unique(truth))} true speakers in {len(np.unique(clusters))} "
        f"clusters: purity {purity(clusters, truth) * 100:.2f}%, NMI {nmi:.4f}"
    )


def main(argv: Optional[list] = None) -> int:
    ap = CommandParser(prog="speakerlab-pseudo-label", description=__doc__.split("\n")[0])
    ap.add_argument("--embeddings", required=True, help="embeddings .npz of --data (speakerlab-extract)")
    ap.add_argument("--data", required=True, help="the data dir the embeddings are of (its wav.scp)")
    ap.add_argument("--out", required=True, help="the labelled data dir to write (wav.scp, utt2spk)")
    count = ap.add_mutually_exclusive_group(required=True)
    count.add_argument("--clusters", type=int, help="the number of clusters (pseudo-speakers)")
    count.add_argument("--estimate", action="store_true", help="estimate it by AHC on a sample, scaled (module doc)")
    ap.add_argument("--threshold", type=float, default=0.5, help="--estimate: AHC cut, cosine distance")
    ap.add_argument("--estimate-sample", type=int, default=5000, help="--estimate: utterances clustered by AHC")
    ap.add_argument("--sample", type=int, default=200000, help="utterances k-means is fitted on")
    ap.add_argument("--drop", type=float, default=0.2, help="fraction of lowest-margin utterances dropped")
    ap.add_argument("--min-size", type=int, default=2, help="clusters left smaller than this are dropped")
    ap.add_argument("--true-labels", help="utt2spk of the same utterances: purity and NMI printed (measuring only)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the k-means sample and initialisation")
    args = ap.parse_args(argv)
    if not 0 <= args.drop < 1:
        ap.error(f"--drop must be in [0, 1), got {args.drop}")
    if args.clusters is not None and args.clusters < 2:
        ap.error(f"--clusters must be 2 or more, got {args.clusters}")
    if not 0 < args.threshold < 2:  # a cosine distance: 0 (same direction) to 2 (opposite)
        ap.error(f"--threshold must be a cosine distance in (0, 2), got {args.threshold}")
    for name, value, least in (
        ("--estimate-sample", args.estimate_sample, 2),
        ("--sample", args.sample, 1),
        ("--min-size", args.min_size, 1),
    ):
        if value < least:
            ap.error(f"{name} must be {least} or more, got {value}")

    def work():
        o = pseudo_label(args)
        print(
            f"pseudo-label: {o.kept} of {o.total} utterances kept in {o.clusters} clusters -> {args.out}",
            file=sys.stderr,
        )
        for line in o.measured:
            print(f"pseudo-label: {line}")

    return run_command(work, (ListError, ImportError, OutputError))


if __name__ == "__main__":
    sys.exit(main())
