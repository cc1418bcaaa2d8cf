"""Embedding extraction: whole utterances of a data dir -> `embeddings.npz` (ids, (N, D) float32).

    python -m speakerlab.extract --checkpoint exp/mini/checkpoints/avg.pt --data data/test \
        --out exp/mini/embeddings/test.npz

Utterances are sorted by length and batched when their frame counts are equal; with
`--pad-ratio r > 0`, utterances up to r x longer than the shortest share a batch, the shorter ones
repeated to the batch length (faster, slightly different from exact whole-utterance embeddings).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from speakerlab.audio import read_audio
from speakerlab.checkpoint import latest_checkpoint, load_checkpoint, rebuild_model
from speakerlab.config import config_from_dict
from speakerlab.engine.precision import resolve_device
from speakerlab.engine.setup import make_fbank
from speakerlab.feature_store import FeatureStore
from speakerlab.features import Fbank, mean_normalize, num_frames
from speakerlab.lists import load_data_dir


def length_batches(frames: Sequence[int], max_batch: int, pad_ratio: float) -> List[List[int]]:
    """Group indices of `frames` (sorted by length) into batches of <= max_batch whose longest is at
    most (1 + pad_ratio) x their shortest."""
    order = sorted(range(len(frames)), key=lambda i: (frames[i], i))
    batches: List[List[int]] = []
    for i in order:
        if batches and len(batches[-1]) < max_batch and frames[i] <= frames[batches[-1][0]] * (1 + pad_ratio):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@torch.no_grad()
def embed_waves(embed: Callable[[torch.Tensor], torch.Tensor], fbank: Fbank, waves: Sequence[np.ndarray],
                device: torch.device, mean_norm: bool = True, max_batch: int = 32,
                pad_ratio: float = 0.0) -> np.ndarray:
    """`embed((B, T, F)) -> (B, D)` over whole waves -> `(N, D)` float32, in input order."""
    cfg = fbank.config
    frames = [num_frames(len(w), cfg) for w in waves]
    out: List[Optional[np.ndarray]] = [None] * len(waves)
    for batch in length_batches(frames, max_batch, pad_ratio):
        n = max(len(waves[i]) for i in batch)
        # Repeat (not zero-pad) shorter members: padding with silence would shift the statistics.
        rows = [np.resize(waves[i], n) for i in batch]
        x = torch.from_numpy(np.stack(rows)).to(device)
        feats = fbank(x)
        if mean_norm:
            feats = mean_normalize(feats)
        emb = embed(feats).float().cpu().numpy()
        for j, i in enumerate(batch):
            out[i] = emb[j]
    return np.stack(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)


@torch.no_grad()
def embed_features(embed: Callable[[torch.Tensor], torch.Tensor], feats: Sequence[np.ndarray], device: torch.device,
                   mean_norm: bool = True, max_batch: int = 32, pad_ratio: float = 0.0) -> np.ndarray:
    """`embed((B, T, F)) -> (B, D)` over stored whole-utterance features `(T, F)` -> `(N, D)` float32."""
    frames = [f.shape[0] for f in feats]
    out: List[Optional[np.ndarray]] = [None] * len(feats)
    for batch in length_batches(frames, max_batch, pad_ratio):
        n = max(frames[i] for i in batch)
        x = torch.from_numpy(np.stack([np.resize(feats[i], (n, feats[i].shape[1])) for i in batch])).to(device)
        emb = embed(mean_normalize(x) if mean_norm else x).float().cpu().numpy()
        for j, i in enumerate(batch):
            out[i] = emb[j]
    return np.stack(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)


def embed_data_dir(embed, fbank: Fbank, data_dir, device: torch.device, mean_norm: bool = True,
                   max_batch: int = 32, pad_ratio: float = 0.0, sample_rate: int = 16000) -> Tuple[List[str], np.ndarray]:
    """All utterances of a data dir (sorted ids) -> (ids, (N, D) embeddings)."""
    data = load_data_dir(data_dir, need_speakers=False)
    data.check_audio_exists()
    waves = [read_audio(data.wav[u], sample_rate) for u in data.utts]
    return data.utts, embed_waves(embed, fbank, waves, device, mean_norm, max_batch, pad_ratio)


def save_embeddings(path, ids: Sequence[str], emb: np.ndarray) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, ids=np.asarray(ids), embeddings=emb)
    tmp.replace(path)


def load_embeddings(path) -> Tuple[List[str], np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return [str(i) for i in z["ids"]], z["embeddings"]


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint file, or an exp dir / checkpoints dir (its latest checkpoint)."""
    p = Path(path)
    if p.is_dir():
        found = latest_checkpoint(p / "checkpoints" if (p / "checkpoints").is_dir() else p)
        if found is None:
            raise FileNotFoundError(f"no checkpoint under {p}")
        return found
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m speakerlab.extract", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint file, or exp dir (its latest checkpoint)")
    ap.add_argument("--data", required=True, help="Kaldi data dir with wav.scp")
    ap.add_argument("--out", required=True, help="output .npz")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--pad-ratio", type=float, default=0.0)
    ap.add_argument("--feats", action="store_true",
                    help="read <data>/feats.scp (python -m speakerlab.feature_store) instead of decoding audio")
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    t0 = time.time()
    ckpt_path = resolve_checkpoint(args.checkpoint)
    ckpt = load_checkpoint(ckpt_path)
    cfg = config_from_dict(ckpt["config"])
    model = rebuild_model(ckpt).to(device)
    fbank = make_fbank(cfg, device, dither=0.0)
    if args.feats:
        store, ids = FeatureStore(args.data, fbank.config), load_data_dir(args.data, need_speakers=False).utts
        emb = embed_features(model, [store[u] for u in ids], device, cfg.features.mean_norm, args.batch_size,
                             args.pad_ratio)
    else:
        ids, emb = embed_data_dir(model, fbank, args.data, device, cfg.features.mean_norm, args.batch_size,
                                  args.pad_ratio, cfg.data.sample_rate)
    what = f"{ckpt['model_name']} from {ckpt_path}"
    save_embeddings(args.out, ids, emb)
    print(f"extract: {len(ids)} embeddings of dim {emb.shape[1]} ({what}) -> {args.out} "
          f"in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
