import numpy as np
import pytest

from speakerlab.scoring.metrics import compute_eer, compute_min_dcf, verification_metrics
from speakerlab.scoring.scorer import Scorer


def brute_force(scores, labels, p_target=0.01):
    """Every candidate threshold, one at a time (the definition, no cleverness)."""
    tar, non = scores[labels], scores[~labels]
    best_gap, eer, dcf = None, None, np.inf
    for thr in np.concatenate([np.unique(scores), [np.inf]]):
        p_miss = np.mean(tar < thr)
        p_fa = np.mean(non >= thr)
        dcf = min(dcf, (p_miss * p_target + p_fa * (1 - p_target)) / min(p_target, 1 - p_target))
        if best_gap is None or abs(p_miss - p_fa) < best_gap:
            best_gap, eer = abs(p_miss - p_fa), (p_miss + p_fa) / 2
    return eer, dcf, best_gap


@pytest.mark.parametrize("p_target", [0.01, 0.05])
@pytest.mark.parametrize("seed", range(6))
def test_eer_and_min_dcf_match_brute_force(seed, p_target):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 400))
    labels = rng.random(n) < 0.3
    scores = rng.normal(labels * 1.5, 1.0)
    if seed % 2:  # ties, as with quantised scores
        scores = np.round(scores, 1)
    if seed % 3 == 2:  # float32 scores, as the scorer gives, keep their own precision
        scores = scores.astype(np.float32)
    eer_bf, dcf_bf, gap = brute_force(scores, labels, p_target)
    # Our EER interpolates at the crossing; it lies within the brute-force gap of the nearest point.
    assert abs(compute_eer(scores, labels) - eer_bf) <= gap / 2 + 1e-12
    assert compute_min_dcf(scores, labels, p_target) == pytest.approx(dcf_bf, abs=1e-12)
    both = verification_metrics(scores, labels, (0.01, 0.05))
    assert both["eer"] == compute_eer(scores, labels)
    assert both["min_dcf"][p_target] == compute_min_dcf(scores, labels, p_target)


def test_eer_known_values():
    assert compute_eer([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 0.0
    assert compute_eer([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 1.0
    # One target below one nontarget out of 2+2: p_miss and p_fa cross at 0.5.
    assert compute_eer([0.9, 0.3, 0.5, 0.1], [1, 1, 0, 0]) == pytest.approx(0.5)


def test_metrics_need_both_classes():
    with pytest.raises(ValueError, match="need target and nontarget"):
        compute_eer([0.1, 0.2], [1, 1])


def test_cosine_scores_vectorised_equals_loop(tmp_path):
    rng = np.random.default_rng(0)
    ids = [f"u{i}" for i in range(20)]
    emb = rng.standard_normal((20, 8)).astype(np.float32)
    p = tmp_path / "trials"
    pairs = sorted({(int(a), int(b)) for a, b in rng.integers(0, 20, (50, 2))})  # a list names a pair once
    p.write_text("".join(f"u{a} u{b} {'target' if a % 2 == b % 2 else 'nontarget'}\n" for a, b in pairs))
    scorer = Scorer(ids, emb)
    got = scorer.scores(scorer.trial_list(p))
    want = [float(emb[a] @ emb[b] / np.linalg.norm(emb[a]) / np.linalg.norm(emb[b])) for a, b in pairs]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_operating_points_match_brute_force(seed):
    """Threshold at the EER (smallest |P_miss - P_fa|, the lowest on a tie) and the lowest threshold whose
    false-alarm rate is at most 1 % / 0.1 %, each with its rates: every distinct score tried in turn."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(300, 3000))
    labels = rng.random(n) < 0.2
    scores = rng.normal(labels * 2.0, 1.0)
    if seed % 2:
        scores = np.round(scores, 1)  # ties across classes
    if seed % 3 == 2:
        scores = scores.astype(np.float32)
    tar, non = scores[labels], scores[~labels]
    candidates = sorted(set(scores.tolist()))
    rates = [(t, float(np.mean(tar < t)), float(np.mean(non >= t))) for t in candidates]
    m = verification_metrics(scores, labels)
    gaps = [abs(pm - pf) for _, pm, pf in rates]
    t, pm, pf = rates[int(np.argmin(gaps))]
    assert m["eer_point"] == {"threshold": t, "p_miss": pm, "p_fa": pf}
    for rate in (0.01, 0.001):
        ok = [r for r in rates if r[2] <= rate]
        want = ok[0] if ok else (float("inf"), 1.0, 0.0)  # none: the point that accepts nothing
        assert m["fa_points"][rate] == {"threshold": want[0], "p_miss": want[1], "p_fa": want[2]}
