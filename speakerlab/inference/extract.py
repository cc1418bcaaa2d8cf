"""Embedding extraction: every utterance of a data dir -> `embeddings.npz`, streamed with bounded memory.

    speakerlab-extract --checkpoint exp/mini/checkpoints/avg.pt --data data/test \
        --out exp/mini/embeddings/test.npz
    speakerlab-extract --redimnet2 b6-vox2-lm.pt --data data/vox1 --out vox1.npz   # a release
    torchrun --nproc_per_node=4 --no-python speakerlab-extract --checkpoint exp/vox --data data/vox1 --out vox1.npz

The checkpoint (or an exp dir: its newest intact checkpoint; or any other model source of
speakerlab.inference.embedder.add_source_args) brings its own model and front-end
(speakerlab.inference.embedder). Loader workers read the units while the model runs: audio segments, or
frame ranges of the offline feature store (below). Utterances longer than `--max-seconds` are cut into
equal chunks of at most that length (in frames, from the store) whose embeddings are averaged; the rest
are embedded whole. Units (utterances or chunks) are sorted by length and batched when their batch
lengths are equal (fbank frames, or samples for front-ends that normalise the whole wave; with
`--pad-ratio r > 0`, up to r x longer ones share a batch, the shorter repeated to the batch length), at
most `--batch-size` units and `--batch-seconds` of padded audio a batch (default 30 s on the CPU, where a
batch's activations are host memory, 240 s on a GPU). Memory stays bounded whatever the size of the data
dir: a process holds one shard of units at a time (`--shard-units`), batches are bounded in audio, not
only in count (with many utterances of one length, a count bound alone lets the batches, and the peak,
grow with the data), and the output grows only by D floats per utterance.

Shards are written to `<out>.parts/` as they finish; a re-run skips the finished ones (if the
checkpoint, the data and the settings are the same; otherwise the parts are discarded). Under
torchrun each process takes every world-th shard; when all are done rank 0 merges them, in sorted
utterance order, into OUT and removes the parts: only rank 0 writes OUT, on both paths.

Output: OUT is an .npz with `ids` ((N,) unicode, sorted) and `embeddings` ((N, D) float32), written and
read by `speakerlab.dataio.embeddings` (numpy alone reads it too: `z = np.load(OUT); dict(zip(z["ids"],
z["embeddings"]))`). `--kaldi` also writes `<OUT without .npz>.ark/.scp` (Kaldi float vectors,
kaldiio). When the data dir has an offline feature store (speakerlab-feature-store) with the checkpoint's
fbank options (a kaldi_fbank front-end), fbank is read from it instead of computed from the audio
(`--feats yes|no` forces the choice), as units of the same streaming extractor (chunks, shards, parts,
resumption, ranks); utterance lengths then come from utt2num_samples (or the audio headers), as on the
audio path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from speakerlab.checkpoint import CheckpointError
from speakerlab.commands import CommandParser
from speakerlab.dataio.audio import AudioError, audio_info, read_segment
from speakerlab.dataio.embeddings import write_embeddings
from speakerlab.dataio.lists import DataDir, ListError, load_data_dir
from speakerlab.features.fbank import num_frames
from speakerlab.inference.embedder import (
    Embedder,
    NonFiniteEmbedding,
    add_source_args,
    check_finite,
    embedder_from_args,
    length_batches,
)

# --pad-ratio's default on a GPU: an utterance list has few of exactly equal length, so exact batching means a
# model call per utterance; within 10 % they share calls (the shorter repeated, not zero-padded).
GPU_PAD_RATIO = 0.1


def plan_units(lengths: Sequence[int], max_len: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Utterance lengths `(N,)` (samples or frames) -> units `(utterance index, start, length)` as three
    `(U,)` arrays: an utterance longer than `max_len` (> 0) becomes ceil(n / max_len) chunks of equal
    length (edges rounded)."""
    n = np.asarray(lengths, np.int64)
    k = -(-n // max_len) if max_len > 0 else np.ones_like(n)
    k = np.maximum(k, 1)
    utt = np.repeat(np.arange(len(n)), k)
    first = np.cumsum(k) - k  # index of each utterance's first unit
    j = np.arange(len(utt)) - np.repeat(first, k)  # chunk number within its utterance
    kk, nn = k[utt], n[utt]
    # Edge i of an utterance cut into kk chunks: round(i * nn / kk), as np.linspace(0, nn, kk + 1).round().
    start = np.rint(j * nn / kk).astype(np.int64)
    end = np.rint((j + 1) * nn / kk).astype(np.int64)
    return utt, start, end - start


class AudioUnits(Dataset):
    """Unit k -> `(k, (length,) float32)` samples: only that chunk is read from disk."""

    def __init__(self, paths: Sequence[str], utt: np.ndarray, start: np.ndarray, length: np.ndarray, sample_rate: int):
        self.paths, self.utt, self.start, self.length, self.sample_rate = paths, utt, start, length, sample_rate

    def __len__(self) -> int:
        return len(self.utt)

    def __getitem__(self, k: int):
        return k, read_segment(self.paths[self.utt[k]], int(self.start[k]), int(self.length[k]), self.sample_rate)


class FeatureUnits(Dataset):
    """Unit k -> `(k, (frames, F) float32)` stored fbank (`FeatureStore`): frames `start..start+length`
    of its utterance; a store shorter than the utterance's audio says so, naming the utterance."""

    def __init__(self, store, utts: Sequence[str], utt: np.ndarray, start: np.ndarray, length: np.ndarray):
        self.store, self.utts, self.utt, self.start, self.length = store, utts, utt, start, length

    def __len__(self) -> int:
        return len(self.utt)

    def __getitem__(self, k: int):
        name, lo = self.utts[self.utt[k]], int(self.start[k])
        feats = self.store[name]
        if feats.shape[0] < lo + int(self.length[k]):
            raise ListError(
                f"{name}: {feats.shape[0]} frames in the feature store, its audio gives more; rebuild the store "
                "(python -m speakerlab.features.store)"
            )
        return k, feats[lo : lo + int(self.length[k])]


def collate_units(items) -> Tuple[torch.Tensor, torch.Tensor]:
    """`[(k, x)]` (waves (n,) or fbank (n, F)) -> `(units (B,), (B, longest, ...))`; shorter members are
    repeated, not zero-padded (padding with silence would shift the statistics)."""
    n = max(len(x) for _, x in items)
    rows = np.stack([np.resize(x, (n, *x.shape[1:])) for _, x in items])
    return torch.tensor([k for k, _ in items]), torch.from_numpy(rows)


def utterance_lengths(data: DataDir, sample_rate: int) -> List[int]:
    """Samples per utterance: utt2num_samples (the features stage) or, without it, the audio headers."""
    if data.num_samples:
        return [data.num_samples[u] for u in data.utts]
    return [audio_info(data.wav[u], sample_rate) for u in data.utts]


def _libc_trim():
    """glibc's malloc_trim, or None (another C library)."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _libc_trim()


def _release_free_memory() -> None:
    """Give the allocator's free pages back to the system after a batch. Batches of changing shapes leave
    the heap fragmented (tensors under 32 MB come from malloc's arenas, which keep freed space), so the
    resident size grew with the number of batches embedded (measured: bench/extract_memory.py); trimming
    after each batch keeps it at about one batch's worth. A no-op off glibc."""
    if _TRIM is not None:
        _TRIM(0)


def default_batch_seconds(device: torch.device) -> float:
    """Padded audio per batch: 240 s on a GPU (its activations live in GPU memory), 30 s on the CPU, where
    a batch's activations are host memory (the 2-D front-end's im2col alone is about 20 MB per second
    of audio in CAM++) and larger batches embed no faster."""
    return 240.0 if device.type == "cuda" else 30.0


class StreamingExtractor:
    """Embeddings of one data dir with one Embedder, in shards (see the module docstring).

    Units come from the audio, or from `store` (an opened `FeatureStore` of the data dir): then units are
    frame ranges of the stored fbank, cut at the frame count of `max_seconds`."""

    def __init__(
        self,
        embedder: Embedder,
        data: DataDir,
        out: Path,
        max_seconds: float = 60.0,
        batch_size: int = 32,
        batch_seconds: Optional[float] = None,
        pad_ratio: float = 0.0,
        shard_units: int = 4096,
        num_workers: int = 2,
        rank: int = 0,
        world_size: int = 1,
        store=None,
    ):
        self.embedder, self.data, self.out, self.store = embedder, data, Path(out), store
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        rate = embedder.sample_rate
        if batch_seconds is None:
            batch_seconds = default_batch_seconds(embedder.device)
        samples = utterance_lengths(data, rate)
        max_samples = int(max_seconds * rate)
        if store is None:
            self.utt, self.start, self.length = plan_units(samples, max_samples)
            # Batched by the front-end's batch length (fbank frames, or samples): units of equal batch
            # length embed exactly as they would alone.
            lengths = [embedder.features.batch_length(int(n)) for n in self.length]
            max_total = embedder.features.batch_length(int(batch_seconds * rate))
        else:
            fbank = embedder.spec.fbank
            max_frames = num_frames(max_samples, fbank) if max_samples > 0 else 0
            self.utt, self.start, self.length = plan_units([num_frames(n, fbank) for n in samples], max_frames)
            lengths = self.length.tolist()
            max_total = int(batch_seconds / (fbank.frame_shift_ms / 1000))
        batches = length_batches(lengths, batch_size, pad_ratio, max_total)
        # Deal the length-sorted batches round-robin into shards: every shard has short and long units.
        n_shards = max(world_size, min(len(batches), -(-len(self.utt) // shard_units)))
        self.shards = [batches[s::n_shards] for s in range(n_shards)]
        settings = {
            "model": embedder.name,
            "source": "audio" if store is None else "feats",
            "max_seconds": max_seconds,
            "batch_size": batch_size,
            "batch_seconds": batch_seconds,
            "pad_ratio": pad_ratio,
            "shard_units": shard_units,
            "units": hashlib.sha1(np.stack([self.utt, self.start, self.length]).tobytes()).hexdigest(),
            "utts": hashlib.sha1("\n".join(f"{u} {data.wav[u]}" for u in data.utts).encode()).hexdigest(),
        }
        self.manifest = {"settings": settings, "shards": n_shards, "world_size": world_size}

    def prepare_parts(self, log) -> None:
        """(Rank 0) keep finished shards of an identical earlier run, else start a clean parts dir."""
        path = self.parts / "manifest.json"
        if path.exists():
            old = json.loads(path.read_text())
            if old.get("settings") == self.manifest["settings"] and old.get("shards") == self.manifest["shards"]:
                done = len(list(self.parts.glob("shard_*.npz")))
                log(f"extract: {done} of {len(self.shards)} shards already done in {self.parts}")
                return
            log(f"extract: {self.parts} holds parts of another run (other checkpoint, data or settings); removed")
            shutil.rmtree(self.parts)
        self.parts.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.manifest, indent=1))

    def shard_path(self, s: int) -> Path:
        return self.parts / f"shard_{s:05d}.npz"

    def units(self) -> Dataset:
        if self.store is not None:
            return FeatureUnits(self.store, self.data.utts, self.utt, self.start, self.length)
        paths = [self.data.wav[u] for u in self.data.utts]
        return AudioUnits(paths, self.utt, self.start, self.length, self.embedder.sample_rate)

    @torch.no_grad()
    def run_shard(self, s: int) -> None:
        loader = DataLoader(
            self.units(),
            batch_sampler=self.shards[s],
            num_workers=self.num_workers,
            collate_fn=collate_units,
            pin_memory=self.embedder.device.type == "cuda",
        )
        embed = self.embedder if self.store is None else self.embedder.embed_fbank
        units, rows = [], []
        for ks, x in loader:
            units.append(ks.numpy())
            rows.append(embed(x).cpu().numpy())
            del x
            _release_free_memory()
        tmp = self.parts / f".shard_{s:05d}.tmp.npz"
        units = np.concatenate(units) if units else np.zeros(0, np.int64)
        order = np.argsort(units)
        emb = np.concatenate(rows)[order] if rows else np.zeros((0, 0), np.float32)  # a rank with none
        np.savez(tmp, units=units[order], embeddings=emb)
        tmp.replace(self.shard_path(s))

    def run_mine(self) -> int:
        """Embed this process's unfinished shards; returns how many it did."""
        mine = [s for s in range(self.rank, len(self.shards), self.world_size) if not self.shard_path(s).exists()]
        for s in mine:
            self.run_shard(s)
        return len(mine)

    def merge(self) -> np.ndarray:
        """All shards -> `(N, D)` float32 per-utterance means of their units, in `data.utts` order. The sums
        are the output array itself (float32: a mean of a few chunks loses nothing that matters), so the
        merge holds N x D floats once, not a float64 copy too."""
        out, counts = None, np.zeros(len(self.data.utts), np.float32)
        for s in range(len(self.shards)):
            with np.load(self.shard_path(s)) as z:
                units, emb = z["units"], z["embeddings"]
            if not len(units):
                continue
            if out is None:
                out = np.zeros((len(self.data.utts), emb.shape[1]), np.float32)
            np.add.at(out, self.utt[units], emb)
            np.add.at(counts, self.utt[units], 1)
        out /= counts[:, None]
        return out


def embed_data_dir(
    embedder: Embedder, data_dir, max_batch: int = 32, pad_ratio: float = 0.0, out=None, store=None, **options
) -> Tuple[List[str], np.ndarray]:
    """All utterances of a data dir (sorted ids) -> (ids, (N, D) embeddings), streamed in one process,
    from the audio or, given `store` (a `FeatureStore` of the data dir, see `fitting_store`), from it.

    Parts go to `<out>.parts/` (a temporary dir when `out` is None). A non-finite embedding is an error
    naming the wav.scp (or feats.scp) line of each utterance that gave one."""
    import tempfile

    data = load_data_dir(data_dir, need_speakers=False)
    if store is None:
        data.check_audio_exists()
    with tempfile.TemporaryDirectory() as tmp:
        ex = StreamingExtractor(
            embedder,
            data,
            Path(out) if out else Path(tmp) / "emb.npz",
            batch_size=max_batch,
            pad_ratio=pad_ratio,
            num_workers=options.pop("num_workers", 0),
            store=store,
            **options,
        )
        ex.prepare_parts(lambda m: None)
        ex.run_mine()
        emb = ex.merge()
        shutil.rmtree(ex.parts)
    check_finite(_sources(data, store), emb)
    return data.utts, emb


def _sources(data: DataDir, store) -> List[str]:
    """Where each utterance's embedding came from, for error messages."""
    if store is not None:
        return [f"{data.root / 'feats.scp'}: {u}" for u in data.utts]
    return [f"{data.root / 'wav.scp'}:{data.wav_line[u]}: {u} ({data.wav[u]})" for u in data.utts]


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-extract", description=__doc__.split("\n")[0])
    add_source_args(ap)
    ap.add_argument("--data", required=True, help="Kaldi data dir with wav.scp")
    ap.add_argument("--out", required=True, help="output .npz")
    ap.add_argument("--batch-size", type=int, default=32, help="units per batch at most")
    ap.add_argument(
        "--batch-seconds",
        type=float,
        help="padded audio per batch at most (default: 240 on a GPU, 30 on the CPU, where it is host memory)",
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="longer utterances are cut into chunks whose embeddings are averaged (0: never)",
    )
    ap.add_argument(
        "--pad-ratio",
        type=float,
        default=None,
        help="units up to this much longer than a batch's shortest share it, shorter ones repeated; default "
        f"{GPU_PAD_RATIO} on a GPU (exact lengths make batches of one: launch-bound), 0 (exact) on the CPU",
    )
    ap.add_argument("--shard-units", type=int, default=4096, help="units per shard (the unit of resumption)")
    ap.add_argument("--num-workers", type=int, default=2, help="audio- or fbank-reading loader processes")
    ap.add_argument("--kaldi", action="store_true", help="also write Kaldi ark/scp next to OUT")
    ap.add_argument(
        "--feats",
        choices=["auto", "yes", "no"],
        default="auto",
        help="read <data>/feats.scp (speakerlab-feature-store) instead of decoding audio: "
        "yes, no, or auto (when the store exists with the checkpoint's fbank options)",
    )
    args = ap.parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and args.device in ("auto", "cuda") and torch.cuda.is_available():
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    t0 = time.time()
    try:
        embedder = embedder_from_args(ap, args)
        if args.pad_ratio is None:
            args.pad_ratio = GPU_PAD_RATIO if embedder.device.type == "cuda" else 0.0
        store = None
        if args.feats == "auto":
            store = fitting_store(embedder, args.data, lambda m: print(m, file=sys.stderr) if rank == 0 else None)
        elif args.feats == "yes":
            from speakerlab.features.store import FeatureStore

            if embedder.spec.kind != "kaldi_fbank":
                raise ValueError(
                    f"--feats yes: the feature store holds Kaldi fbank, the model takes {embedder.spec.kind}"
                )

            store = FeatureStore(args.data, embedder.spec.fbank)
        result = _stream(embedder, args, rank, world, store)
        if result is None:  # not rank 0: its shards are done, rank 0 writes OUT
            return 0
        ids, emb = result
    except (CheckpointError, ListError, AudioError, NonFiniteEmbedding, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_embeddings(args.out, ids, emb, args.kaldi, embedder.model_id)
    print(
        f"extract: {len(ids)} embeddings of dim {emb.shape[1]} ({embedder.name}) -> {args.out} "
        f"in {time.time() - t0:.1f}s",
        file=sys.stderr,
    )
    return 0


def fitting_store(embedder: Embedder, data_dir, log: Optional[Callable[[str], None]] = None):
    """The offline feature store of `data_dir` (a `FeatureStore`) when it exists and holds the
    checkpoint's fbank, else None; `log` says which."""
    if not (Path(data_dir) / "feats.scp").exists():
        return None
    from speakerlab.features.store import FeatureStore

    say = log or (lambda m: None)
    if embedder.spec.kind != "kaldi_fbank":
        say(f"extract: not using the feature store of {data_dir}: it holds Kaldi fbank, not {embedder.spec.kind}")
        return None
    try:
        store = FeatureStore(data_dir, embedder.spec.fbank)
    except (ValueError, ListError) as e:
        say(f"extract: not using the feature store of {data_dir}: {e}")
        return None
    say(f"extract: fbank from the feature store {Path(data_dir) / 'feats.scp'}")
    return store


def _stream(embedder: Embedder, args, rank: int, world: int, store):
    """The sharded run of `main` (from the audio, or from `store`): every process its shards, rank 0
    merges (None on other ranks)."""
    import torch.distributed as dist

    log = (lambda m: print(m, file=sys.stderr)) if rank == 0 else (lambda m: None)
    data = load_data_dir(args.data, need_speakers=False)
    if store is None:
        data.check_audio_exists()
    ex = StreamingExtractor(
        embedder,
        data,
        Path(args.out),
        args.max_seconds,
        args.batch_size,
        args.batch_seconds,
        args.pad_ratio,
        args.shard_units,
        args.num_workers,
        rank,
        world,
        store,
    )
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
    try:
        if rank == 0:
            ex.prepare_parts(log)
        if world > 1:
            dist.barrier()
        done = ex.run_mine()
        print(f"extract: rank {rank} embedded {done} shard(s)", file=sys.stderr)
        if world > 1:
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if rank != 0:
        return None
    emb = ex.merge()
    shutil.rmtree(ex.parts)  # also on a non-finite embedding: fixed audio must be embedded again
    check_finite(_sources(data, store), emb)
    return data.utts, emb


if __name__ == "__main__":
    sys.exit(main())
