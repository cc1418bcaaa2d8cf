"""The torch-free parts of inference, shared by the PyTorch embedder (speakerlab.inference.embedder) and the ONNX
runtime (speakerlab.inference.deploy.runtime): the options that name a model, batching waves by length, the check that
no embedding is NaN or inf. Nothing here imports torch, so `speakerlab-embed --onnx` and the runtime's Python API
run where torch is not installed (the torch-free install, runtime/pyproject.toml: numpy, soundfile, scipy,
onnxruntime).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

import numpy as np

from speakerlab.dataio.audio import AudioError
from speakerlab.devices import THREADS_HELP, parse_threads

# Shorter inputs break the registered models: statistics pooling over < 2 frames is NaN, ECAPA's reflect
# padding needs 5 frames, ResNet34 / ERes2Net(V2) downsample time by 8 and give NaN below 9 (random weights).
MIN_FRAMES = 10


def shortest_input(num_frames: Callable[[int], int], limit: int) -> int:
    """The fewest samples n <= `limit` with `num_frames(n)` >= MIN_FRAMES (a non-decreasing function): the
    shortest input a model embeds. Binary search; `limit` when even that is too short."""
    lo, hi = 1, int(limit)
    while lo < hi:
        mid = (lo + hi) // 2
        if num_frames(mid) >= MIN_FRAMES:
            hi = mid
        else:
            lo = mid + 1
    return lo


def model_key(embedder) -> str:
    """What names an embedder's embeddings: a speakerlab checkpoint's content digest (`model_id`) and its name, else
    (3D-Speaker weights, ReDimNet2 releases, int8 ONNX files: no digest) a digest of its weights, the ONNX file's
    bytes or the model's parameters and buffers, so that a file rewritten in place is not taken for the old one
    (the diarization cache's key, extraction's resumption)."""
    model_id = getattr(embedder, "model_id", "")
    if not model_id:
        h = hashlib.sha256()
        if getattr(embedder, "path", None):  # OnnxEmbedder: its file
            with open(embedder.path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        else:  # Embedder: its torch model's tensors (this module imports no torch)
            for name, value in embedder.model.state_dict().items():
                h.update(name.encode())
                h.update(value.detach().cpu().float().numpy().tobytes())
            h.update(repr(embedder.spec).encode())
        model_id = "weights " + h.hexdigest()[:20]
    return f"{model_id}|{embedder.name}"


def too_short(samples: int, embedder) -> Optional[str]:
    """The one-line refusal of `samples` samples for `embedder` (its `min_samples`, `sample_rate`), or None
    when they are enough: every command says the same about a short input."""
    need, rate = embedder.min_samples, embedder.sample_rate
    if samples >= need:
        return None
    return (
        f"too short for an embedding: {samples} samples ({samples / rate:.3f} s) at {rate} Hz, this model's shortest "
        f"input is {need} ({need / rate:.3f} s)"
    )


class NonFiniteEmbedding(ValueError):
    """Some inputs gave NaN/inf embeddings (usually NaN or inf samples in the audio); the message names them."""


def check_finite(names: Sequence[str], emb: np.ndarray) -> None:
    """Raise NonFiniteEmbedding naming every row of `emb` (N, D) that is not finite; `names` (N,) say
    where each row came from (file, or list:line and utterance)."""
    bad = [names[i] for i in np.flatnonzero(~np.isfinite(emb).all(axis=1))]
    if bad:
        shown = "\n  ".join(bad[:50]) + (f"\n  ... and {len(bad) - 50} more" if len(bad) > 50 else "")
        raise NonFiniteEmbedding(
            f"{len(bad)} input(s) gave a non-finite embedding (NaN or inf in the audio?); "
            f"nothing was written:\n  {shown}"
        )


def length_batches(
    frames: Sequence[int], max_batch: int, pad_ratio: float, max_total: Optional[int] = None
) -> List[List[int]]:
    """Indices of `frames`, sorted by length, in batches of <= max_batch whose longest is at most
    (1 + pad_ratio) x their shortest and, with `max_total`, whose longest x size is at most that (a
    bound on the padded batch, so long utterances come in small batches)."""
    order = sorted(range(len(frames)), key=lambda i: (frames[i], i))
    batches: List[List[int]] = []
    for i in order:
        if (
            batches
            and len(batches[-1]) < max_batch
            and frames[i] <= frames[batches[-1][0]] * (1 + pad_ratio)
            and (max_total is None or frames[i] * (len(batches[-1]) + 1) <= max_total)
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def embed_in_batches(
    waves: Sequence[np.ndarray],
    batch_length: Callable[[int], int],
    embed: Callable[[np.ndarray], np.ndarray],
    max_batch: int = 32,
    pad_ratio: float = 0.0,
    workers: int = 1,
) -> np.ndarray:
    """Whole waves of any lengths -> `(N, D)` float32 in input order, `embed` mapping `(B, samples)` rows to
    `(B, D)`. Waves of equal `batch_length` (the front end's: fbank frames, or samples) share a call; with
    `pad_ratio` r > 0 waves up to r x longer than the shortest do too. Shorter members are repeated to the
    longest, not zero-padded (silence would shift the statistics); at equal batch length the samples past
    the last whole frame are never read, so each embedding is exactly the one of its wave alone.

    `workers` > 1: that many threads call `embed` at once, each on its own batch (torch and onnxruntime release the
    GIL while they compute). The batches are the same whatever `workers`, so where each call computes on one thread
    (the embedders' `workers` setting) the embeddings are the same bits on 1 or N workers; a library's own intra-op
    threads split a reduction by their number and move the last bits (bench/RESULTS.md, "The same RTTM?")."""
    lengths = [batch_length(len(w)) for w in waves]
    out: List[Optional[np.ndarray]] = [None] * len(waves)

    def rows(batch: List[int]) -> np.ndarray:
        n = max(len(waves[i]) for i in batch)
        return np.stack([np.resize(np.asarray(waves[i], dtype=np.float32), n) for i in batch])

    batches = length_batches(lengths, max_batch, pad_ratio)
    if workers > 1 and len(batches) > 1:
        with ThreadPoolExecutor(workers) as pool:
            done = list(pool.map(lambda batch: embed(rows(batch)), batches))
    else:
        done = [embed(rows(batch)) for batch in batches]
    for batch, emb in zip(batches, done):
        for j, i in enumerate(batch):
            out[i] = emb[j]
    return np.stack(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)


def add_source_args(ap: argparse.ArgumentParser, onnx: bool = False) -> None:
    """The options every inference command takes to name its model: `--checkpoint`, `--3dspeaker NAME
    --weights FILE` or `--redimnet2 FILE`, and `--device`; with `onnx`, also `--onnx FILE` (a waveform ONNX file
    of speakerlab-export, run by onnxruntime without torch)."""
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="a speakerlab checkpoint file, or an exp dir (its latest checkpoint)")
    src.add_argument(
        "--3dspeaker",
        dest="threedspeaker",
        metavar="NAME",
        help="registered model name of a 3D-Speaker state dict given by --weights (e.g. campplus)",
    )
    src.add_argument(
        "--redimnet2",
        metavar="FILE",
        help="a released ReDimNet2 file ({model_config, state_dict}, e.g. b6-vox2-lm.pt), with its own front-end",
    )
    if onnx:
        src.add_argument(
            "--onnx",
            metavar="FILE",
            help="a waveform ONNX file (speakerlab-export --waveform), run by onnxruntime: torch not needed",
        )
    ap.add_argument("--weights", help="3D-Speaker weights file (.pt/.bin/.ckpt state dict), with --3dspeaker")
    ap.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N, mps")
    ap.add_argument("--threads", type=threads_arg, default="auto", help=THREADS_HELP)


def warn_stderr(msg: str) -> None:
    """One `warning:` line on stderr."""
    print(f"warning: {msg}", file=sys.stderr)


def read_wave(embedder, path: str, where: str = "") -> np.ndarray:
    """`path` at the rate of `embedder` (an Embedder or OnnxEmbedder), `(samples,)` float32; fewer than MIN_FRAMES
    feature frames (its `min_samples`) is an error. `where` prefixes messages (a wav.scp line)."""
    warn = (lambda m: warn_stderr(f"{where}{m}")) if where else warn_stderr
    try:
        wave = embedder.read(path, warn)
    except AudioError as e:
        raise AudioError(f"{where}{e}") from None
    short = too_short(len(wave), embedder)
    if short:
        raise AudioError(f"{where}{path}: {short}")
    return wave


def threads_arg(value: str):
    """argparse's type of `--threads` (speakerlab.devices.parse_threads; a bad value is a usage error)."""
    try:
        return parse_threads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
