"""Average-linkage AHC under cannot-link constraints: the local speakers of one segmentation window are
different people, so no cluster may hold two of them.

    labels = constrained_ahc(x, groups, SpeakerCount(1, 20), threshold=0.6)   # x (N, D) unit rows, groups (N,)

Rows of the same `groups` value (the window they come from) never share a cluster: the distance between two
clusters is the mean cosine distance of their rows (average linkage, updated by Lance-Williams), and infinite
where the two hold rows of one group. Clusters join, closest first, while their distance is at most `threshold`;
the count that gives is then moved into [count.min, count.max] by joining further or undoing joins (the merges are
replayed from the start up to the count wanted). A count below the largest number of rows of one group cannot be
reached (those rows stay apart): the fewest clusters the constraints allow is returned then.

Memory O(N^2), time O(N^2) per join (N <= a few thousand: speakerlab.diarization.clustering.cluster caps N).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from speakerlab.diarization.clustering.cluster import (
    VBX_DEFAULTS,
    SpeakerCount,
    first_appearance,
    normalize,
    vbx_clusters,
)
from speakerlab.diarization.clustering.plda import PLDA
from speakerlab.diarization.clustering.vbx import VBxParams


def merges(x: np.ndarray, groups: np.ndarray) -> List[Tuple[int, int, float]]:
    """Unit rows `(N, D)` and their `(N,)` groups -> the joins, in order: (kept cluster, joined cluster, distance),
    clusters named by their first row; it stops when every pair left is forbidden."""
    n = len(x)
    dist = np.clip(1.0 - x @ x.T, 0.0, 2.0)
    forbid = groups[:, None] == groups[None, :]
    dist[forbid] = np.inf  # the diagonal too
    size = np.ones(n)
    alive = np.ones(n, bool)
    out = []
    for _ in range(n - 1):
        flat = int(np.argmin(dist))
        a, b = divmod(flat, n)
        d = float(dist[a, b])
        if not np.isfinite(d):
            break
        a, b = min(a, b), max(a, b)
        out.append((a, b, d))
        # Lance-Williams for average linkage; a forbidden pair stays forbidden (inf times a weight is inf).
        merged = (size[a] * dist[a] + size[b] * dist[b]) / (size[a] + size[b])
        merged[~alive] = np.inf
        merged[a] = np.inf
        dist[a], dist[:, a] = merged, merged
        dist[b], dist[:, b] = np.inf, np.inf
        size[a] += size[b]
        alive[b] = False
    return out


def constrained_ahc(x: np.ndarray, groups: np.ndarray, count: SpeakerCount, threshold: float) -> np.ndarray:
    """Unit rows `(N, D)`, their `(N,)` groups -> `(N,)` labels in order of first appearance (module docstring)."""
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    joins = merges(np.asarray(x, dtype=np.float64), np.asarray(groups))
    below = [d <= threshold for _, _, d in joins]
    at_threshold = n - (below.index(False) if False in below else len(below))  # the joins up to the first beyond
    k = min(max(at_threshold, count.min), count.max)
    k = min(max(k, n - len(joins)), n)  # within what the constraints allow
    parent = np.arange(n)
    for a, b, _ in joins[: n - k]:
        parent[parent == b] = a
    return first_appearance(parent)


def cluster_constrained(
    emb: np.ndarray,
    groups: np.ndarray,
    count: SpeakerCount,
    method: str,
    threshold: float,
    plda: Optional[PLDA] = None,
    params: VBxParams = VBX_DEFAULTS,
) -> np.ndarray:
    """`(N, D)` embeddings and their `(N,)` groups -> `(N,)` labels in order of first appearance. `method` "ahc":
    `constrained_ahc` at `threshold`; "vbx": VBx on `plda` started from `constrained_ahc` at
    `params.init_threshold` (VBx itself knows no groups: the caller keeps a group's rows apart afterwards)."""
    x = normalize(emb)
    if method == "ahc":
        return constrained_ahc(x, groups, count, threshold)
    if method != "vbx" or plda is None:
        raise ValueError(f"cannot-link clustering is ahc or vbx (with a PLDA), got {method!r}")
    if len(x) < 2:
        return np.zeros(len(x), dtype=np.int64)
    init = constrained_ahc(x, groups, SpeakerCount(1, len(x)), params.init_threshold)
    return first_appearance(vbx_clusters(x, count, plda, params, init))
