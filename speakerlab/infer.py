"""Embeddings of wav files, or the cosine score of two, from our checkpoint or a 3D-Speaker one.

    python -m speakerlab.infer --checkpoint exp/mini/checkpoints/avg.pt a.wav b.wav         # embeddings
    python -m speakerlab.infer --checkpoint exp/mini/checkpoints/avg.pt --score a.wav b.wav # one score
    python -m speakerlab.infer --3dspeaker campplus --weights campplus_cn_en_common.pt a.wav

Features are those the published models were trained with: 80-bin Kaldi fbank, 25/10 ms, dither
0, per-utterance mean normalisation (for our checkpoints, the settings stored in the checkpoint).
Embeddings print one per line (`path v1 v2 ...`) or go to `--out file.npz`.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Tuple

import numpy as np
import torch

from speakerlab.audio import read_audio
from speakerlab.checkpoint import load_checkpoint, rebuild_model
from speakerlab.config import config_from_dict
from speakerlab.engine.precision import resolve_device
from speakerlab.engine.setup import make_fbank
from speakerlab.extract import embed_waves, resolve_checkpoint
from speakerlab.features import Fbank, FbankConfig


def load_for_inference(args, device) -> Tuple[torch.nn.Module, Fbank, bool]:
    """(model in eval mode, fbank, mean_norm) from `--checkpoint` or `--3dspeaker NAME --weights FILE`."""
    if args.checkpoint:
        ckpt = load_checkpoint(resolve_checkpoint(args.checkpoint))
        cfg = config_from_dict(ckpt["config"])
        return rebuild_model(ckpt).to(device), make_fbank(cfg, device, dither=0.0), cfg.features.mean_norm
    from speakerlab.models import load_3dspeaker
    model = load_3dspeaker(args.threedspeaker, args.weights).to(device)
    return model, Fbank(FbankConfig(num_mel_bins=80, dither=0.0)).to(device), True


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speakerlab.infer", description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a speakerlab checkpoint (or exp dir)")
    src.add_argument("--3dspeaker", dest="threedspeaker", metavar="NAME",
                     help="registered model name of a 3D-Speaker state dict given by --weights")
    ap.add_argument("--weights", help="3D-Speaker checkpoint file (.pt/.bin/.ckpt state dict)")
    ap.add_argument("--score", action="store_true", help="print the cosine score of exactly two files")
    ap.add_argument("--out", help="write embeddings to this .npz instead of printing them")
    ap.add_argument("--device", default="auto")
    ap.add_argument("wavs", nargs="+", help="16 kHz mono audio files")
    args = ap.parse_args(argv)
    if args.threedspeaker and not args.weights:
        ap.error("--3dspeaker needs --weights")
    if args.score and len(args.wavs) != 2:
        ap.error("--score takes exactly two files")
    device = resolve_device(args.device)
    model, fbank, mean_norm = load_for_inference(args, device)
    waves: List[np.ndarray] = [read_audio(p) for p in args.wavs]
    emb = embed_waves(model, fbank, waves, device, mean_norm)
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
