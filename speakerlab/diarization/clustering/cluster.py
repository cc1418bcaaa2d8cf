"""Speaker clustering of sub-segment embeddings: `(N, D)` -> `(N,)` integer labels, numbered by first
appearance (the first segment is speaker 0).

    labels = cluster(emb, SpeakerCount(min=1, max=20), method="spectral", seed=0)
    labels = cluster(emb, SpeakerCount.exactly(3), method="ahc")

spectral: the cosine affinities of the L2-normalised embeddings, each row pruned to its `pruning` x N
    strongest neighbours (at least `MIN_NEIGHBOURS`, at most `MAX_NEIGHBOURS`; negative ones dropped),
    symmetrised; the normalised graph Laplacian's smallest eigenvalues (`scipy.linalg.eigh`); the speaker count
    k is the largest eigengap lambda_k - lambda_{k-1} within the allowed range (or the count given); k-means
    (`sklearn.cluster.KMeans`, `seed`) on the rows of the first k eigenvectors, row-normalised.
ahc: average-linkage agglomerative clustering on cosine distance (`scipy.cluster.hierarchy`), cut at
    distance `threshold` (1 - cosine), or at the count given; a cut outside [min, max] is moved to the
    nearest bound.
vbx: AHC at `VBxParams.init_threshold` starts VBx on the coordinates of a PLDA (vbx.py, plda.py); the speakers
    it keeps are the count, unless outside [min, max] (or not the count given): then the speakers of most
    mass stay, or AHC cut at the minimum starts again, and a constrained assignment gives each its segments.

Both are deterministic for a given input and seed. After estimating the count (not when it is given),
clusters whose centroids are more alike than `merge_cosine` are merged, down to the minimum: the
eigengap cannot say "one speaker" reliably when every eigenvalue is small.

Long recordings: the affinity is N x N and `eigh` O(N^3), so 3 hours (~12 k sub-segments) would take
gigabytes and many minutes. Beyond `max_units` sub-segments, runs of ceil(N / max_units) neighbours (in time
order) make one unit (for VBx their mean, for spectral and AHC their first sub-segment), the units are clustered as
above, and every sub-segment then takes the speaker whose centroid (the mean of that speaker's sub-segments) is
nearest by cosine (VBx: see `resegment` below): the speaker changes inside a unit are found again at sub-segment
resolution. Should that empty a speaker, each sub-segment keeps its unit's. Memory is O(max_units^2 + N x D), time
O(max_units^3 + N x D x k) (bench/diarization_scale.py). Spectral on first sub-segments, not means: on twelve
30-minute conversations 20.18 % against 23.65 % (uncapped 20.65 %), on a 3-hour one 7 speakers for 8 where means
gave 1.
VBx too runs on the units, not only its AHC start: on every sub-segment of a 3-hour conversation (11,160) it kept 14
speakers for 8 (DER 35.1 %), on units of 8 it kept 7 (DER 18.0 %; bench/RESULTS.md, the 3-hour recording). Then
`resegment` runs VBx once more on every sub-segment, started from the units' speakers (so it can drop one, never add
one): on twelve 30-minute conversations DER 24.12 -> 22.28 %, where clustering every sub-segment gives 22.52 %
(bench/RESULTS.md, "Capped VBx, then every sub-segment"). Its cost is O(N x S x d) per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from speakerlab.diarization.clustering.plda import PLDA
from speakerlab.diarization.clustering.vbx import VBxParams, assign, one_hot, vbx

METHODS = ("spectral", "ahc", "vbx")
VBX_DEFAULTS = VBxParams()
MIN_NEIGHBOURS = 6  # spectral pruning keeps at least this many affinities per row
# ... and at most this many: a fraction of N grows with the recording, and at 1,500 units 10 % (150 neighbours, more
# than a speaker's share of a long conversation) made the eigengap say one speaker on 30-minute and 3-hour
# conversations (bench/RESULTS.md, the 3-hour recording). 30 leaves every recording of <= 300 sub-segments
# (the 90-s conversations the defaults were chosen on) as it was.
MAX_NEIGHBOURS = 30
MAX_UNITS = 1500  # clustered at most; more sub-segments are grouped into this many units (module docstring)


@dataclass(frozen=True)
class SpeakerCount:
    """How many speakers a recording may have: `min` <= k <= `max` (`min == max`: exactly that many)."""

    min: int = 1
    max: int = 20

    def __post_init__(self):
        if not 1 <= self.min <= self.max:
            raise ValueError(f"speaker count bounds need 1 <= min <= max, got min {self.min}, max {self.max}")

    @classmethod
    def exactly(cls, n: int) -> "SpeakerCount":
        return cls(n, n)

    @property
    def fixed(self) -> bool:
        return self.min == self.max


def normalize(emb: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float64)."""
    emb = np.asarray(emb, dtype=np.float64)
    return emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)


def first_appearance(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0, 1, ... in the order they first occur."""
    _, first = np.unique(labels, return_index=True)
    order = labels[np.sort(first)]
    mapping = {int(old): new for new, old in enumerate(order)}
    return np.array([mapping[int(x)] for x in labels], dtype=np.int64)


def pruned_affinity(x: np.ndarray, pruning: float) -> np.ndarray:
    """`(N, D)` unit rows -> `(N, N)` symmetric non-negative affinity: each row's cosines kept for its
    ceil(pruning x N) strongest (within [MIN_NEIGHBOURS, MAX_NEIGHBOURS]), the rest zero."""
    n = len(x)
    sim = np.clip(x @ x.T, 0.0, None)
    keep = min(n, max(min(int(np.ceil(pruning * n)), MAX_NEIGHBOURS), MIN_NEIGHBOURS))
    cut = np.argsort(-sim, axis=1, kind="stable")[:, keep:]
    np.put_along_axis(sim, cut, 0.0, axis=1)
    return 0.5 * (sim + sim.T)


def spectral(x: np.ndarray, count: SpeakerCount, seed: int, pruning: float) -> np.ndarray:
    """Unit rows `(N, D)` (N >= 2) -> labels; see the module docstring."""
    from scipy.linalg import eigh
    from scipy.sparse.csgraph import laplacian

    try:
        from sklearn.cluster import KMeans
    except ImportError as e:  # the torch-free install has it only with its [diarization] extra
        raise ImportError(
            f"spectral clustering needs scikit-learn ({e}): pip install scikit-learn "
            "(the torch-free install: pip install './runtime[diarization]'), or use --clustering ahc"
        ) from None

    n = len(x)
    hi = min(count.max, n - 1)
    lo = min(count.min, hi)
    lap = laplacian(pruned_affinity(x, pruning), normed=True)
    values, vectors = eigh(lap, subset_by_index=[0, hi])
    if count.fixed:
        k = hi
    else:
        gaps = np.diff(values)  # gaps[k - 1] = lambda_k - lambda_{k-1}: the gap after k clusters
        k = lo + int(np.argmax(gaps[lo - 1 : hi]))
    if k == 1:
        return np.zeros(n, dtype=np.int64)
    rows = normalize(vectors[:, :k])
    return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(rows).astype(np.int64)


def ahc(x: np.ndarray, count: SpeakerCount, threshold: float) -> np.ndarray:
    """Unit rows `(N, D)` (N >= 2) -> labels; see the module docstring."""
    from scipy.cluster.hierarchy import fcluster, linkage

    tree = linkage(x, method="average", metric="cosine")
    labels = fcluster(tree, t=threshold, criterion="distance")
    k = len(np.unique(labels))
    if count.fixed or not count.min <= k <= count.max:
        labels = fcluster(tree, t=min(max(k, count.min), count.max), criterion="maxclust")
    return labels.astype(np.int64) - 1


def vbx_clusters(
    x: np.ndarray, count: SpeakerCount, plda: PLDA, params: VBxParams, init: Optional[np.ndarray] = None
) -> np.ndarray:
    """Unit rows `(N, D)` (N >= 2) -> labels; see the module docstring. `init`: the (N,) labels 0..S-1 VBx
    starts from instead of AHC's (speakerlab.diarization.clustering.constrained gives some)."""
    n = len(x)
    z = plda.project(x)
    if init is None:
        init = ahc(x, SpeakerCount(1, n), params.init_threshold)
    gamma, _ = vbx(z, plda.phi, one_hot(init, init.max() + 1, params.smoothing), params)
    labels = np.argmax(gamma, axis=1)
    found = len(np.unique(labels))
    target = min(max(found, count.min), count.max, n)
    if target == found:
        return labels
    if target < found:  # the speakers of most mass stay
        start = np.argmax(gamma[:, np.argsort(-gamma.sum(axis=0), kind="stable")[:target]], axis=1)
    else:
        start = ahc(x, SpeakerCount.exactly(target), params.init_threshold)
    return assign(z, plda.phi, start, target, params)


def group_neighbours(x: np.ndarray, max_units: int) -> np.ndarray:
    """`(N, D)` unit rows -> `(N,)` unit index: runs of ceil(N / max_units) consecutive rows share one."""
    size = -(-len(x) // max_units)
    return np.arange(len(x)) // size


def unit_starts(unit_of: np.ndarray) -> np.ndarray:
    """`(N,)` non-decreasing unit index -> `(units,)` the row each unit starts at."""
    return np.flatnonzero(np.diff(unit_of, prepend=-1))


def unit_means(x: np.ndarray, unit_of: np.ndarray) -> np.ndarray:
    """`(N, D)` rows and their `(N,)` non-decreasing unit index -> `(units, D)` unit-length means."""
    return normalize(np.add.reduceat(x, unit_starts(unit_of)))


def assign_nearest(x: np.ndarray, unit_of: np.ndarray, unit_labels: np.ndarray) -> np.ndarray:
    """Each row's speaker: the nearest (cosine) centroid of the speakers `unit_labels[unit_of]` give; those
    labels themselves when the nearest-centroid rule would leave a speaker with no row."""
    coarse = unit_labels[unit_of]
    ids = np.unique(coarse)
    centroids = normalize(np.stack([x[coarse == k].mean(axis=0) for k in ids]))
    fine = ids[np.argmax(x @ centroids.T, axis=1)]
    return fine if len(np.unique(fine)) == len(ids) else coarse


def resegment(x: np.ndarray, labels: np.ndarray, count: SpeakerCount, plda: PLDA, params: VBxParams) -> np.ndarray:
    """`(N, D)` rows and their `(N,)` labels 0..S-1 (their units') -> `(N,)` labels of VBx run on every row from
    those: the PLDA and the HMM move each speaker change to sub-segment resolution. It adds no speaker; should it
    drop one the count needs, `assign` keeps all S."""
    s = int(labels.max()) + 1
    z = plda.project(x)
    gamma, _ = vbx(z, plda.phi, one_hot(labels, s, params.smoothing), params)
    fine = np.argmax(gamma, axis=1)
    if len(np.unique(fine)) >= min(count.min, s):
        return fine
    return assign(z, plda.phi, labels, s, params)


def merge_similar(x: np.ndarray, labels: np.ndarray, minimum: int, merge_cosine: float) -> np.ndarray:
    """Merge the two clusters with the most alike centroids while their cosine exceeds `merge_cosine` and
    more than `minimum` clusters remain."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) <= minimum:
            return labels
        centroids = normalize(np.stack([x[labels == i].mean(axis=0) for i in ids]))
        sim = centroids @ centroids.T
        np.fill_diagonal(sim, -np.inf)
        a, b = np.unravel_index(int(np.argmax(sim)), sim.shape)
        if sim[a, b] <= merge_cosine:
            return labels
        labels[labels == ids[b]] = ids[a]


def cluster(
    emb: np.ndarray,
    count: SpeakerCount,
    method: str = "spectral",
    seed: int = 0,
    pruning: float = 0.1,
    threshold: float = 0.5,
    merge_cosine: Optional[float] = 0.7,
    max_units: int = MAX_UNITS,
    plda: Optional[PLDA] = None,
    vbx_params: VBxParams = VBX_DEFAULTS,
) -> np.ndarray:
    """`(N, D)` embeddings -> `(N,)` labels 0..k-1 in order of first appearance, with k within `count`
    (and at most N). `method`: spectral, ahc or vbx (which needs `plda`); `pruning` is spectral's,
    `threshold` ahc's, `vbx_params` vbx's; `merge_cosine` None merges nothing (vbx merges by itself); more
    than `max_units` rows (0: no limit) are clustered as that many units of neighbours, then assigned
    (module docstring)."""
    if method not in METHODS:
        raise ValueError(f"unknown clustering {method!r}: one of {', '.join(METHODS)}")
    if method == "vbx" and plda is None:
        raise ValueError("vbx clustering needs a PLDA (speakerlab-plda fits one; --plda FILE)")
    n = len(emb)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n == 1 or count.max == 1:
        return np.zeros(n, dtype=np.int64)
    x = normalize(emb)
    if count.fixed and count.min >= n:
        return np.arange(n, dtype=np.int64)  # every segment its own speaker: nothing to cluster
    if max_units and n > max_units:
        unit_of = group_neighbours(x, max_units)
        # VBx's units are their runs' means (less noisy for its PLDA; `resegment` restores the resolution); spectral's
        # and AHC's their runs' first rows: means of runs blur the turns into one smooth chain, whose eigengap read a
        # 3-hour conversation of 8 speakers as one (bench/RESULTS.md, "Capped VBx, then every sub-segment").
        units = unit_means(x, unit_of) if method == "vbx" else x[unit_starts(unit_of)]
        unit_labels = cluster(units, count, method, seed, pruning, threshold, merge_cosine, 0, plda, vbx_params)
        if method == "vbx":  # VBx's own pass over every sub-segment places the changes inside units
            return first_appearance(resegment(x, unit_labels[unit_of], count, plda, vbx_params))
        return first_appearance(assign_nearest(x, unit_of, unit_labels))
    if method == "vbx":
        return first_appearance(vbx_clusters(x, count, plda, vbx_params))
    labels = spectral(x, count, seed, pruning) if method == "spectral" else ahc(x, count, threshold)
    if merge_cosine is not None and not count.fixed:
        labels = merge_similar(x, labels, count.min, merge_cosine)
    return first_appearance(labels)
