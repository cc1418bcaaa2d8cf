"""Synthetic embeddings for the calibration and identification tests: speakers as random directions, utterances as
a speaker's direction plus noise that grows as the utterance gets shorter (so durations carry information, as in
real speech), written as a data dir (utt2spk, utt2dur, trials) and an embeddings .npz with a model digest."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np

from speakerlab.dataio.tables.embeddings import write_embeddings

DIM = 32


def make_set(root: Path, name: str, speakers: int, utts: int, seed: int, model_id: str = "m" * 64) -> Path:
    """`root/name`: utt2spk, utt2dur (1-8 s), every trial of the set, and `root/name.npz` (embeddings)."""
    rng = np.random.default_rng(seed)
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    ids, emb, spk, dur = [], [], [], []
    for s in range(speakers):
        centre = rng.standard_normal(DIM)
        centre /= np.linalg.norm(centre)
        for u in range(utts):
            seconds = float(rng.choice([1.0, 2.0, 4.0, 8.0]))
            noise = rng.standard_normal(DIM) * 0.9 / np.sqrt(DIM * seconds / 2)
            ids.append(f"{name}-s{s}-u{u}")
            emb.append((centre + noise) * rng.uniform(5, 15))
            spk.append(f"{name}-s{s}")
            dur.append(seconds)
    (d / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in zip(ids, spk)))
    (d / "utt2dur").write_text("".join(f"{u} {x}\n" for u, x in zip(ids, dur)))
    trials = [
        f"{ids[i]} {ids[j]} {'target' if spk[i] == spk[j] else 'nontarget'}"
        for i, j in combinations(range(len(ids)), 2)
    ]
    (d / "trials").write_text("\n".join(trials) + "\n")
    write_embeddings(root / f"{name}.npz", ids, np.asarray(emb, np.float32), model_id=model_id)
    return d
