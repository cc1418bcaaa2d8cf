"""How sure an EER is: a confidence interval that resamples speakers, not trials.

Trials that share a speaker are not independent: a speaker whose voice the model handles badly makes
misses in every target trial of theirs and false alarms in many nontarget ones. With 20 test speakers
and 3,000 trials the EER moves by points from one set of 20 speakers to the next, far more than 3,000
independent trials would suggest; an interval over trials alone is too narrow (measured below).

Method (`eer_interval`): the speaker bootstrap of paired data. A replicate draws the list's S speakers
with replacement (speaker s drawn c_s times, c ~ Multinomial(S, 1/S)) and weighs every trial by how
often it occurs in the resampled population: a target trial of s by c_s, a nontarget trial of s and t
by c_s * c_t (each copy of s against each copy of t). Its EER is the weighted EER (`weighted_eers`).
The interval is BCa (bias-corrected and accelerated: Efron 1987; the acceleration from a jackknife
over up to JACKKNIFE_GROUPS groups of speakers), with the tail quantiles widened for few speakers as in
the expanded percentile interval (Hesterberg 2015: z -> sqrt(S / (S - 1)) t_{S-1}), because a
bootstrap of S units sees a spread shrunk by about (S - 1) / S and its tails are those of S draws.

Coverage, measured by `python bench/interval_coverage.py` (bench/RESULTS.md) on lists drawn from
tests/test_score_interval.py's score model (speaker effects on target and nontarget scores, utterance
effects, trial noise; the true EER known in closed form), 500 lists per case, 500 replicates each: the
nominal 95% interval held the true EER in 0.972 / 0.970 / 0.952 / 0.922 / 0.948 / 0.968 of the lists at
10 / 20 / 20 / 20 / 40 / 80 speakers; an interval that resamples trials alone held it in 0.42-0.63 at 20
speakers. The intervals are wide with few speakers, as they should be: a half-width of about 80% of the
EER at 10 speakers, 45-55% at 20, 33% at 40, 21% at 80. Below CI_MIN_SPEAKERS there is no interval.

Cost: one argsort of the trials, then per replicate two gathers and two cumulative sums over the
trials (int32: about 7 ns per trial and replicate on one core) and a binary search for the crossing.
It is bounded by using at most `max_trials` trials (CI_MAX_TRIALS, a seeded random subsample of a
longer list) and `replicates` replicates: at 10 M trials 200,000 trials x 1,000 replicates, about
1.5 s of CPU. A subsample adds trial noise to every replicate, so a longer list's interval is a little
wider than its full-list interval would be, never narrower; its centre is the full list's EER (the
replicates' deviations from the subsample's EER are added to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Dict, Optional

import numpy as np

from speakerlab.dataio.tables.lists import ListError, read_utt2spk
from speakerlab.dataio.tables.trials import IdIndex, TrialList
from speakerlab.scoring.metrics import eer_between

CI_LEVEL = 0.95
CI_REPLICATES = 1000
CI_MAX_TRIALS = 200_000  # trials resampled; a longer list is subsampled (module docstring: cost)
CI_MIN_SPEAKERS = 5  # fewer: no interval (a bootstrap of 2-4 speakers sees next to none of their spread)
JACKKNIFE_GROUPS = 20  # speaker groups of the BCa acceleration's jackknife
_CELLS = 2_000_000  # replicates x trials per block of the vectorised weighted EER (int32: 8 MB per array)
_NORMAL = NormalDist()


def interval_problem(level: float, replicates: int) -> Optional[str]:
    """Why `--ci-level` / `--ci-replicates` cannot give an interval, or None: the level must lie in (0, 1), and the
    replicates be 0 (no interval) or enough that each tail beyond the interval holds at least one of them, 2 / (1 -
    level) (40 at 95 %): with fewer, an end of the "interval" is the most extreme replicate, whatever the level."""
    if not 0 < level < 1:
        return f"--ci-level must lie in (0, 1), got {level:g}"
    least = math.ceil(2 / (1 - level) - 1e-9)
    if replicates != 0 and replicates < least:
        return f"--ci-replicates must be 0 (no interval) or at least {least} for a {level:g} interval, got {replicates}"
    return None


@dataclass
class TrialSpeakers:
    """The speakers of a list's trials: `enrol`, `test` (N,) int32 in 0..count-1, and where they came from
    (`source`: a utt2spk file, or "target trials" when inferred as the groups target trials connect)."""

    enrol: np.ndarray
    test: np.ndarray
    count: int
    source: str


def target_groups(n_rows: int, enrol: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Connected components of the graph whose edges are target trials: `(n_rows,)` int64 labels, each the
    smallest row of its group. Min-label hooking along the edges, then pointer jumping, until every edge
    joins one label (a few rounds: each at least halves the depth of the trees)."""
    label = np.arange(n_rows)
    while True:
        a, b = label[enrol], label[test]
        split = a != b
        if not split.any():
            return label
        np.minimum.at(label, np.maximum(a[split], b[split]), np.minimum(a[split], b[split]))
        while True:
            up = label[label]
            if np.array_equal(up, label):
                break
            label = up


def trial_speakers(tl: TrialList, index: IdIndex, utt2spk=None) -> TrialSpeakers:
    """Speakers of every trial of `tl` (rows of `index`): from `utt2spk` (a file; one that misses an
    utterance of the list is a ListError naming it), else from the `utt2spk` beside the list when it names
    every utterance, else the groups that target trials connect (a speaker whose utterances no target trial
    joins counts as several: the count is then an upper bound and the interval a little narrow)."""
    used = np.zeros(len(index), bool)
    used[tl.enrol] = used[tl.test] = True
    rows = np.flatnonzero(used)
    beside = Path(tl.path).parent / "utt2spk"
    path = utt2spk if utt2spk is not None else (beside if beside.is_file() else None)
    if path is not None:
        u2s = read_utt2spk(path)
        missing = [index.ids[r] for r in rows if index.ids[r] not in u2s]
        if not missing:
            names = sorted({u2s[index.ids[r]][1] for r in rows})
            number = {s: i for i, s in enumerate(names)}
            spk = np.full(len(index), -1, np.int32)
            spk[rows] = [number[u2s[index.ids[r]][1]] for r in rows]
            return TrialSpeakers(spk[tl.enrol], spk[tl.test], len(names), str(path))
        if utt2spk is not None:
            raise ListError(f"{path}: no speaker for '{missing[0]}' of {tl.path} ({len(missing)} utterances)")
    label = target_groups(len(index), tl.enrol[tl.target], tl.test[tl.target])
    groups, spk = np.unique(label[rows], return_inverse=True)
    dense = np.full(len(index), -1, np.int32)
    dense[rows] = spk
    return TrialSpeakers(dense[tl.enrol], dense[tl.test], len(groups), "target trials")


class SortedTrials:
    """The trials in rising score order, split by class, with the class counts below each distinct score:
    what `weighted_eers` needs for any speaker weights."""

    def __init__(self, scores: np.ndarray, target: np.ndarray, enrol: np.ndarray, test: np.ndarray):
        order = np.argsort(scores, kind="stable")
        s, lab, e, t = scores[order], target[order], enrol[order], test[order]
        first = np.r_[np.flatnonzero(np.r_[True, s[1:] != s[:-1]]), len(s)]  # distinct scores, then "none"
        self.tar_spk = e[lab]  # (n_tar,) speaker of each target trial (enrol's: both are the same speaker)
        self.non_enrol, self.non_test = e[~lab], t[~lab]  # (n_non,)
        # Operating point k rejects the trials below first[k]: tar_below[k] targets, non_below[k] nontargets.
        self.tar_below = np.r_[0, np.cumsum(lab)][first]
        self.non_below = np.r_[0, np.cumsum(~lab)][first]


def weighted_eers(trials: SortedTrials, counts: np.ndarray) -> np.ndarray:
    """EERs under speaker weights: `counts (R, S)` -> `(R,)`, NaN where a replicate has no target or no
    nontarget weight. Row r weighs a target trial of s by counts[r, s], a nontarget trial of s and t by
    counts[r, s] * counts[r, t]; with all counts 1 it is `metrics.compute_eer` of the trials."""
    n = len(trials.tar_spk) + len(trials.non_enrol)
    block = max(1, _CELLS // max(n, 1))
    return np.concatenate([_block_eers(trials, counts[lo : lo + block]) for lo in range(0, len(counts), block)])


def _block_eers(trials: SortedTrials, counts: np.ndarray) -> np.ndarray:
    """`weighted_eers` of a block of replicates `(k, S)` -> `(k,)`: their cumulative class weights along the
    scores, then a binary search for each one's crossing of p_miss and p_fa."""
    n = len(trials.tar_spk) + len(trials.non_enrol)
    dtype = np.int64 if int(counts.max(initial=1)) ** 2 * n >= 2**31 else np.int32
    c = counts.astype(dtype)
    k = len(c)
    tar = np.zeros((k, len(trials.tar_spk) + 1), dtype)
    np.cumsum(c[:, trials.tar_spk], axis=1, out=tar[:, 1:])
    non = np.zeros((k, len(trials.non_enrol) + 1), dtype)
    np.cumsum(c[:, trials.non_enrol] * c[:, trials.non_test], axis=1, out=non[:, 1:])
    n_tar, n_non = tar[:, -1].astype(np.float64), non[:, -1].astype(np.float64)
    rows = np.arange(k)
    safe_tar, safe_non = np.maximum(n_tar, 1), np.maximum(n_non, 1)

    def rates(j):  # (p_miss, p_fa) of each replicate at its operating point j
        return tar[rows, trials.tar_below[j]] / safe_tar, (n_non - non[rows, trials.non_below[j]]) / safe_non

    # Binary search for the first point where p_miss >= p_fa (the last point, which accepts nothing, is one).
    lo = np.zeros(k, np.int64)
    hi = np.full(k, len(trials.tar_below) - 1)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        miss, fa = rates(mid)
        right = miss >= fa
        hi, lo = np.where(right, mid, hi), np.where(right, lo, mid + 1)
    miss1, fa1 = rates(lo)
    miss0, fa0 = rates(np.maximum(lo - 1, 0))
    eer = np.where(lo == 0, fa1, eer_between(miss0, fa0, miss1, fa1))
    return np.where((n_tar > 0) & (n_non > 0), eer, np.nan)


def _t_quantile(p: float, dof: int) -> float:
    """Student's t quantile: exact for 1 and 2 degrees of freedom, else the Cornish-Fisher expansion
    (error below 1e-3 from 3 degrees on; numpy has no t distribution and scipy is not a dependency)."""
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = _NORMAL.inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / dof + g2 / dof**2 + g3 / dof**3


def eer_interval(
    scores: np.ndarray,
    target: np.ndarray,
    speakers: TrialSpeakers,
    eer: float,
    level: float = CI_LEVEL,
    replicates: int = CI_REPLICATES,
    max_trials: int = CI_MAX_TRIALS,
    seed: int = 0,
) -> Optional[Dict]:
    """The speaker-bootstrap interval of a list's EER (module docstring): `scores`, `target` (N,), their
    `speakers`, the list's `eer` -> {"level", "low", "high", "method", "replicates", "trials_used"}, or
    None with fewer than CI_MIN_SPEAKERS speakers or no replicates."""
    if speakers.count < CI_MIN_SPEAKERS or replicates < 1:
        return None
    rng = np.random.default_rng([seed, 7])
    pick = slice(None)
    if len(scores) > max_trials:
        pick = np.flatnonzero(rng.random(len(scores)) < max_trials / len(scores))
    trials = SortedTrials(scores[pick], target[pick], speakers.enrol[pick], speakers.test[pick])
    s = speakers.count
    centre = weighted_eers(trials, np.ones((1, s), np.int32))[0]  # the subsample's EER (the list's when whole)
    boot = weighted_eers(trials, rng.multinomial(s, np.full(s, 1.0 / s), size=replicates).astype(np.int32))
    boot = boot[np.isfinite(boot)]
    if boot.size == 0 or not np.isfinite(centre):
        return None
    groups = min(s, JACKKNIFE_GROUPS)
    member = rng.permutation(s) % groups
    jack = weighted_eers(trials, (member[None, :] != np.arange(groups)[:, None]).astype(np.int32))
    jack = jack[np.isfinite(jack)]
    d = jack.mean() - jack if jack.size else jack
    spread = float((d**2).sum())
    accel = float((d**3).sum()) / (6 * spread**1.5) if spread > 0 else 0.0
    below = (np.count_nonzero(boot < centre) + 0.5 * np.count_nonzero(boot == centre)) / boot.size
    z0 = _NORMAL.inv_cdf(min(max(below, 1e-4), 1 - 1e-4))
    z = math.sqrt(s / (s - 1)) * _t_quantile(1 - (1 - level) / 2, s - 1)

    def bca(zq: float) -> float:  # the quantile of the replicates that BCa puts at normal quantile zq
        return _NORMAL.cdf(z0 + (z0 + zq) / (1 - accel * (z0 + zq)))

    low, high = np.quantile(boot, [bca(-z), bca(z)]) + (eer - centre)
    return {
        "level": level,
        "low": float(min(max(low, 0.0), eer)),
        "high": float(min(max(high, eer), 1.0)),
        "method": f"speaker bootstrap, BCa, expanded for {s} speakers",
        "replicates": int(boot.size),
        "trials_used": len(trials.tar_spk) + len(trials.non_enrol),
    }


def far_interval(
    accept: np.ndarray,
    target: np.ndarray,
    speakers: TrialSpeakers,
    level: float = CI_LEVEL,
    replicates: int = CI_REPLICATES,
    seed: int = 0,
) -> Optional[Dict]:
    """The speaker-bootstrap interval of a false-alarm rate: the share of nontarget trials `accept`ed (`accept`,
    `target` (N,) bool, their `speakers`) -> {"level", "low", "high", "method", "replicates"}, or None with fewer
    than CI_MIN_SPEAKERS speakers. Replicates weigh the nontarget trial of s and t by c_s * c_t as `eer_interval`
    does; the interval is the expanded percentile one (module docstring), without BCa: a rate is a ratio of two
    weighted sums, whose bootstrap is nearly unbiased."""
    non = ~np.asarray(target, bool)
    if speakers.count < CI_MIN_SPEAKERS or replicates < 1 or not non.any():
        return None
    s = speakers.count
    e, t, a = speakers.enrol[non], speakers.test[non], np.asarray(accept, bool)[non]
    counts = np.random.default_rng([seed, 11]).multinomial(s, np.full(s, 1.0 / s), size=replicates)
    block = max(1, _CELLS // max(len(e), 1))
    rates = []
    for lo in range(0, replicates, block):
        w = (counts[lo : lo + block, e] * counts[lo : lo + block, t]).astype(np.float64)
        total = w.sum(axis=1)
        rates.append(np.where(total > 0, (w * a).sum(axis=1) / np.maximum(total, 1), np.nan))
    boot = np.concatenate(rates)
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return None
    q = _NORMAL.cdf(math.sqrt(s / (s - 1)) * _t_quantile(1 - (1 - level) / 2, s - 1))
    low, high = np.quantile(boot, [1 - q, q])
    far = float(a.mean())
    return {
        "level": level,
        "low": float(min(low, far)),
        "high": float(max(high, far)),
        "method": f"speaker bootstrap, percentile, expanded for {s} speakers",
        "replicates": int(boot.size),
    }
