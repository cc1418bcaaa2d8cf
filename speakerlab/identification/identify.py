"""Which enrolled speaker a test file is, or "unknown", or "too short": open-set identification with the model's
calibration (speakerlab.scoring.calibration_file).

Scores. The test embedding is scored against every enrolment file of every speaker as one verification trial each
(cosine, then the calibration's LLR with both files' durations and embedding norms: the kind of trial the
calibration was fitted on), and a speaker's score is the mean LLR over their enrolment files. The answer is the
best speaker, with the margin of its score over the second's.

"unknown" at a target FPIR (false-positive identification rate: the share of never-enrolled speakers' files given
a name). A never-enrolled file is named when its best score over N speakers passes the threshold. The threshold is
measured where the calibration file has an open-set curve (speakerlab.scoring.open_set: the best scores that the
calibration speakers' files reached over galleries of the other calibration speakers, rescaled to N). Otherwise,
for older files, it is analytic: with independent nontarget scores a file is named with probability
1 - (1 - FAR)^N, so the threshold is the calibration's at the per-speaker FAR 1 - (1 - FPIR)^(1/N)
(Calibration.threshold). A speaker with k enrolment files has a mean of k LLRs, whose nontarget spread is narrower
than one trial's: the FPIR the analytic threshold reaches is at most the target, often far below it
(bench/calibration.py measures both).

"too short": a test file under `min_seconds` gets no guess (short files give the least reliable embeddings and
the most confident mistakes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from speakerlab.identification.gallery import Gallery, GalleryError
from speakerlab.scoring.calibration_file import Calibration, CalibrationError

MIN_SECONDS = 1.0


@dataclass
class Identification:
    """`answer`: a speaker, "unknown" or "too short"; `best`, `score` (its mean LLR), `margin` over the second (None
    with one speaker), `threshold` (LLR, at `fpir`), `seconds` of the test file."""

    answer: str
    best: Optional[str]
    score: Optional[float]
    margin: Optional[float]
    threshold: Optional[float]
    seconds: float
    fpir: float

    def line(self) -> str:
        if self.answer == "too short":
            return f"too short ({self.seconds:.2f} s)"
        margin = "" if self.margin is None else f" margin {self.margin:.3f}"
        text = f"llr {self.score:.3f}{margin} threshold {self.threshold:.3f} at FPIR {100 * self.fpir:g} %"
        return f"{self.answer} ({'best ' + str(self.best) + ', ' if self.answer == 'unknown' else ''}{text})"


def speaker_scores(g: Gallery, cal: Calibration, emb: np.ndarray, seconds: float):
    """`emb (D,)` of a test file of `seconds` -> (speakers (S,), mean LLR (S,)) over each speaker's enrolments."""
    e = np.asarray(emb, np.float64)
    rows = np.asarray(g.embeddings, np.float64)
    norms = np.linalg.norm(rows, axis=1)
    cos = rows @ e / np.maximum(norms * np.linalg.norm(e), 1e-12)
    llr = cal.llr(cos, g.seconds, seconds, norms, float(np.linalg.norm(e))).astype(np.float64)
    names, inverse = np.unique(g.speakers, return_inverse=True)
    return names, np.bincount(inverse, weights=llr) / np.bincount(inverse)


def fpir_threshold(cal: Calibration, fpir: float, speakers: int) -> float:
    """The LLR threshold of a target FPIR over `speakers` enrolled ones: measured (the calibration's open-set curve),
    else the analytic per-speaker one (module docstring)."""
    measured = cal.open_set_threshold(fpir, speakers)
    if measured is not None:
        return measured
    return analytic_fpir_threshold(cal, fpir, speakers)


def threshold_note(cal: Calibration, fpir: float, speakers: int) -> str:
    """One line saying where `fpir_threshold` took the threshold from (for the command's stderr)."""
    head = f"'unknown' threshold at FPIR {100 * fpir:g} % over {speakers} speakers"
    if cal.open_set_threshold(fpir, speakers) is not None:
        o = cal.open_set
        return (
            f"{head}: measured on the calibration's impostor maxima ({o['n_probes']} probes against galleries of "
            f"{o['n_gallery']} speakers)"
        )
    return f"{head}: analytic (per-speaker FAR 1 - (1 - FPIR)^(1/N)), not measured by this calibration"


def analytic_fpir_threshold(cal: Calibration, fpir: float, speakers: int) -> float:
    """The calibration's single-trial threshold at FAR 1 - (1 - FPIR)^(1/N), N = `speakers` (module docstring)."""
    far = 1.0 - (1.0 - fpir) ** (1.0 / max(speakers, 1))
    try:
        return cal.threshold(far)
    except CalibrationError as e:  # the user asked for an FPIR: say which FAR it needed
        raise CalibrationError(
            f"--fpir {fpir:g} over {speakers} speaker(s): not measured by the calibration's open-set curve, and the "
            f"analytic threshold's {e}"
        ) from None


def identify(
    g: Gallery, cal: Calibration, emb: np.ndarray, seconds: float, fpir: float = 0.01, min_seconds=MIN_SECONDS
) -> Identification:
    """One test embedding `(D,)` of a file of `seconds` -> its Identification."""
    if len(g.speakers) == 0:
        raise GalleryError("the gallery has no enrolled speaker")
    if seconds < min_seconds:
        return Identification("too short", None, None, None, None, seconds, fpir)
    names, scores = speaker_scores(g, cal, emb, seconds)
    order = np.argsort(-scores, kind="stable")
    best = str(names[order[0]])
    margin = float(scores[order[0]] - scores[order[1]]) if len(order) > 1 else None
    threshold = fpir_threshold(cal, fpir, len(names))
    answer = best if scores[order[0]] >= threshold else "unknown"
    return Identification(answer, best, float(scores[order[0]]), margin, threshold, seconds, fpir)


def identify_many(g, cal, emb: np.ndarray, seconds, fpir=0.01, min_seconds=MIN_SECONDS) -> List[Identification]:
    """Rows of `emb (N, D)` with their `seconds (N,)` -> N Identifications."""
    return [identify(g, cal, e, s, fpir, min_seconds) for e, s in zip(emb, seconds)]
