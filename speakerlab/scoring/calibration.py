"""Score calibration with quality measures (QMF): logistic regression from trial features to a log
likelihood ratio, fitted on a held-out trial list and applied to others.

Features of a trial (enrol e, test t), `qmf_features`:
    score, min and max of log-durations (seconds) of e and t, min and max of the raw embedding norms,
a symmetric choice (swapping enrol and test gives the same features). Durations are optional.

The fit is prior-weighted logistic regression (targets and nontargets weighted 1/2 each in total, as in
Cllr), solved by Newton's method (IRLS) in numpy: the problem is convex with a handful of parameters, so
a few exact Newton steps converge and no solver dependency (scikit-learn) is needed. A tiny L2 penalty
keeps the Hessian invertible when a feature is constant. Features are standardised with the training
list's mean and std. The output is a natural-log LLR for a prior of `prior` (default 0.5).

`cllr` and `act_dcf` measure how well LLRs are calibrated; `min_cllr` is the Cllr of the best monotone
recalibration of the same scores (pool-adjacent-violators), what calibration can at most reach: Cllr - min_cllr is
the cost of miscalibration. PAV is written here (a dozen lines of numpy) because scikit-learn, whose
IsotonicRegression does the same, is not a dependency of the core.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from speakerlab.dataio.tables.lists import ListError, read_table, read_utt2num_samples

FEATURES_NO_DUR = ["score", "norm_min", "norm_max"]
FEATURES = ["score", "logdur_min", "logdur_max", "norm_min", "norm_max"]
DURATION_FILES = ("utt2dur", "utt2num_samples")  # what `read_durations` reads in a data dir, first found


def read_durations(paths: Sequence, sample_rate: int = 16000) -> Dict[str, float]:
    """utt2dur (seconds) or utt2num_samples files (recognised by that name; samples / sample_rate), or
    data dirs holding one -> {utt: seconds}. Non-positive durations and an utterance in two files raise `ListError`."""
    out: Dict[str, float] = {}
    for path in map(Path, paths):
        if path.is_dir():  # a data dir: its utt2dur, else its utt2num_samples
            path = path / DURATION_FILES[0] if (path / DURATION_FILES[0]).exists() else path / DURATION_FILES[1]
        if path.name.endswith("utt2num_samples"):
            got = {u: n / sample_rate for u, n in read_utt2num_samples(path).items()}
        else:
            got = {}
            for utt, (lineno, fields) in read_table(path, 2, 2).items():
                try:
                    got[utt] = float(fields[0])
                except ValueError:
                    got[utt] = -1.0
                if not got[utt] > 0:
                    raise ListError(
                        f"{path}:{lineno}: duration must be a positive number of seconds, got {fields[0]!r}"
                    )
        again = next((u for u in got if u in out), None)
        if again is not None:
            raise ListError(f"{path}: utterance '{again}' has a duration in an earlier file too")
        out.update(got)
    return out


def qmf_features(
    scores: np.ndarray, enrol: np.ndarray, test: np.ndarray, norms: np.ndarray, logdur: Optional[np.ndarray] = None
) -> np.ndarray:
    """`scores (n,)`, trial rows `enrol`, `test` (n,), per-embedding `norms (M,)` and `logdur (M,)`
    -> `(n, F)` float64 features (F = 5, or 3 without durations; names in FEATURES, FEATURES_NO_DUR)."""
    cols = [scores.astype(np.float64)]
    if logdur is not None:
        cols += [np.minimum(logdur[enrol], logdur[test]), np.maximum(logdur[enrol], logdur[test])]
    cols += [np.minimum(norms[enrol], norms[test]), np.maximum(norms[enrol], norms[test])]
    return np.stack(cols, axis=1).astype(np.float64)


def _log1pexp(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow."""
    return np.logaddexp(0.0, x)


def logistic_fit(
    x: np.ndarray, y: np.ndarray, prior: float = 0.5, l2: float = 1e-6, iters: int = 50, tol: float = 1e-10
) -> np.ndarray:
    """`x (n, F)`, `y (n,)` bool -> weights `(F + 1,)` (last: bias) of prior-weighted logistic regression.

    Minimises sum_i w_i * CE(y_i, sigmoid(x_i . a + b)) + l2 |a|^2, with w = prior / n_target for targets,
    (1 - prior) / n_nontarget for nontargets, by Newton steps."""
    y = np.asarray(y, bool)
    n_tar, n_non = int(y.sum()), int((~y).sum())
    if n_tar == 0 or n_non == 0:
        raise ValueError(f"calibration needs target and nontarget trials, got {n_tar} target, {n_non} nontarget")
    xb = np.hstack([x, np.ones((len(x), 1))])
    w = np.where(y, prior / n_tar, (1 - prior) / n_non)
    t = y.astype(np.float64)
    reg = np.full(xb.shape[1], l2)
    reg[-1] = 0.0  # the bias is not penalised
    theta = np.zeros(xb.shape[1])
    # The prior offset logit(prior) is part of the model: theta . x + logit(prior) is the log posterior ratio.
    offset = math.log(prior / (1 - prior))
    for _ in range(iters):
        z = xb @ theta + offset
        p = 1.0 / (1.0 + np.exp(-z))
        grad = xb.T @ (w * (p - t)) + 2 * reg * theta
        hess = (xb * (w * p * (1 - p))[:, None]).T @ xb + np.diag(2 * reg)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if float(np.abs(step).max()) < tol:
            break
    return theta


class QMF:
    """Quality-measure calibration: `fit(features, labels)`, then `llr(features)` -> `(n,)` LLRs."""

    def __init__(self, prior: float = 0.5, l2: float = 1e-6):
        self.prior, self.l2 = prior, l2
        self.mean: np.ndarray = np.zeros(0)
        self.std: np.ndarray = np.ones(0)
        self.theta: np.ndarray = np.zeros(0)
        self.names: List[str] = []

    def fit(self, features: np.ndarray, labels: np.ndarray, names: Sequence[str] = ()) -> "QMF":
        self.mean = features.mean(axis=0)
        self.std = np.where(features.std(axis=0) > 0, features.std(axis=0), 1.0)
        self.theta = logistic_fit((features - self.mean) / self.std, labels, self.prior, self.l2)
        self.names = list(names)
        return self

    def llr(self, features: np.ndarray) -> np.ndarray:
        """`(n, F)` -> `(n,)` float32 natural-log likelihood ratios."""
        if features.shape[1] != len(self.mean):
            raise ValueError(f"QMF was fitted on {len(self.mean)} features, got {features.shape[1]}")
        x = (features - self.mean) / self.std
        return (x @ self.theta[:-1] + self.theta[-1]).astype(np.float32)

    def describe(self) -> Dict[str, float]:
        """Weights per (standardised) feature and the bias, for the metrics JSON."""
        names = self.names or [f"f{i}" for i in range(len(self.theta) - 1)]
        return {**{n: float(v) for n, v in zip(names, self.theta[:-1])}, "bias": float(self.theta[-1])}


def cllr(llr: np.ndarray, labels: np.ndarray) -> float:
    """Log-likelihood-ratio cost in bits: 0 is perfect, 1 is an uninformative (all-zero) LLR."""
    llr = np.asarray(llr, np.float64)
    y = np.asarray(labels, bool)
    return float((_log1pexp(-llr[y]).mean() + _log1pexp(llr[~y]).mean()) / (2 * math.log(2)))


def act_dcf(llr: np.ndarray, labels: np.ndarray, p_target: float, c_miss: float = 1.0, c_fa: float = 1.0) -> float:
    """Normalised detection cost of Bayes decisions on the LLRs: accept when llr >= log(c_fa (1-p) / (c_miss p))."""
    y = np.asarray(labels, bool)
    accept = np.asarray(llr) >= math.log(c_fa * (1 - p_target) / (c_miss * p_target))
    p_miss = float(np.mean(~accept[y]))
    p_fa = float(np.mean(accept[~y]))
    return (c_miss * p_target * p_miss + c_fa * (1 - p_target) * p_fa) / min(c_miss * p_target, c_fa * (1 - p_target))


def pav(y: np.ndarray) -> np.ndarray:
    """Pool adjacent violators: `y (n,)` in score order -> `(n,)` the non-decreasing fit of least squares (each
    pooled block takes its mean). A stack of blocks, merged while the last two are out of order."""
    sums: List[float] = []
    counts: List[int] = []
    for v in np.asarray(y, np.float64):
        sums.append(float(v))
        counts.append(1)
        while len(sums) > 1 and sums[-2] / counts[-2] >= sums[-1] / counts[-1]:
            s, c = sums.pop(), counts.pop()
            sums[-1] += s
            counts[-1] += c
    return np.repeat(np.array(sums) / np.array(counts), counts)


def min_cllr(scores: np.ndarray, labels: np.ndarray) -> float:
    """Cllr (bits) after the optimal monotone map of `scores (n,)` to LLRs: PAV posteriors of the labels in score
    order (ties pooled), less the list's prior log-odds. Lower than or equal to the Cllr of any LLRs that
    order the trials as `scores` does."""
    y = np.asarray(labels, bool)
    order = np.lexsort((y, np.asarray(scores, np.float64)))  # within a tie, nontargets first: PAV pools them
    post = pav(y[order].astype(np.float64))
    n_tar, n_non = int(y.sum()), int((~y).sum())
    with np.errstate(divide="ignore"):
        llr = np.log(post) - np.log1p(-post) - math.log(n_tar / n_non)
    out = np.empty_like(llr)
    out[order] = llr
    return cllr(out, y)
