"""Clustering of long recordings (diarization.clustering.cluster, `max_units`): units of neighbouring sub-segments
clustered, then every sub-segment assigned to its nearest speaker, giving what clustering every sub-segment gives,
speaker changes inside a unit included, and the counts asked for. The time and memory it saves are measured by
bench/diarization_scale.py, not here."""

from __future__ import annotations

import numpy as np
import pytest

from speakerlab.diarization.clustering.cluster import (
    MAX_NEIGHBOURS,
    SpeakerCount,
    cluster,
    group_neighbours,
    normalize,
    pruned_affinity,
    unit_means,
)


def turns_of_speakers(seed: int, speakers: int, n: int, dim: int = 32, noise: float = 0.6):
    """`(n, dim)` embeddings of a conversation: turns of 3-25 sub-segments, each of a random other speaker
    (a centre on the unit sphere plus Gaussian noise of `noise` per unit length), and the true labels."""
    g = np.random.default_rng(seed)
    centres = g.standard_normal((speakers, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels, who = [], 0
    while len(labels) < n:
        who = (who + 1 + g.integers(speakers - 1)) % speakers
        labels += [who] * int(g.integers(3, 26))
    labels = np.array(labels[:n])
    x = centres[labels] + noise / np.sqrt(dim) * g.standard_normal((n, dim))
    return x.astype(np.float32), labels


def coloured_turns(seed: int, speakers: int, n: int, dim: int = 32, colour: float = 1.2, noise: float = 0.8):
    """`(n, dim)` embeddings of short turns (1-8 sub-segments), each turn coloured by an offset of its own as strong
    as the speaker's direction (a turn's channel and words: what neighbouring sub-segments share), consecutive
    sub-segments sharing half their noise (windows overlap by half); and the true labels."""
    g = np.random.default_rng(seed)
    centres = normalize(g.standard_normal((speakers, dim)))
    labels, turn, who = [], [], 0
    while len(labels) < n:
        who = (who + 1 + g.integers(speakers - 1)) % speakers
        m = int(g.integers(1, 9))
        labels += [who] * m
        turn += [turn[-1] + 1 if turn else 0] * m
    labels, turn = np.array(labels[:n]), np.array(turn[:n])
    colours = colour / np.sqrt(dim) * g.standard_normal((turn.max() + 1, dim))
    e = g.standard_normal((n + 1, dim))
    x = centres[labels] + colours[turn] + noise / np.sqrt(dim) * (e[:-1] + e[1:]) / np.sqrt(2)
    return x.astype(np.float32), labels


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of rows with the same label after the best one-to-one renaming (Hungarian)."""
    from scipy.optimize import linear_sum_assignment

    table = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(table, (a, b), 1)
    rows, cols = linear_sum_assignment(-table)
    return table[rows, cols].sum() / len(a)


def test_neighbours_are_grouped_in_runs_of_equal_size():
    x = np.zeros((1001, 4))
    unit_of = group_neighbours(x, 100)  # ceil(1001 / 100) = 11 per unit: 91 units
    assert unit_of.max() + 1 == 91 and np.all(np.diff(unit_of) >= 0) and np.bincount(unit_of).max() == 11


@pytest.mark.parametrize("method", ["spectral", "ahc"])
def test_capped_clustering_finds_what_full_clustering_finds(method):
    """1200 sub-segments, units of 8 (max_units 150): most units hold a speaker change, yet the labels agree
    with the uncapped clustering's and with the truth on >= 97 % of the sub-segments."""
    x, truth = turns_of_speakers(0, 5, 1200)
    full = cluster(x, SpeakerCount(1, 10), method, max_units=0)
    capped = cluster(x, SpeakerCount(1, 10), method, max_units=150)
    unit_of = group_neighbours(x, 150)
    mixed = sum(len(np.unique(truth[unit_of == u])) > 1 for u in np.unique(unit_of))
    assert mixed > 0.2 * (unit_of.max() + 1)  # the units do straddle speaker changes
    assert len(np.unique(capped)) == len(np.unique(full)) == 5
    assert agreement(capped, full) >= 0.97 and agreement(capped, truth) >= 0.97


def test_capped_spectral_clusters_a_sub_segment_of_each_unit_not_their_mean():
    """6,000 sub-segments of 8 speakers in coloured turns of 1-8, units of 8 (max_units 750): averaged, each unit mixes
    turns and their colours into one smooth chain whose eigengap says one speaker (as means did on a real 3-hour
    conversation, bench/RESULTS.md); each unit's first sub-segment keeps the speakers apart: 8 found, >= 0.9 agree."""
    x, truth = coloured_turns(0, 8, 6000)
    count = SpeakerCount(1, 20)
    capped = cluster(x, count, "spectral", max_units=750)
    assert len(np.unique(capped)) == 8 and agreement(capped, truth) >= 0.9
    means = cluster(unit_means(normalize(x), group_neighbours(x, 750)), count, "spectral", max_units=0)
    assert len(np.unique(means)) == 1


@pytest.mark.parametrize(
    "count", [SpeakerCount.exactly(3), SpeakerCount.exactly(7), SpeakerCount(6, 9), SpeakerCount(1, 4)]
)
def test_capped_clustering_honours_the_count(count):
    x, _ = turns_of_speakers(1, 5, 900)
    k = len(np.unique(cluster(x, count, "spectral", max_units=100)))
    assert count.min <= k <= count.max


def test_spectral_pruning_keeps_a_fraction_of_neighbours_up_to_a_cap():
    """`pruning` x N neighbours per row (10 of 100 rows), but never more than MAX_NEIGHBOURS however long the
    recording (1000 rows: 30, not 100), each row's strongest ones."""
    g = np.random.default_rng(0)
    for n, keep in ((100, 10), (1000, MAX_NEIGHBOURS)):
        x = g.standard_normal((n, 8))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        kept = pruned_affinity(x, 0.1) > 0
        # Symmetrised: a row holds its own strongest `keep` (those with positive cosine) and the rows that kept it.
        own = np.clip(x @ x.T, 0, None)
        top = np.argsort(-own, axis=1, kind="stable")[:, :keep]
        assert np.all(np.take_along_axis(kept, top, axis=1) | (np.take_along_axis(own, top, axis=1) == 0))
        assert kept.sum() <= 2 * n * keep
