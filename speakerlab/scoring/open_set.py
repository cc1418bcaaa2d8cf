"""The "unknown" threshold of open-set identification, measured on the calibration lists rather than derived.

A never-enrolled speaker's file is named when its best speaker score over the gallery passes the threshold. The
analytic threshold (the single-trial FAR 1 - (1 - FPIR)^(1/N) of N independent speakers) is conservative twice: a
speaker's score is a mean of k enrolment LLRs, narrower than one trial's, and the N scores of one file are not
independent. On egs/mini it reached FPIR 0 % for a target of 1 % (bench/RESULTS.md).

Measured instead: on each calibration list, every speaker in turn plays the never-enrolled one against a gallery of
all the others, each enrolled with the first `ENROL_FILES` files of its enrolment side (scored as identification
scores them: the calibrated LLR of the probe against each enrolment file, averaged per speaker); every test-side file
of the left-out speaker is a probe, and its best score over the gallery is one impostor maximum. The pooled maxima
give the FPIR of any threshold for galleries of `n_gallery` speakers (the calibration speakers less one).

A deployment's gallery has N speakers, not n_gallery: its FPIR at a threshold is taken as 1 - (1 - f)^(N / n_gallery)
where f is the calibration galleries' (n_gallery-speaker galleries combined as if independent): the independence
assumption is used only for the step from n_gallery to N, not from one trial to a gallery. So `fpir_target(N)` is the
FPIR to look up on the curve, and the curve must have measured it (at least one maximum above the threshold).

This module measures the curve (speakerlab-calibrate); reading it is the calibration file's
(speakerlab.scoring.calibration_file: `curve_threshold`, `fpir_target`), which the torch-free runtime ships without
the trial-list machinery used here.
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

import numpy as np

from speakerlab.scoring.calibration import QMF, qmf_features
from speakerlab.scoring.interval import trial_speakers

ENROL_FILES = 3  # enrolment files per simulated gallery speaker (bench/calibration.py's --enrol default)
FPIR_GRID = np.geomspace(0.5, 1e-4, 30)


def impostor_maxima(scorer, tl, qmf: QMF, enrol_files: int = ENROL_FILES) -> Tuple[np.ndarray, int]:
    """One calibration list (a `Scorer` with durations when `qmf` uses them, and its `TrialList`) -> (impostor
    maxima `(P,)`: each test-side file's best mean LLR over a gallery of every other speaker, the gallery size)."""
    spk = trial_speakers(tl, scorer.index)
    enrol = dict(sorted(zip(tl.enrol.tolist(), spk.enrol.tolist())))
    probes = dict(sorted(zip(tl.test.tolist(), spk.test.tolist())))
    rows: List[int] = []
    owner: List[int] = []
    for s in sorted(set(enrol.values())):
        mine = [r for r, who in enrol.items() if who == s][:enrol_files]
        rows += mine
        owner += [s] * len(mine)
    rows_a, owner_a = np.asarray(rows), np.asarray(owner)
    names, inverse = np.unique(owner_a, return_inverse=True)
    if len(names) < 2:  # a left-out speaker would face an empty gallery
        return np.zeros(0), 0
    counts = np.bincount(inverse)
    maxima = []
    for p, s in probes.items():
        n = len(rows_a)
        cos = scorer.unit[rows_a] @ scorer.unit[p]
        idx = np.concatenate([rows_a, [p]])
        logdur = None if scorer.logdur is None else scorer.logdur[idx]
        feats = qmf_features(cos, np.arange(n), np.full(n, n), scorer.norms[idx], logdur)
        mean = np.bincount(inverse, weights=qmf.llr(feats).astype(np.float64)) / counts
        mean[names == s] = -np.inf  # the left-out speaker is not in its own gallery
        maxima.append(float(mean.max()))
    return np.asarray(maxima), len(names) - 1


def open_set_curve(lists: Sequence[Tuple[object, object]], qmf: QMF, enrol_files: int = ENROL_FILES) -> Dict:
    """The calibration lists `[(scorer, trial list), ...]` -> {"n_gallery", "enrol_files", "n_probes", "curve":
    [[fpir, llr threshold], ...] on FPIR_GRID, the measurable FPIRs (falling)}; n_gallery: the smallest list's."""
    got = [impostor_maxima(s, tl, qmf, enrol_files) for s, tl in lists]
    maxima = np.sort(np.concatenate([np.zeros(0), *(m for m, _ in got)]))[::-1]
    curve = []
    for f in FPIR_GRID:
        passing = int(math.floor(f * len(maxima)))  # maxima that may pass the threshold
        if passing < 1:
            break
        # just above the (passing + 1)-th largest maximum: exactly `passing` of them pass
        curve.append([float(f), float(np.nextafter(maxima[passing], np.inf))])
    n_gallery = min((n for m, n in got if len(m)), default=0)
    return {"n_gallery": int(n_gallery), "enrol_files": enrol_files, "n_probes": int(len(maxima)), "curve": curve}
