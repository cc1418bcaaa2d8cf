"""Score normalisation with a cohort (training-set) embeddings file: mean subtraction and AS-norm.

Mean subtraction: the mean of the cohort embeddings `(D,)` is subtracted from every embedding (eval and
cohort) before length normalisation, which centres the cosine on the training distribution.

AS-norm (adaptive symmetric normalisation): the cohort is one unit-length mean embedding per training
speaker `(S, D)`. For an embedding x, its cohort scores are the cosines with the S speaker means; mu(x)
and sigma(x) are the mean and (population) standard deviation of its top-N cohort scores. A trial
score s between e and t becomes

    0.5 * ((s - mu(e)) / sigma(e) + (s - mu(t)) / sigma(t)).

The statistics are computed once per embedding (`cohort_stats`), in row blocks, so a trial list of any
length costs one gather per trial.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence, Tuple

import numpy as np

from speakerlab.dataio.tables.lists import ListError


def unit_rows(emb: np.ndarray, mean: np.ndarray | None = None) -> np.ndarray:
    """`(N, D)` embeddings (minus `mean (D,)` if given) -> `(N, D)` float32 rows of unit length."""
    x = np.asarray(emb, dtype=np.float32)
    x = x - mean.astype(np.float32) if mean is not None else x.copy()
    x /= np.maximum(np.sqrt(np.einsum("ij,ij->i", x, x)), 1e-12)[:, None]
    return x


def check_dims(a: np.ndarray, a_name: str, b: np.ndarray, b_name: str) -> None:
    """Raise `ListError` when two embedding sets have different dimensions."""
    if a.shape[1] != b.shape[1]:
        raise ListError(
            f"{b_name}: embeddings of dimension {b.shape[1]} do not match the dimension {a.shape[1]} of {a_name}"
        )


def speaker_means(
    ids: Sequence[str], unit: np.ndarray, utt2spk: Dict[str, str], source: str = "cohort"
) -> Tuple[List[str], np.ndarray]:
    """Cohort `ids (N,)`, `unit (N, D)` and utt -> speaker -> (speakers (S,), `(S, D)` unit speaker means).

    Every cohort embedding needs a speaker; utt2spk entries without an embedding are ignored."""
    no_spk = [u for u in ids if u not in utt2spk]
    if no_spk:
        raise ListError(f"{source}: {len(no_spk)} cohort embedding(s) have no speaker in utt2spk, e.g. '{no_spk[0]}'")
    speakers, spk_of = np.unique(np.asarray([utt2spk[u] for u in ids]), return_inverse=True)
    sums = np.zeros((len(speakers), unit.shape[1]), np.float64)
    np.add.at(sums, spk_of, unit)
    return [str(s) for s in speakers], unit_rows(sums)


def cohort_stats(
    unit: np.ndarray, cohort: np.ndarray, top_n: int, block: int = 512, threads: int = 2
) -> Tuple[np.ndarray, np.ndarray]:
    """`unit (N, D)`, `cohort (S, D)` unit rows -> mean and std `(N,)` of each row's top-N cohort cosines.

    `top_n` is clipped to S. Row blocks are split over `threads` (matmul and partition release the GIL);
    each thread computes into one `(block, S)` buffer, partitioned in place: reused, not reallocated."""
    n_top = max(1, min(int(top_n), len(cohort)))
    mu = np.empty(len(unit), np.float64)
    sd = np.empty(len(unit), np.float64)
    ct = np.ascontiguousarray(cohort.T, dtype=np.float32)
    kth = len(cohort) - n_top

    def part(lo: int, hi: int) -> None:
        buf = np.empty((block, len(cohort)), np.float32)
        for start in range(lo, hi, block):
            n = min(block, hi - start)
            c = buf[:n]
            np.matmul(unit[start : start + n], ct, out=c)
            c.partition(kth, axis=1)
            top = c[:, kth:].astype(np.float64)
            mu[start : start + n] = top.mean(axis=1)
            sd[start : start + n] = top.std(axis=1)

    bounds = np.linspace(0, len(unit), max(1, threads) + 1).astype(np.int64)
    if threads <= 1 or len(unit) < 2 * block:
        part(0, len(unit))
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(part, bounds[:-1], bounds[1:]))
    return mu, np.maximum(sd, 1e-6)  # a cohort of one speaker has no spread: keep the division finite


def asnorm(
    scores: np.ndarray, enrol: np.ndarray, test: np.ndarray, mu: np.ndarray, sd: np.ndarray, block: int = 1 << 16
) -> np.ndarray:
    """AS-norm of `scores (n,)` for trials of rows `enrol`, `test` (n,), given per-row `mu`, `sd` -> (n,)
    float32, computed in float64 blocks of `block` trials (small temporaries at any n)."""
    out = np.empty(len(scores), np.float32)
    for lo in range(0, len(scores), block):
        sl = slice(lo, lo + block)
        s, e, t = scores[sl].astype(np.float64), enrol[sl], test[sl]
        out[sl] = 0.5 * ((s - mu[e]) / sd[e] + (s - mu[t]) / sd[t])
    return out


class Cohort:
    """A cohort for score normalisation: its mean embedding and its unit speaker means.

    `ids (C,)`, `emb (C, D)`: the cohort embeddings; `utt2spk`: needed for AS-norm only."""

    def __init__(
        self,
        ids: Sequence[str],
        emb: np.ndarray,
        utt2spk: Dict[str, str] | None = None,
        mean_sub: bool = False,
        top_n: int = 0,
        source: str = "cohort",
    ):
        self.source = source
        self.dim = emb.shape[1]
        self.mean = emb.astype(np.float64).mean(axis=0) if mean_sub else None
        self.top_n = int(top_n)
        self.speakers: List[str] = []
        self.means = np.zeros((0, self.dim), np.float32)
        if self.top_n > 0:
            if utt2spk is None:
                raise ListError(f"{source}: AS-norm needs the cohort's utt2spk")
            self.speakers, self.means = speaker_means(ids, unit_rows(emb, self.mean), utt2spk, source)

    def unit(self, emb: np.ndarray, name: str) -> np.ndarray:
        """Eval embeddings `(N, D)` -> unit rows, after mean subtraction when enabled."""
        check_dims(np.zeros((0, self.dim)), self.source, emb, name)
        return unit_rows(emb, self.mean)
