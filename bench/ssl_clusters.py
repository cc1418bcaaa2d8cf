"""How well an embedding set separates speakers before any clustering choice: purity and NMI of k-means (the one of
speakerlab-pseudo-label) and of two AHC linkages at the true speaker count, and how often an utterance's nearest
neighbour is of its own speaker.

    python bench/ssl_clusters.py EMBEDDINGS.npz UTT2SPK [--clusters N]

EMBEDDINGS: speakerlab-extract's output for a data dir; UTT2SPK: its true labels (measuring only). Used on
egs/mini_ssl's DINO embeddings of the unlabelled training set (bench/RESULTS.md, "Self-supervised training").
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("embeddings")
    ap.add_argument("utt2spk")
    ap.add_argument("--clusters", type=int, default=0, help="clusters (default: the true speaker count)")
    args = ap.parse_args(argv)
    from scipy.cluster.hierarchy import fcluster, linkage
    from sklearn.metrics import normalized_mutual_info_score

    from speakerlab.dataio.tables.embeddings import read_embeddings
    from speakerlab.dataio.tables.lists import read_utt2spk
    from speakerlab.train.pseudo_label import assign, kmeans_centroids, purity, unit

    ids, emb = read_embeddings(args.embeddings)
    speaker_of = {u: s for u, (_, s) in read_utt2spk(args.utt2spk).items()}
    names = {s: i for i, s in enumerate(sorted(set(speaker_of.values())))}
    truth = np.array([names[speaker_of[u]] for u in ids])
    x = unit(emb)  # (N, D)
    k = args.clusters or len(names)
    print(f"command: python bench/ssl_clusters.py {' '.join(sys.argv[1:])}")
    print(f"machine: {platform.machine()} {platform.processor() or ''}; {len(x)} utterances, {len(names)} speakers")
    results = {"k-means (speakerlab-pseudo-label)": assign(x, kmeans_centroids(x, k, len(x), 0))[0]}
    results["AHC average linkage, cosine"] = fcluster(linkage(x, "average", metric="cosine"), k, "maxclust")
    results["AHC Ward, unit vectors"] = fcluster(linkage(x, "ward"), k, "maxclust")
    for name, labels in results.items():
        nmi = normalized_mutual_info_score(truth, labels)
        print(f"  {name:36s} {k} clusters: purity {purity(labels, truth) * 100:.1f}%, NMI {nmi:.3f}")
    t0 = time.time()
    sim = x @ x.T
    np.fill_diagonal(sim, -2.0)  # never its own neighbour
    same = float(np.mean(truth[sim.argmax(axis=1)] == truth))
    print(f"  nearest neighbour of the same speaker: {same * 100:.1f}% ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
