"""Cannot-link clustering (speakerlab.diarization.clustering.constrained): the local speakers of one window never
share a cluster, the threshold finds the count, counts asked for are honoured where the constraints allow."""

from __future__ import annotations

import numpy as np
import pytest

from speakerlab.diarization.clustering.cluster import SpeakerCount, normalize
from speakerlab.diarization.clustering.constrained import cluster_constrained, constrained_ahc, merges
from tests.test_vbx import plda, world  # noqa: F401 (the fixtures: a made-up embedder and its PLDA)


def windows_of(truth: np.ndarray, per_window: int = 2):
    """Rows in the order (window, local speaker) as the segmentation gives them: consecutive rows of different
    speakers share a window, at most `per_window` of them."""
    groups, w, seen = [], 0, set()
    for label in truth:
        if label in seen or len(seen) == per_window:
            w, seen = w + 1, set()
        seen.add(label)
        groups.append(w)
    return np.array(groups)


def blobs(seed: int = 0, speakers: int = 3, n: int = 90, spread: float = 0.05):
    g = np.random.default_rng(seed)
    centres = normalize(g.standard_normal((speakers, 16)))
    truth = g.integers(speakers, size=n)
    return normalize(centres[truth] + spread * g.standard_normal((n, 16))), truth


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    return len({(int(x), int(y)) for x, y in zip(a, b)}) == len(np.unique(a)) == len(np.unique(b))


def test_joins_follow_average_linkage_and_stop_at_forbidden_pairs():
    x = normalize(np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]]))
    groups = np.array([0, 1, 0, 1])  # rows 0 and 2 are one window, 1 and 3 another
    joins = merges(x, groups)
    # 0+1 and 2+3 join (closest first); then the two clusters hold rows of both windows: no third join.
    assert [(a, b) for a, b, _ in joins] == [(2, 3), (0, 1)] or [(a, b) for a, b, _ in joins] == [(0, 1), (2, 3)]
    assert len(joins) == 2 and all(d < 0.01 for _, _, d in joins)


def test_the_threshold_finds_the_speakers_and_windows_stay_apart():
    x, truth = blobs()
    groups = windows_of(truth)
    labels = constrained_ahc(x, groups, SpeakerCount(1, 20), threshold=0.5)
    assert same_partition(labels, truth) and labels[0] == 0
    for w in np.unique(groups):
        rows = labels[groups == w]
        assert len(set(rows)) == len(rows)


def test_two_rows_of_one_window_are_two_speakers_however_alike():
    x, truth = blobs(speakers=1, n=20)
    groups = np.arange(20) // 2  # pairs of rows per window: two people the embeddings cannot tell apart
    labels = constrained_ahc(x, groups, SpeakerCount(1, 20), threshold=1.0)
    assert len(np.unique(labels)) >= 2
    assert all(labels[2 * i] != labels[2 * i + 1] for i in range(10))


@pytest.mark.parametrize("count", [SpeakerCount.exactly(4), SpeakerCount.exactly(5), SpeakerCount(4, 6)])
def test_counts_asked_for_are_honoured(count):
    """Above the three speakers: joins undone. (Below: every pair of the three shares some window, so three is the
    fewest; the next test.)"""
    x, truth = blobs(seed=1, speakers=3)
    labels = constrained_ahc(x, windows_of(truth), count, threshold=0.5)
    assert count.min <= len(np.unique(labels)) <= count.max


def test_a_count_the_windows_forbid_gives_the_fewest_they_allow():
    x, truth = blobs(seed=2, speakers=3)
    groups = windows_of(truth, per_window=3)  # some window holds all three
    labels = constrained_ahc(x, groups, SpeakerCount.exactly(1), threshold=0.5)
    assert len(np.unique(labels)) == 3


@pytest.mark.parametrize("count", [SpeakerCount(), SpeakerCount.exactly(6)])
def test_vbx_started_from_constrained_ahc(world, plda, count):  # noqa: F811
    x, truth = world.conversation(5, 4, 120)
    labels = cluster_constrained(x, windows_of(truth), count, "vbx", 0.5, plda)
    k = len(np.unique(labels))
    assert count.min <= k <= count.max and labels[0] == 0
    if not count.fixed:
        assert k == 4
    with pytest.raises(ValueError, match="ahc or vbx"):
        cluster_constrained(x, windows_of(truth), count, "spectral", 0.5, plda)


def test_the_segmentation_way_has_its_own_vbx_stay_probability():
    """VBx on (window, local speaker) embeddings runs with seg_loop_p (default 0: they interleave the local speakers
    of each window), VBx on sub-segments with loop_p; both checked like loop_p."""
    from speakerlab.diarization.cli import parser
    from speakerlab.diarization.pipeline import DiarizeOptions

    options = DiarizeOptions()
    assert options.seg_vbx.loop_p == 0.0 and options.vbx.loop_p == 0.5
    assert options.seg_vbx.fa == options.vbx.fa and options.seg_vbx.init_threshold == options.vbx.init_threshold
    assert DiarizeOptions(vbx_init=0.7).seg_vbx.init_threshold == 0.7
    with pytest.raises(ValueError, match="loop_p"):
        DiarizeOptions(seg_loop_p=1.0)
    args = parser().parse_args(["a.wav", "--onnx", "m.onnx", "--seg-loop-p", "0.3", "--vbx-init", "0.5"])
    assert args.seg_loop_p == 0.3 and args.vbx_init == 0.5
