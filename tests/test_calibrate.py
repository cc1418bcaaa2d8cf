"""speakerlab-calibrate and its file: the fit measured on a held-out list, min-Cllr by PAV, the operating points,
the file's checks (format, model digest, a FAR it cannot give), refusals of mixed or anonymous embeddings."""

from __future__ import annotations

import json
import math
from itertools import product

import numpy as np
import pytest

from speakerlab.dataio.tables.embeddings import embeddings_model_id, read_embeddings, write_embeddings
from speakerlab.scoring.calibrate import main
from speakerlab.scoring.calibration import QMF, act_dcf, cllr, min_cllr
from speakerlab.scoring.calibration_file import CalibrationError, read_calibration
from tests.calibration_data import make_set


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("cal")
    make_set(root, "cal", 20, 8, seed=0)
    make_set(root, "ev", 20, 8, seed=1)
    return root


def calibrate(root, *extra) -> int:
    args = ["--trials", root / "cal/trials", "--embeddings", root / "cal.npz", "--durations", root / "cal", root / "ev"]
    return main([str(a) for a in [*args, "--ci-replicates", "200", *extra]])


def test_fit_on_one_list_is_calibrated_on_another(sets, capsys):
    out = sets / "calibration.json"
    assert calibrate(sets, "--eval-trials", sets / "ev/trials", "--eval-embeddings", sets / "ev.npz", "--out", out) == 0
    cal = read_calibration(out)
    held = cal.metrics[str(sets / "ev/trials")]
    # Held out: the LLRs lose little to the best monotone map of themselves, and the Bayes decisions little to the
    # best threshold at the prior the fit was weighted for.
    assert held["min_cllr"] <= held["cllr"] < held["min_cllr"] + 0.05
    assert held["act_dcf"]["0.01"] <= 1.25 * held["min_dcf"]["0.01"]
    far = held["far_at"]["far=0.01"]
    assert far["ci"]["low"] <= 0.01 <= far["ci"]["high"] and far["ci"]["low"] < far["far"] < far["ci"]["high"]
    assert cal.fitted_on["n_trials"] == 160 * 159 // 2 and cal.model_id == "m" * 64
    assert cal.features[1:3] == ["logdur_min", "logdur_max"]
    # The stored point is measured on the fitting list; the curve gives it back and interpolates between points.
    point = cal.operating_points["far=0.01"]
    assert abs(point["p_fa"] - 0.01) < 0.001 and cal.threshold(0.01) == point["llr"]
    assert cal.threshold(0.005) > point["llr"] > cal.threshold(0.05)
    assert cal.operating_points["far=0.001"]["llr"] is not None  # 12,160 nontargets measure it: 12 above the threshold
    assert "Cllr" in capsys.readouterr().out


def test_min_cllr_is_pav_and_bounds_cllr():
    rng = np.random.default_rng(3)
    y = rng.random(4000) < 0.3
    s = rng.normal(2.0 * y, 1.0)
    true_llr = 2.0 * s - 2.0  # N(2, 1) against N(0, 1)
    assert min_cllr(s, y) <= cllr(true_llr, y) < min_cllr(s, y) + 0.02
    assert min_cllr(s, y) == pytest.approx(min_cllr(np.exp(s), y))  # a monotone map changes nothing
    # Tiny list against a brute force over monotone step posteriors: the optimum pools the violators.
    scores, labels = np.array([0.1, 0.2, 0.3, 0.4]), np.array([False, True, False, True])
    best = math.inf
    for post in product([0.0, 0.5, 1.0], repeat=4):
        if list(post) != sorted(post):
            continue
        p = np.clip(np.array(post), 1e-12, 1 - 1e-12)
        best = min(best, cllr(np.log(p / (1 - p)), labels))
    assert min_cllr(scores, labels) == pytest.approx(best, abs=1e-6)


def test_the_file_refuses_another_model_format_or_far(sets, tmp_path):
    out = tmp_path / "c.json"
    assert calibrate(sets, "--out", out) == 0
    cal = read_calibration(out)
    cal.check_model("m" * 64, "here")
    with pytest.raises(CalibrationError, match="calibration of model mmmmmmmmmmmm, not of this model xxxx"):
        cal.check_model("x" * 64, "here")
    with pytest.raises(CalibrationError, match="FAR 1e-05 was not measurable"):
        cal.threshold(1e-5)
    small = tmp_path / "small.json"  # 4 speakers x 3 files: 54 nontarget trials, FAR 0.1 % is not measurable
    anon = make_set(tmp_path, "few", 4, 3, seed=6)
    assert (
        main([str(a) for a in ["--trials", anon / "trials", "--embeddings", tmp_path / "few.npz", "--out", small]]) == 0
    )
    assert read_calibration(small).operating_points["far=0.001"]["llr"] is None
    bad = json.loads(out.read_text())
    bad["format"] = "speakerlab.calibration/9"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(CalibrationError, match="bad.json: calibration format 'speakerlab.calibration/9'"):
        read_calibration(tmp_path / "bad.json")


def test_embeddings_of_two_models_or_of_none_are_refused(sets, tmp_path, capsys):
    other = make_set(tmp_path, "ev", 4, 3, seed=5, model_id="o" * 64)
    args = ["--eval-trials", other / "trials", "--eval-embeddings", tmp_path / "ev.npz", "--out", tmp_path / "c.json"]
    assert calibrate(sets, *args) == 2
    assert "embeddings of model oooooooooooo" in capsys.readouterr().err
    anon = make_set(tmp_path, "an", 4, 3, seed=6, model_id="")
    assert main(["--trials", str(anon / "trials"), "--embeddings", str(tmp_path / "an.npz"), "--out", "x.json"]) == 2
    assert "without a model digest" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_an_output_over_an_input_is_refused_and_the_input_kept(sets, tmp_path, capsys):
    """--out naming a trial list, an embeddings file or a data dir's utt2dur that the command reads: one line naming
    it, exit 2, the input as it was."""
    for victim in (sets / "cal/trials", sets / "cal.npz", sets / "ev/utt2dur"):
        before = victim.read_bytes()
        assert calibrate(sets, "--out", victim) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: {victim}: an input of this command; writing an output there would replace it"]
        assert victim.read_bytes() == before


def test_eval_lists_need_names_of_their_own(sets, tmp_path, capsys):
    """Each --eval-trials list's metrics are stored under its name: a repeated name (or list given twice, as with two
    croppings' embeddings of one list) or the fitting lists' 'fit' is refused before the work, not one replacing
    another's."""
    ids, emb = read_embeddings(sets / "ev.npz")
    crops = write_embeddings(tmp_path / "ev_crops.npz", ids, emb * 2, model_id=embeddings_model_id(sets / "ev.npz"))
    ev = ["--eval-trials", sets / "ev/trials", sets / "ev/trials", "--eval-embeddings", sets / "ev.npz", crops]
    out = tmp_path / "c.json"
    for names, said in (
        ([], f"--eval-trials (give --eval-names): '{sets / 'ev/trials'}' names two lists' metrics"),
        (["--eval-names", "a", "a"], "--eval-names: 'a' names two lists' metrics"),
        (["--eval-names", "a", "fit"], "--eval-names: 'fit' names two lists' metrics ('fit' is the fitting lists')"),
    ):
        with pytest.raises(SystemExit) as e:
            calibrate(sets, *ev, *names, "--out", out)
        assert e.value.code == 2 and said in capsys.readouterr().err
    assert not out.exists()
    assert calibrate(sets, *ev, "--eval-names", "full", "again", "--out", out) == 0
    assert set(read_calibration(out).metrics) == {"fit", "full", "again"}


def test_an_eval_list_that_was_fitted_on_is_refused(sets, tmp_path, capsys):
    """An --eval-trials list with the bytes of a --trials list (a copy, as a recipe's --cal_set of the test dir gives)
    would be reported as held out: one line naming both, nothing written."""
    copy = tmp_path / "trials"
    copy.write_bytes((sets / "cal/trials").read_bytes())
    out = tmp_path / "c.json"
    assert calibrate(sets, "--eval-trials", copy, "--eval-embeddings", sets / "cal.npz", "--out", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {copy}: the trials of --trials {sets / 'cal/trials'}, fitted on: not held out; measure on another list"
    ]
    assert not out.exists()


def test_prior_weighting_serves_the_prior_it_was_fitted_at():
    # Target scores wider than nontarget ones: the true LLR is quadratic in the score, so a linear calibration can be
    # right near one operating point only. Weighted at p = 0.01 (the recipe's prior, speakerlab-calibrate's default
    # fit prior) the fit puts it where decisions at 0.01 are made; weighted at 0.5, at the equal-prior point.
    rng = np.random.default_rng(0)

    def draw(n):
        y = rng.random(n) < 0.3
        return np.where(y, rng.normal(2.5, 2.0, n), rng.normal(0.0, 1.0, n))[:, None], y

    x, y = draw(40000)
    x_held, y_held = draw(40000)
    at = {p: QMF(prior=p).fit(x, y).llr(x_held) for p in (0.01, 0.5)}
    assert act_dcf(at[0.01], y_held, 0.01) < 0.85 * act_dcf(at[0.5], y_held, 0.01)
    assert act_dcf(at[0.5], y_held, 0.5) <= act_dcf(at[0.01], y_held, 0.5)
