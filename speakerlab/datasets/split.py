"""A speaker-disjoint split of a corpus and a balanced trial list over held-out speakers, both seeded (used
by `python -m speakerlab.datasets.folder`)."""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.datasets.common import DatasetError

ENUMERATE_PAIRS = 1_000_000  # up to this many candidate pairs are listed and drawn from; beyond, drawn one by one


def split_speakers(speakers: Sequence[str], test: float, seed: int) -> Tuple[List[str], List[str]]:
    """(train, test) speaker ids, disjoint: `test` >= 1 is a count, < 1 a fraction (at least 2)."""
    n = int(test) if test >= 1 else max(2, int(round(test * len(speakers))))
    if n < 2 or len(speakers) - n < 2:
        raise DatasetError(
            f"{len(speakers)} usable speakers cannot give {n} test speakers and at least 2 training speakers "
            f"(--test-speakers {test:g}; the test set needs at least 2)"
        )
    order = np.random.default_rng([seed, 1]).permutation(len(speakers))
    ids = sorted(speakers)
    chosen = {ids[i] for i in order[:n]}
    return [s for s in ids if s not in chosen], sorted(chosen)


def _draw_pairs(count: int, k: int, enumerate_all, draw_one, rng: np.random.Generator) -> List[Tuple[str, str]]:
    """k distinct unordered pairs out of `count` valid ones: listed and drawn from when few, else drawn
    one at a time by `draw_one(rng)` (a valid pair or None) until k distinct ones are found."""
    if k <= 0:
        return []
    if count <= ENUMERATE_PAIRS or 2 * k >= count:
        pairs = list(enumerate_all())
        pick = rng.choice(len(pairs), size=k, replace=False)
        return [pairs[i] for i in sorted(pick)]
    found = set()
    while len(found) < k:
        pair = draw_one(rng)
        if pair is not None:
            found.add(tuple(sorted(pair)))
    return sorted(found)


def make_trials(
    spk2utt: Dict[str, List[str]], sessions: Optional[Dict[str, str]], n: int, seed: int
) -> Tuple[List[Tuple[str, str, bool]], str]:
    """Balanced trials over the speakers' utterances: (trials sorted, a note when fewer than n/2 target
    pairs exist). Target pairs join two utterances of a speaker (of different sessions when `sessions`
    maps utterances to sessions), nontarget pairs two speakers."""
    rng = np.random.default_rng([seed, 2])
    speakers = sorted(spk2utt)

    def valid_targets(utts):
        return [(a, b) for a, b in combinations(sorted(utts), 2) if sessions is None or sessions[a] != sessions[b]]

    def n_targets(utts):
        m = len(utts)
        same = sum(c * c for c in Counter(sessions[u] for u in utts).values()) if sessions else m
        return (m * m - same) // 2

    per_spk = np.array([n_targets(spk2utt[s]) for s in speakers], np.float64)
    total_t = int(per_spk.sum())
    if total_t == 0:
        kind = "cross-session " if sessions else ""
        raise DatasetError(f"the test speakers have no {kind}target pairs (two utterances of one speaker)")

    def draw_target(g):
        s = speakers[int(g.choice(len(speakers), p=per_spk / per_spk.sum()))]
        a, b = g.choice(len(spk2utt[s]), size=2, replace=False)
        a, b = spk2utt[s][a], spk2utt[s][b]
        return (a, b) if sessions is None or sessions[a] != sessions[b] else None

    k = min(n // 2, total_t)
    targets = _draw_pairs(
        total_t, k, lambda: (p for s in speakers for p in valid_targets(spk2utt[s])), draw_target, rng
    )
    utts = [(u, s) for s in speakers for u in spk2utt[s]]
    total_n = len(utts) * (len(utts) - 1) // 2 - sum(len(v) * (len(v) - 1) // 2 for v in spk2utt.values())

    def draw_nontarget(g):
        i, j = g.choice(len(utts), size=2, replace=False)
        return (utts[i][0], utts[j][0]) if utts[i][1] != utts[j][1] else None

    def all_nontargets():
        return ((a, b) for (a, sa), (b, sb) in combinations(sorted(utts), 2) if sa != sb)

    nontargets = _draw_pairs(total_n, min(k, total_n), all_nontargets, draw_nontarget, rng)
    note = ""
    if k < n // 2:
        note = f"only {k} {'cross-session ' if sessions else ''}target pairs exist: {k} of the {n // 2} asked for"
    trials = [(*sorted(p), True) for p in targets] + [(*sorted(p), False) for p in nontargets]
    return sorted(trials), note
