"""The measured "unknown" threshold (speakerlab.scoring.open_set): stored by speakerlab-calibrate, read by
identification, and nearer its target FPIR on held-out speakers than the analytic one, which is conservative."""

from __future__ import annotations

import json

import numpy as np
import pytest

from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.identification.gallery import Gallery
from speakerlab.identification.identify import (
    analytic_fpir_threshold,
    fpir_threshold,
    speaker_scores,
    threshold_note,
)
from speakerlab.scoring.calibrate import main as calibrate
from speakerlab.scoring.calibration_file import Calibration, curve_threshold, fpir_target, read_calibration
from speakerlab.scoring.open_set import ENROL_FILES
from tests.calibration_data import make_set

FPIR = 0.05


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """A calibration of 30 speakers; 60 other speakers, 30 enrolled with ENROL_FILES files, 30 never enrolled:
    (calibration, gallery, best scores of the enrolled probes, whether their best is right, best scores of the
    never-enrolled probes)."""
    root = tmp_path_factory.mktemp("openset")
    cal_dir = make_set(root, "cal", 30, 8, seed=4)
    out = root / "cal.json"
    args = ["--trials", cal_dir / "trials", "--embeddings", root / "cal.npz", "--durations", cal_dir, "--out", out]
    assert calibrate([str(a) for a in [*args, "--ci-replicates", "0"]]) == 0
    cal = read_calibration(out)
    ev_dir = make_set(root, "ev", 60, 8, seed=5)
    ids, emb = read_embeddings(root / "ev.npz")
    seconds = {u: float(x) for u, x in (line.split() for line in (ev_dir / "utt2dur").read_text().splitlines())}
    speaker = [u.rsplit("-", 1)[0] for u in ids]
    g = Gallery.empty("m" * 64, emb.shape[1])
    probes = []
    for s in range(60):
        rows = [i for i, who in enumerate(speaker) if who == f"ev-s{s}"]
        if s % 2 == 0:
            enrol = rows[:ENROL_FILES]
            g.add(f"ev-s{s}", [ids[i] for i in enrol], emb[enrol], [seconds[ids[i]] for i in enrol])
            rows = rows[ENROL_FILES:]
        probes += rows
    known, right, best = [], [], []
    for i in probes:
        names, scores = speaker_scores(g, cal, emb[i], seconds[ids[i]])
        k = int(np.argmax(scores))
        best.append(scores[k])
        right.append(names[k] == speaker[i])
        known.append(int(speaker[i].split("-s")[1]) % 2 == 0)
    known, right, best = np.array(known), np.array(right), np.array(best)
    return cal, g, best[known], right[known], best[~known]


def test_calibrate_stores_the_measured_curve(held_out):
    cal = held_out[0]
    o = cal.open_set
    # 30 speakers, each left out in turn against the other 29; every test-side file of the left-out speaker is a
    # probe: all 240 but the first, which the list of all pairs (i < j) has on the enrolment side only
    assert o["n_gallery"] == 29 and o["enrol_files"] == ENROL_FILES and o["n_probes"] == 239
    fpirs = [f for f, _ in o["curve"]]
    thresholds = [t for _, t in o["curve"]]
    assert fpirs == sorted(fpirs, reverse=True) and thresholds == sorted(thresholds)
    assert fpirs[-1] * o["n_probes"] >= 1  # only measurable FPIRs: one probe at least passes each threshold
    # a gallery of the calibration's own size reads the curve where it was measured; a larger gallery needs a
    # higher threshold (more speakers to be mistaken for)
    at_cal = curve_threshold(o, 0.1, 29)
    assert at_cal == pytest.approx(np.interp(np.log(0.1), np.log(fpirs[::-1]), thresholds[::-1]))
    assert curve_threshold(o, 0.1, 100) > at_cal and fpir_target(0.1, 100, 29) < 0.1
    assert curve_threshold(o, 1e-6, 29) is None  # below what 239 probes measure: no threshold, not a guess


def test_measured_threshold_is_near_its_fpir_where_the_analytic_one_is_not(held_out):
    cal, g, known_best, known_right, unknown_best = held_out
    measured = fpir_threshold(cal, FPIR, len(g.names()))
    analytic = analytic_fpir_threshold(cal, FPIR, len(g.names()))
    fpir_measured = float((unknown_best >= measured).mean())
    fpir_analytic = float((unknown_best >= analytic).mean())
    # 240 never-enrolled probes: 12 expected at FPIR 5 %; the analytic threshold names (almost) none of them
    assert 0.02 <= fpir_measured <= 0.1
    assert fpir_analytic < fpir_measured / 2 and analytic > measured
    fnir_measured = 1 - float((known_right & (known_best >= measured)).mean())
    fnir_analytic = 1 - float((known_right & (known_best >= analytic)).mean())
    assert fnir_measured < fnir_analytic


def test_a_file_without_the_curve_keeps_the_analytic_threshold(held_out):
    cal, g = held_out[:2]
    d = json.loads(cal.to_json())
    del d["open_set"]
    old = Calibration.from_json(json.dumps(d), "old.json")
    assert old.open_set == {} and old.open_set_threshold(FPIR, 30) is None
    assert fpir_threshold(old, FPIR, 30) == analytic_fpir_threshold(cal, FPIR, 30)
    assert "analytic" in threshold_note(old, FPIR, 30) and "measured" in threshold_note(cal, FPIR, 30)
