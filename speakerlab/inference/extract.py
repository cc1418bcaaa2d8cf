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

One lifecycle (`StreamingExtractor.run`) serves the command, training-time validation and the baseline
(`embed_data_dir`, one process), whatever the units' source (speakerlab.inference.units): shards are
written to `<out>.parts/` as they finish; a re-run skips the finished ones (if the checkpoint, the data
and the settings are the same; otherwise the parts are discarded). Under torchrun each process takes
every world-th shard; when all are done rank 0 merges them, in sorted utterance order, removes the
parts and checks every embedding is finite: only rank 0 writes OUT, from either source. Over several nodes OUT
must be on a filesystem they share (a rank that cannot see rank 0's parts dir says so). An OUT that is a device or a
pipe (`--out /dev/null`, to time extraction) is written through, never replaced, its parts in a temporary folder (one
process only).

An utterance shorter than the model's shortest input (its `min_samples`: 10 feature frames) is refused before
anything is embedded, in one line naming its wav.scp line (speakerlab.inference.common.too_short, the words of
every command), never embedded into a garbage vector.

Output: OUT is an .npz with `ids` ((N,) unicode, sorted) and `embeddings` ((N, D) float32), written and
read by `speakerlab.dataio.tables.embeddings` (numpy alone reads it too: `z = np.load(OUT); dict(zip(z["ids"],
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
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from speakerlab.checkpoint import CheckpointError
from speakerlab.commands import CommandParser
from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.tables.embeddings import kaldi_paths, write_embeddings
from speakerlab.dataio.tables.lists import DataDir, ListError, load_data_dir
from speakerlab.inference.common import model_key, too_short
from speakerlab.inference.embedder import (
    Embedder,
    NonFiniteEmbedding,
    add_source_args,
    check_finite,
    embedder_from_args,
    length_batches,
)
from speakerlab.inference.units import choose_store, collate_units, plan_units, unit_source, utterance_lengths
from speakerlab.outputs import OutputError, check_file_output, check_not_input, is_special, output_file, write_text

# --pad-ratio's default on a GPU: an utterance list has few of exactly equal length, so exact batching means a
# model call per utterance; within 10 % they share calls (the shorter repeated, not zero-padded).
GPU_PAD_RATIO = 0.1

# The command's options that are StreamingExtractor's settings of the same names.
EXTRACTOR_OPTIONS = ("max_seconds", "batch_size", "batch_seconds", "pad_ratio", "shard_units", "num_workers")


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


def refuse_short(samples: List[int], embedder: Embedder, origins: List[str]) -> None:
    """Samples per utterance `(N,)`: an AudioError naming the first utterance below the model's shortest input
    (`origins`: where each came from) and how many others are, before anything is embedded; else nothing."""
    short = [i for i, n in enumerate(samples) if n < embedder.min_samples]
    if short:
        i = short[0]
        more = f" ({len(short) - 1} more utterance(s) as short)" if len(short) > 1 else ""
        raise AudioError(f"{origins[i]}: {too_short(samples[i], embedder)}{more}")


class StreamingExtractor:
    """Embeddings of one data dir with one Embedder, in shards (see the module docstring): one lifecycle
    (`run`) whatever the units' source (speakerlab.inference.units: the audio, or `store`, an opened
    `FeatureStore` of the data dir, whose units are frame ranges cut at the frame count of `max_seconds`)."""

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
        if not data.utts:  # nothing to embed: an empty npz would only fail later, in whatever reads it
            raise ListError(f"{data.root / 'wav.scp'}: no utterances in it (an empty wav.scp)")
        self.source = unit_source(embedder, data, store)  # the audio's missing files are reported here
        self.embedder, self.data, self.out = embedder, data, Path(out)
        self.parts = self.out.with_name(self.out.name + ".parts")
        if is_special(self.out):  # a device or a pipe (--out /dev/null): written through, its parts kept elsewhere
            if world_size > 1:
                raise OutputError(f"{out} is not a regular file: extraction by several processes writes a file")
            self.parts = Path(tempfile.gettempdir()) / f"speakerlab-extract-{os.getpid()}.parts"
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        if batch_seconds is None:
            batch_seconds = default_batch_seconds(embedder.device)
        src = self.source
        max_samples = int(max_seconds * embedder.sample_rate)
        if 0 < max_samples < 2 * embedder.min_samples:  # chunks are longer than half of max_samples
            raise ValueError(
                f"--max-seconds {max_seconds} cuts chunks shorter than this model's shortest input "
                f"({embedder.min_samples / embedder.sample_rate:.3f} s): give at least twice that, or 0"
            )
        samples = utterance_lengths(data, embedder.sample_rate)
        refuse_short(samples, embedder, src.origins())
        self.utt, self.start, self.length = plan_units(
            [src.length(n) for n in samples],
            src.length(max_samples) if max_samples > 0 else 0,
        )
        lengths = [src.batch_length(int(n)) for n in self.length]
        batches = length_batches(lengths, batch_size, pad_ratio, src.budget(batch_seconds))
        # Deal the length-sorted batches round-robin into shards: every shard has short and long units.
        n_shards = max(world_size, min(len(batches), -(-len(self.utt) // shard_units)))
        self.shards = [batches[s::n_shards] for s in range(n_shards)]
        settings = {
            "model": model_key(embedder),  # its content, not only its path: a file replaced in place is another
            "source": src.kind,
            "max_seconds": max_seconds,
            "batch_size": batch_size,
            "batch_seconds": batch_seconds,
            "pad_ratio": pad_ratio,
            "shard_units": shard_units,
            "units": hashlib.sha1(np.stack([self.utt, self.start, self.length]).tobytes()).hexdigest(),
            "utts": hashlib.sha1("\n".join(f"{u} {data.wav[u]}" for u in data.utts).encode()).hexdigest(),
        }
        self.manifest = {"settings": settings, "shards": n_shards, "world_size": world_size}

    def run(self, log: Callable[[str], None]) -> Optional[np.ndarray]:
        """The lifecycle: rank 0 keeps the finished shards of an identical earlier run (or starts clean);
        every rank embeds its unfinished shards; once all are done rank 0 merges them, removes the parts
        and checks that every embedding is finite. -> `(N, D)` in `data.utts` order on rank 0, None on
        the others. `log` gets rank 0's messages about the parts and each rank's count of shards."""
        import torch.distributed as dist

        distributed = self.world_size > 1
        own_group = distributed and not dist.is_initialized()  # a training run's validation brings its own
        if own_group:
            dist.init_process_group("gloo")
        try:
            if self.rank == 0:
                self.prepare_parts(log)
            if distributed:
                dist.barrier()
            if not (self.parts / "manifest.json").exists():  # rank 0 made it: this node does not share OUT's disk
                raise ValueError(
                    f"{self.parts}: not visible to rank {self.rank} on {socket.gethostname()}; extraction on several "
                    "nodes writes --out on a filesystem every node shares (rank 0 merges the parts of all)"
                )
            done = self.run_mine()
            log(f"extract: rank {self.rank} embedded {done} shard(s)")
            if distributed:
                dist.barrier()
        finally:
            if own_group:
                dist.destroy_process_group()
        if self.rank != 0:
            return None
        emb = self.merge()
        shutil.rmtree(self.parts)  # also on a non-finite embedding: fixed audio must be embedded again
        check_finite(self.source.origins(), emb)
        return emb

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
        write_text(path, json.dumps(self.manifest, indent=1))

    def shard_path(self, s: int) -> Path:
        return self.parts / f"shard_{s:05d}.npz"

    @torch.no_grad()
    def run_shard(self, s: int) -> None:
        loader = DataLoader(
            self.source.dataset(self.utt, self.start, self.length),
            batch_sampler=self.shards[s],
            num_workers=self.num_workers,
            collate_fn=collate_units,
            pin_memory=self.embedder.device.type == "cuda",
        )
        units, rows = [], []
        for ks, x in loader:
            units.append(ks.numpy())
            rows.append(self.source.embed(x).cpu().numpy())
            del x
            _release_free_memory()
        units = np.concatenate(units) if units else np.zeros(0, np.int64)
        order = np.argsort(units)
        emb = np.concatenate(rows)[order] if rows else np.zeros((0, 0), np.float32)  # a rank with none
        with output_file(self.shard_path(s), "wb") as f:  # a shard_*.npz is whole: resumption trusts it
            np.savez(f, units=units[order], embeddings=emb)

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
    data = load_data_dir(data_dir, need_speakers=False)
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
        emb = ex.run(lambda m: None)
    return data.utts, emb


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
    for name, value, least in (("--batch-size", args.batch_size, 1), ("--shard-units", args.shard_units, 1)):
        if value < least:
            ap.error(f"{name} must be at least {least}, got {value}")
    for name, value in (
        ("--max-seconds", args.max_seconds),
        ("--pad-ratio", args.pad_ratio),
        ("--num-workers", args.num_workers),
    ):
        if value is not None and value < 0:
            ap.error(f"{name} must not be negative, got {value:g}")
    if args.batch_seconds is not None and args.batch_seconds <= 0:
        ap.error(f"--batch-seconds must be > 0, got {args.batch_seconds:g}")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and args.device in ("auto", "cuda") and torch.cuda.is_available():
        args.device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    t0 = time.time()
    try:
        outputs = [args.out, *(kaldi_paths(args.out) if args.kaldi else ())]
        for path in outputs:  # refused before the work, not after it
            check_file_output(path)
        data_files = sorted(Path(args.data).iterdir()) if Path(args.data).is_dir() else []
        check_not_input(outputs, [args.checkpoint, args.weights, args.redimnet2, *data_files])
        embedder = embedder_from_args(ap, args)
        if args.pad_ratio is None:
            args.pad_ratio = GPU_PAD_RATIO if embedder.device.type == "cuda" else 0.0
        say = (lambda m: print(m, file=sys.stderr)) if rank == 0 else (lambda m: None)
        store = choose_store(embedder, args.data, args.feats, say)
        ex = StreamingExtractor(
            embedder,
            load_data_dir(args.data, need_speakers=False),
            Path(args.out),
            rank=rank,
            world_size=world,
            store=store,
            **{name: getattr(args, name) for name in EXTRACTOR_OPTIONS},
        )
        emb = ex.run(lambda m: print(m, file=sys.stderr))
        if emb is None:  # not rank 0: its shards are done, rank 0 writes OUT
            return 0
    except (CheckpointError, ListError, AudioError, NonFiniteEmbedding, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_embeddings(args.out, ex.data.utts, emb, args.kaldi, embedder.model_id)
    what = f"{len(emb)} embeddings of dim {emb.shape[1]} ({embedder.name})"
    print(f"extract: {what} -> {args.out} in {time.time() - t0:.1f}s; {args.threads_line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
