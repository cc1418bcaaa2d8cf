"""Embedding extraction: whole utterances of a data dir -> `embeddings.npz` (ids, (N, D) float32).

    python -m speakerlab.extract --checkpoint exp/mini/checkpoints/avg.pt --data data/test \
        --out exp/mini/embeddings/test.npz

The checkpoint (or an exp dir: its latest checkpoint) brings its own model and features
(speakerlab.embedder). With `--feats` the fbank comes from the data dir's offline feature store. Utterances are sorted by length and batched when their frame counts are
equal; with `--pad-ratio r > 0`, utterances up to r x longer than the shortest share a batch, the
shorter ones repeated to the batch length (faster, slightly different from exact whole-utterance
embeddings).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from speakerlab.audio import AudioError
from speakerlab.checkpoint import CheckpointError
from speakerlab.embedder import Embedder, NonFiniteEmbedding, check_finite, load_embedder
from speakerlab.lists import ListError, load_data_dir


def embed_data_dir(embedder: Embedder, data_dir, max_batch: int = 32,
                   pad_ratio: float = 0.0) -> Tuple[List[str], np.ndarray]:
    """All utterances of a data dir (sorted ids) -> (ids, (N, D) embeddings); a non-finite embedding is
    an error naming the wav.scp line of each utterance that gave one."""
    data = load_data_dir(data_dir, need_speakers=False)
    data.check_audio_exists()
    waves = [embedder.read(data.wav[u]) for u in data.utts]
    emb = embedder.embed_waves(waves, max_batch, pad_ratio)
    check_finite([f"{data.root / 'wav.scp'}:{data.wav_line[u]}: {u} ({data.wav[u]})" for u in data.utts], emb)
    return data.utts, emb


def embed_feature_store(embedder: Embedder, data_dir, max_batch: int = 32,
                        pad_ratio: float = 0.0) -> Tuple[List[str], np.ndarray]:
    """Like `embed_data_dir`, from `<data_dir>/feats.scp` (python -m speakerlab.feature_store) instead of
    the audio; the store's fbank options must be the checkpoint's (else an error naming the option)."""
    from speakerlab.feature_store import FeatureStore  # kaldiio only when the store is used

    data = load_data_dir(data_dir, need_speakers=False)
    store = FeatureStore(data_dir, embedder.spec.fbank)
    emb = embedder.embed_features([store[u] for u in data.utts], max_batch, pad_ratio)
    check_finite([f"{data.root / 'feats.scp'}: {u}" for u in data.utts], emb)
    return data.utts, emb


def save_embeddings(path, ids: Sequence[str], emb: np.ndarray) -> None:
    """`ids` (N,) and `emb` (N, D) float32 -> an .npz with arrays `ids` and `embeddings` (atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, ids=np.asarray(ids), embeddings=emb)
    tmp.replace(path)


def load_embeddings(path) -> Tuple[List[str], np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return [str(i) for i in z["ids"]], z["embeddings"]


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
    t0 = time.time()
    try:
        embedder = load_embedder(args.checkpoint, device=args.device)
        embed = embed_feature_store if args.feats else embed_data_dir
        ids, emb = embed(embedder, args.data, args.batch_size, args.pad_ratio)
    except (CheckpointError, ListError, AudioError, NonFiniteEmbedding, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    save_embeddings(args.out, ids, emb)
    print(f"extract: {len(ids)} embeddings of dim {emb.shape[1]} ({embedder.name}) -> {args.out} "
          f"in {time.time() - t0:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
