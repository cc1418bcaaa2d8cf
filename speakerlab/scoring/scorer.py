"""The scoring engine of `speakerlab-score` (speakerlab.scoring.score, the command, its layout and outputs):
cosine of unit embeddings over a trial list, score normalisation, calibration, metrics and the EER's interval.

    evaluate(ids, emb, trials_path)   # -> (scores (N,), labels (N,) bool, EER, minDCF): plain cosine scoring
    scorer = Scorer(ids, emb, cohort) # ids (U,), emb (U, D); then .trial_list(path) and .scores(trial_list) -> (N,)

How memory and time are bounded: no Python object is made per trial. Trial files are parsed in 2 MB
blocks (at most threads + 1 blocks at a time); scores are computed in blocks of `SCORE_BLOCK` trials
(two `(SCORE_BLOCK, D)` row gathers per thread, into buffers reused block after block); AS-norm
statistics in blocks of 512 embeddings against the cohort, over the same threads; the metrics come from
one sort (`speakerlab.scoring.metrics`) and the DET picture from the thinned curve. What grows with a list is
its arrays: 13 bytes per trial (two int32 rows, a label, an int32 line number) and 4 for the score, plus, while
they run, the duplicate check (8 bytes per trial) and the metrics' sorted keys and error curves (about 40 bytes
per trial). Measured figures: bench/RESULTS.md (bench/scoring.py runs the command end to end).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional, Sequence

import numpy as np

from speakerlab.dataio.tables.embeddings import check_embeddings
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.trials import IdIndex, TrialList, default_threads, read_trial_list, too_few_to_measure
from speakerlab.scoring.calibration import QMF, act_dcf, cllr, qmf_features
from speakerlab.scoring.interval import CI_LEVEL, CI_REPLICATES, TrialSpeakers, eer_interval
from speakerlab.scoring.metrics import verification_metrics
from speakerlab.scoring.norm import Cohort, asnorm, cohort_stats, unit_rows

SCORE_BLOCK = 4096  # trials per gather: two (4096, D) float32 blocks stay in cache
DET_POINTS = 4000  # points of the thinned DET curve kept for the picture


def cosine_trial_scores(
    unit: np.ndarray, enrol: np.ndarray, test: np.ndarray, threads: Optional[int] = None
) -> np.ndarray:
    """Unit rows `(M, D)`, trial rows `enrol`, `test` (N,) -> `(N,)` float32 cosines.

    Blocks of SCORE_BLOCK trials (two row gathers and a row-wise dot product, all GIL-free numpy), split
    into `threads` contiguous parts (default `trials.default_threads()`). Each part gathers into its own
    two `(SCORE_BLOCK, D)` buffers, reused block after block: fresh gather arrays would cost a page fault
    per 4 kB of every block, more system time than the arithmetic."""
    out = np.empty(len(enrol), np.float32)

    def part(lo: int, hi: int) -> None:
        a = np.empty((SCORE_BLOCK, unit.shape[1]), unit.dtype)
        b = np.empty_like(a)
        for start in range(lo, hi, SCORE_BLOCK):
            n = min(SCORE_BLOCK, hi - start)
            sl = slice(start, start + n)
            # np.take: faster than fancy indexing for row gathers.
            np.take(unit, enrol[sl], axis=0, out=a[:n])
            np.take(unit, test[sl], axis=0, out=b[:n])
            out[sl] = np.einsum("ij,ij->i", a[:n], b[:n])

    threads = threads or default_threads()
    bounds = np.linspace(0, len(enrol), threads + 1).astype(np.int64)
    if threads == 1 or len(enrol) < 4 * SCORE_BLOCK:
        part(0, len(enrol))
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(part, bounds[:-1], bounds[1:]))
    return out


class Scorer:
    """Scores trial lists of one embeddings file: `ids (M,)`, `emb (M, D)`, an optional `Cohort`
    (mean subtraction, AS-norm) and an optional fitted `QMF` (set `qmf`, `logdur (M,)`)."""

    def __init__(self, ids: Sequence[str], emb: np.ndarray, cohort: Optional[Cohort] = None, source="embeddings"):
        self.source = str(source)
        emb = np.asarray(emb, np.float32)
        check_embeddings(ids, emb, self.source)
        self.index = IdIndex(ids, self.source)
        self.cohort = cohort
        self.norms = np.sqrt(np.einsum("ij,ij->i", emb, emb)).astype(np.float64)  # raw norms: a QMF feature
        self.unit = cohort.unit(emb, self.source) if cohort else unit_rows(emb)
        self.logdur: Optional[np.ndarray] = None
        self.qmf: Optional[QMF] = None
        self._mu = np.full(len(emb), np.nan)
        self._sd = np.full(len(emb), np.nan)

    def trial_list(self, path) -> TrialList:
        """Parse and check a list: both classes present (EER and minDCF need them)."""
        tl = read_trial_list(path, self.index)
        n_tar = int(tl.target.sum())
        if n_tar in (0, len(tl)):
            kind = "target" if n_tar else "nontarget"
            raise ListError(
                f"{tl.path}: all {len(tl)} trials are {kind}; EER and minDCF need target and nontarget trials"
            )
        return tl

    def set_durations(self, durations: Dict[str, float], source: str) -> None:
        self.logdur = np.array([np.log(durations[u]) if u in durations else np.nan for u in self.index.ids])
        self._dur_source = source

    def raw_scores(self, tl: TrialList) -> np.ndarray:
        """Cosine, then AS-norm when the cohort has speaker means: `(N,)` float32."""
        s = cosine_trial_scores(self.unit, tl.enrol, tl.test)
        if self.cohort is None or self.cohort.top_n <= 0:
            return s
        used = np.zeros(len(self.unit), bool)
        used[tl.enrol] = used[tl.test] = True
        need = np.flatnonzero(used & np.isnan(self._mu))
        if need.size:
            self._mu[need], self._sd[need] = cohort_stats(
                self.unit[need], self.cohort.means, self.cohort.top_n, threads=default_threads()
            )
        return asnorm(s, tl.enrol, tl.test, self._mu, self._sd)

    def features(self, tl: TrialList, raw: np.ndarray) -> np.ndarray:
        if self.logdur is not None:
            bad = np.isnan(self.logdur[tl.enrol]) | np.isnan(self.logdur[tl.test])
            if bad.any():
                i = int(np.argmax(bad))
                row = tl.enrol[i] if np.isnan(self.logdur[tl.enrol[i]]) else tl.test[i]
                raise ListError(
                    f"{tl.path}:{tl.line[i]}: no duration for '{self.index.ids[row]}' in {self._dur_source}"
                )
        return qmf_features(raw, tl.enrol, tl.test, self.norms, self.logdur)

    def scores(self, tl: TrialList) -> np.ndarray:
        """Final scores `(N,)` float32: LLRs when a QMF is fitted, else the (normalised) cosines."""
        raw = self.raw_scores(tl)
        return raw if self.qmf is None else self.qmf.llr(self.features(tl, raw))

    def method(self) -> str:
        parts = ["cosine"]
        if self.cohort is not None and self.cohort.mean is not None:
            parts.insert(0, "mean-sub")
        if self.cohort is not None and self.cohort.top_n > 0:
            parts.append(f"asnorm{self.cohort.top_n}")
        if self.qmf is not None:
            parts.append("qmf")
        return "+".join(parts)


def summarise(
    name: str,
    tl: TrialList,
    scores: np.ndarray,
    p_targets: Sequence[float],
    calibrated: bool,
    keep_curves: bool = False,
    speakers: Optional[TrialSpeakers] = None,
    ci_level: float = CI_LEVEL,
    ci_replicates: int = CI_REPLICATES,
) -> Dict:
    """Metrics of one list as a JSON-ready dict (`_curves`: the thinned DET curve, when keep_curves).

    Operating points: the threshold at the EER and at false-alarm rates `metrics.FA_RATES`, each with its
    miss and false-alarm rates (`operating_points`: {"eer": point, "fa=0.01": point, ...}). With the trials'
    `speakers`: their count and source, the EER's interval (`eer_ci`, None with `ci_replicates` 0) and, below
    the minimum a measurable EER needs, `warning`."""
    m = verification_metrics(scores, tl.target, p_targets, curve_points=DET_POINTS)
    n_tar = int(tl.target.sum())
    out = {
        "name": name,
        "trials": str(tl.path),
        "n_trials": len(tl),
        "n_target": n_tar,
        "n_nontarget": len(tl) - n_tar,
    }
    if speakers is not None:
        out["n_speakers"] = speakers.count
        out["speakers_from"] = speakers.source
    out["eer"] = m["eer"]
    if speakers is not None:
        out["eer_ci"] = eer_interval(scores, tl.target, speakers, m["eer"], ci_level, ci_replicates)
        lacking = too_few_to_measure(speakers.count, n_tar)
        if lacking:
            out["warning"] = f"{tl.path}: {lacking}"
    out.update(
        {
            "c_miss": 1.0,
            "c_fa": 1.0,
            "min_dcf": {f"{p:g}": v for p, v in m["min_dcf"].items()},
            "operating_points": {"eer": m["eer_point"], **{f"fa={r:g}": v for r, v in m["fa_points"].items()}},
        }
    )
    if calibrated:
        out["cllr"] = cllr(scores, tl.target)
        out["act_dcf"] = {f"{p:g}": act_dcf(scores, tl.target, p) for p in p_targets}
    if keep_curves:
        out["_curves"] = (m["p_miss"], m["p_fa"])
    return out


def evaluate(ids, emb, trials_path, p_target: float = 0.01):
    """Plain cosine scoring of a trials file -> (scores (N,), labels (N,) bool, eer, min_dcf at p_target).

    For training-time validation and the baseline; errors raise `ListError`."""
    scorer = Scorer(ids, np.asarray(emb))
    tl = scorer.trial_list(trials_path)
    scores = scorer.scores(tl)
    m = verification_metrics(scores, tl.target, [p_target])
    return scores, tl.target, m["eer"], m["min_dcf"][float(p_target)]
