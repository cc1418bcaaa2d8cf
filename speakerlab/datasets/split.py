"""A speaker-disjoint split of a corpus into training, validation and test speakers, and a balanced trial list
over held-out speakers, both seeded (used by `python -m speakerlab.datasets.folder.cli`).

Held-out sizes (`split_sizes`), when not given: the test split takes a quarter of the speakers, at most
max(40, a tenth) of them, at least 2; the validation split (model selection while training) half as many as
the test split, none when that is fewer than 2. So 12 speakers give 3 test speakers and no validation split,
90 give 22 and 11, 200 give 40 and 20, 1,000 give 100 and 50. An EER needs about `MIN_SPEAKERS` speakers
(speakerlab.dataio.tables.trials) to tell models apart: a quarter of the speakers is what reaches it at 80 speakers
while leaving most of them for training, and beyond 40 (or a tenth) more test speakers cost training data for
an interval that is already narrow (about +-33% of the EER at 40 speakers, speakerlab.scoring.interval).
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from speakerlab.datasets.common import DatasetError

ENUMERATE_PAIRS = 1_000_000  # up to this many candidate pairs are listed and drawn from; beyond, drawn one by one


def _count(size: float, n: int) -> int:
    """A count (>= 1) as given, or a fraction (< 1) of n speakers."""
    return int(size) if size >= 1 else int(round(size * n))


def split_sizes(n: int, test: Optional[float] = None, val: Optional[float] = None) -> Tuple[int, int]:
    """(test, validation) speaker counts of n speakers: `test`, `val` a count (>= 1), a fraction (< 1; val 0: no
    validation split) or None for the sizes of the module docstring."""
    n_test = _count(test, n) if test is not None else max(2, min(round(n / 4), max(40, round(n / 10))))
    n_val = _count(val, n) if val is not None else (n_test // 2 if n_test // 2 >= 2 and n - n_test >= 2 + 2 else 0)
    return n_test, n_val


def split_speakers(
    speakers: Sequence[str], test: Optional[float], seed: int, val: Optional[float] = None
) -> Tuple[List[str], List[str], List[str]]:
    """(train, validation, test) speaker ids, disjoint, of sizes `split_sizes`: the test split at least 2, the
    validation split none or at least 2, training at least 2. The test speakers are the same whatever `val`."""
    n_test, n_val = split_sizes(len(speakers), test, val)
    if n_test < 2 or len(speakers) - n_test - n_val < 2 or n_val == 1:
        raise DatasetError(
            f"{len(speakers)} usable speakers cannot give {n_test} test speakers, "
            f"{n_val} validation speakers and at least 2 training speakers (--test-speakers "
            f"{'auto' if test is None else f'{test:g}'}, --val-speakers {'auto' if val is None else f'{val:g}'}; "
            "the test set needs at least 2, a validation set 0 or at least 2)"
        )
    order = np.random.default_rng([seed, 1]).permutation(len(speakers))
    ids = sorted(speakers)
    chosen = {ids[i] for i in order[:n_test]}
    held = {ids[i] for i in order[n_test : n_test + n_val]}
    return [s for s in ids if s not in chosen | held], sorted(held), sorted(chosen)


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
        raise DatasetError(f"the held-out speakers have no {kind}target pairs (two utterances of one speaker)")

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
        kind = "cross-session " if sessions else ""
        note = (
            f"only {k} {kind}target pairs exist: {k + len(nontargets)} trials ({k} target, {len(nontargets)} "
            f"nontarget) of the {n} asked for"
        )
    trials = [(*sorted(p), True) for p in targets] + [(*sorted(p), False) for p in nontargets]
    return sorted(trials), note
