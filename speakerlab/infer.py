"""Embeddings of audio files, or the cosine score of two, from our checkpoint or a 3D-Speaker one.

    python -m speakerlab.infer --checkpoint exp/mini/checkpoints/avg.pt a.wav b.wav         # embeddings
    python -m speakerlab.infer --checkpoint exp/mini/checkpoints/avg.pt --score a.wav b.wav # one score
    python -m speakerlab.infer --3dspeaker campplus --weights campplus_cn_en_common.pt a.wav

Features are the checkpoint's own (for 3D-Speaker weights, those the published models were trained
with: 16 kHz, 80-bin Kaldi fbank, 25/10 ms, dither 0, mean normalisation); files must be mono at the
model's sample rate. Embeddings print one per line (`path v1 v2 ...`) or go to `--out file.npz`.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from speakerlab.audio import AudioError
from speakerlab.checkpoint import CheckpointError
from speakerlab.embedder import NonFiniteEmbedding, add_source_args, check_finite, embedder_from_args


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speakerlab.infer", description=__doc__.split("\n")[0])
    add_source_args(ap)
    ap.add_argument("--score", action="store_true", help="print the cosine score of exactly two files")
    ap.add_argument("--out", help="write embeddings to this .npz instead of printing them")
    ap.add_argument("wavs", nargs="+", help="mono audio files at the model's sample rate")
    args = ap.parse_args(argv)
    if args.score and len(args.wavs) != 2:
        ap.error("--score takes exactly two files")
    try:
        embedder = embedder_from_args(ap, args)
        emb = embedder.embed_waves([embedder.read(p) for p in args.wavs])
        check_finite(args.wavs, emb)
    except (CheckpointError, AudioError, NonFiniteEmbedding, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.score:
        print(f"{cosine(emb[0], emb[1]):.6f}")
    elif args.out:
        np.savez(args.out, ids=np.asarray(args.wavs), embeddings=emb)
    else:
        for path, e in zip(args.wavs, emb):
            print(path, " ".join(f"{v:.6f}" for v in e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
