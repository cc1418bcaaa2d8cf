"""Mean subtraction, AS-norm and QMF calibration against direct (looped) implementations."""

import math

import numpy as np
import pytest

from speakerlab.dataio.tables.trials import TrialList
from speakerlab.scoring.calibration import QMF, act_dcf, cllr, logistic_fit, qmf_features
from speakerlab.scoring.norm import Cohort, asnorm, cohort_stats
from speakerlab.scoring.scorer import Scorer, cosine_trial_scores


def _cos(x, y):
    return float(np.dot(x, y) / math.sqrt(np.dot(x, x) * np.dot(y, y)))


def _trials(scorer, pairs):
    a = np.array([p[0] for p in pairs], np.int32)
    b = np.array([p[1] for p in pairs], np.int32)
    return TrialList("t", scorer.index, a, b, np.zeros(len(a), bool), np.arange(1, len(a) + 1, dtype=np.int32))


def _setup(seed=0, n=12, c=40, d=6):
    rng = np.random.default_rng(seed)
    emb = (rng.standard_normal((n, d)) + 0.5).astype(np.float32)
    cohort = (rng.standard_normal((c, d)) + 0.5).astype(np.float32)
    c_ids = [f"c{i}" for i in range(c)]
    u2s = {u: f"spk{i % 9}" for i, u in enumerate(c_ids)}  # 9 speakers, uneven counts
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, n, (30, 2))]
    return [f"e{i}" for i in range(n)], emb, c_ids, cohort, u2s, pairs


@pytest.mark.parametrize("threads", [1, 2])
def test_cosine_scores_equal_loop(threads):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    a, b = rng.integers(0, 50, 20000), rng.integers(0, 50, 20000)
    got = cosine_trial_scores(x, a, b, threads=threads)
    want = [_cos(x[i], x[j]) for i, j in zip(a[:500], b[:500])]
    np.testing.assert_allclose(got[:500], want, atol=1e-6)
    np.testing.assert_array_equal(got, cosine_trial_scores(x, a, b, threads=1))


def test_mean_subtraction_equals_loop():
    ids, emb, c_ids, cohort, u2s, pairs = _setup()
    scorer = Scorer(ids, emb, Cohort(c_ids, cohort, mean_sub=True))
    got = scorer.scores(_trials(scorer, pairs))
    mean = [sum(float(cohort[i, k]) for i in range(len(cohort))) / len(cohort) for k in range(cohort.shape[1])]
    want = [_cos(emb[a] - np.array(mean), emb[b] - np.array(mean)) for a, b in pairs]
    np.testing.assert_allclose(got, want, atol=1e-5)
    plain = Scorer(ids, emb).scores(_trials(scorer, pairs))
    assert np.abs(plain - got).max() > 1e-3  # the subtraction changed something


def _asnorm_loop(emb, c_ids, cohort, u2s, pairs, top_n):
    """AS-norm by its definition, one trial at a time."""
    speakers = sorted(set(u2s.values()))
    means = []
    for s in speakers:
        rows = [cohort[i] / np.linalg.norm(cohort[i]) for i, u in enumerate(c_ids) if u2s[u] == s]
        means.append(np.sum(rows, axis=0))

    def stats(x):
        top = sorted((_cos(x, m) for m in means), reverse=True)[:top_n]
        mu = sum(top) / len(top)
        return mu, math.sqrt(sum((t - mu) ** 2 for t in top) / len(top))

    out = []
    for a, b in pairs:
        s = _cos(emb[a], emb[b])
        (mu_a, sd_a), (mu_b, sd_b) = stats(emb[a]), stats(emb[b])
        out.append(0.5 * ((s - mu_a) / sd_a + (s - mu_b) / sd_b))
    return out


@pytest.mark.parametrize("top_n", [1 + 2, 5, 100])
def test_asnorm_equals_loop(top_n):
    ids, emb, c_ids, cohort, u2s, pairs = _setup(seed=top_n)
    scorer = Scorer(ids, emb, Cohort(c_ids, cohort, u2s, top_n=top_n))
    got = scorer.scores(_trials(scorer, pairs))
    want = _asnorm_loop(emb, c_ids, cohort, u2s, pairs, min(top_n, 9))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_asnorm_formula_on_given_stats():
    s = np.array([0.5, -0.2])
    mu, sd = np.array([0.1, 0.2, 0.3]), np.array([0.5, 1.0, 2.0])
    got = asnorm(s, np.array([0, 1]), np.array([2, 0]), mu, sd)
    want = [0.5 * ((0.5 - 0.1) / 0.5 + (0.5 - 0.3) / 2.0), 0.5 * ((-0.2 - 0.2) / 1.0 + (-0.2 - 0.1) / 0.5)]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cohort_stats_blocks_do_not_matter():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((37, 4)).astype(np.float32)
    c = rng.standard_normal((11, 4)).astype(np.float32)
    one = cohort_stats(x, c, 4, block=1000)
    many = cohort_stats(x, c, 4, block=3)
    np.testing.assert_allclose(one[0], many[0])
    np.testing.assert_allclose(one[1], many[1])


def _duration_case(n, seed):
    """Scores whose target / nontarget means drift with duration: short utterances score lower."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.3
    logdur = rng.uniform(np.log(1.0), np.log(20.0), (n, 2))
    short = np.log(20.0) - logdur.min(axis=1)  # 0 (long) .. 3 (short)
    s = np.where(y, 3.0 - 0.9 * short, -1.0 - 0.3 * short) + rng.standard_normal(n) * (0.5 + 0.3 * short)
    feats = np.stack([s, logdur.min(axis=1), logdur.max(axis=1)], axis=1)
    return feats, y


def test_qmf_with_duration_improves_cllr():
    train, y_train = _duration_case(4000, 0)
    test, y_test = _duration_case(4000, 1)
    score_only = QMF().fit(train[:, :1], y_train)
    with_dur = QMF().fit(train, y_train)
    c_score = cllr(score_only.llr(test[:, :1]), y_test)
    c_dur = cllr(with_dur.llr(test), y_test)
    assert c_dur < c_score - 0.02
    assert c_score < 1.0  # both are calibrated: better than an uninformative LLR of 0


def test_logistic_fit_reaches_the_optimum():
    """At the solution the gradient of the prior-weighted cross-entropy is zero."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((500, 2))
    y = rng.random(500) < 1 / (1 + np.exp(-(1.5 * x[:, 0] - x[:, 1])))
    theta = logistic_fit(x, y, prior=0.5, l2=0.0)
    xb = np.hstack([x, np.ones((500, 1))])
    p = 1 / (1 + np.exp(-(xb @ theta)))
    w = np.where(y, 0.5 / y.sum(), 0.5 / (~y).sum())
    assert np.abs(xb.T @ (w * (p - y))).max() < 1e-8


def test_cllr_and_act_dcf_reference_points():
    y = np.array([True, True, False, False])
    assert cllr(np.zeros(4), y) == pytest.approx(1.0)
    assert cllr(np.array([50.0, 50.0, -50.0, -50.0]), y) == pytest.approx(0.0, abs=1e-12)
    assert act_dcf(np.array([9.0, 9.0, -9.0, -9.0]), y, 0.01) == 0.0
    assert act_dcf(np.zeros(4), y, 0.01) == pytest.approx(1.0)  # all rejected at p 0.01: p_miss 1


def test_qmf_features_are_symmetric():
    norms = np.array([1.0, 2.0, 3.0])
    logdur = np.array([0.5, 0.1, 0.9])
    f = qmf_features(np.array([0.3, 0.3]), np.array([0, 2]), np.array([2, 0]), norms, logdur)
    np.testing.assert_array_equal(f[0], f[1])
    np.testing.assert_array_equal(f[0], [0.3, 0.5, 0.9, 1.0, 3.0])


def test_read_durations_from_files_and_data_dirs(tmp_path):
    from speakerlab.dataio.tables.lists import ListError
    from speakerlab.scoring.calibration import read_durations

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "utt2num_samples").write_text("u1 32000\nu2 8000\n")
    (tmp_path / "utt2dur").write_text("u3 1.5\n")
    assert read_durations([tmp_path / "d", tmp_path / "utt2dur"]) == {"u1": 2.0, "u2": 0.5, "u3": 1.5}
    (tmp_path / "bad").write_text("u4 -1\n")
    with pytest.raises(ListError, match=f"{tmp_path / 'bad'}:1: duration must be a positive number"):
        read_durations([tmp_path / "bad"])
