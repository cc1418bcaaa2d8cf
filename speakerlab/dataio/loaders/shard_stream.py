"""Training from tar shards (speakerlab.dataio.loaders.shards writes them and their index): `ShardStream`,
this rank's micro-batches of one epoch.

An epoch is the concatenation of the shards' samples, the shard order a
permutation drawn from (seed, epoch). With N samples and global batch G it has N // G steps on every
rank (computed from shards.json alone, so no rank waits at the epoch end); rank r streams positions
[r n, (r+1) n), n = steps x micro batch x accumulation, and the N - steps x G samples left over are
dropped (which ones changes with the shard order). The loader workers of a rank split its range in
contiguous runs of whole micro-batches, each opening only the shards it overlaps, and shuffle what
they read in a buffer of `data.shuffle_buffer` samples. An item's crop (and speed and augmentation
draws) come from (seed, epoch, utterance index), whichever worker reads it; its decoding reads only
the crop's frames, from memory.

Guarantees. Hold: every rank runs the same number of steps; each utterance is seen at most once per
epoch (every one, when N divides by G); the batches are a function of (seed, epoch, world size,
micro batch, accumulation, worker count, buffer size); a run resumed mid-epoch with the same world
size, micro batch and worker count sees exactly the batches it would have seen (the skipped
micro-batches are read from the shards, not decoded). Do not hold, unlike the indexed path
(`speakerlab.dataio.loaders.batches`): the same batches on other hardware, i.e. another world size, micro batch or
worker count; a resume after such a change is exact in the step and the schedules, but the rest of
that epoch's samples differ (some utterances may be seen twice in it, others not at all).
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import numpy as np
import torch
from torch.utils.data import IterableDataset

from speakerlab.dataio.audio import read_crop_int16
from speakerlab.dataio.loaders.batches import CropDataset, TooFewItems, check_split, collate
from speakerlab.dataio.loaders.shards import SHARDS_JSON, import_webdataset, key_index, load_index
from speakerlab.dataio.tables.columns import FixedView, JoinedView
from speakerlab.dataio.tables.lists import ListError

# Distinct numpy seed sequences per use; the indexed path's are (seed, epoch) and (seed, epoch, 1).
TAG_SHARD_ORDER, TAG_CROP, TAG_BUFFER = 10, 11, 12


class ShardStream(IterableDataset):
    """This rank's micro-batches of one epoch, streamed from tar shards: `collate` dicts, `accumulation`
    per optimizer step, `len(self)` of them (use `DataLoader(stream, batch_size=None)`).

    The API of `GlobalBatchSampler` (`steps_per_epoch`, `set_epoch(epoch, start_step)`, `len`) so the
    training loop drives either; items are exactly `CropDataset`'s (wave int16 `(read_samples,)`,
    finite, label, index = the utterance's index in shards.json, speed, picked)."""

    def __init__(
        self,
        shard_dir,
        global_batch: int,
        micro_batch: int,
        accumulation: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        **crop,  # CropDataset's crop_samples, sample_rate, augment, speed_factors, speed_prob, skip_bad
    ):
        check_split(global_batch, micro_batch, accumulation, world_size)
        self.root = Path(shard_dir)
        index, where = load_index(self.root), self.root / SHARDS_JSON
        if index["total"] < global_batch:
            raise TooFewItems(f"{where}: {index['total']} utterances are fewer than one global batch ({global_batch})")
        self.files = [s["file"] for s in index["shards"]]
        self.counts = np.array([s["count"] for s in index["shards"]], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)])  # written index of each shard's first sample
        # Views of the memory-mapped arrays (load_index): reading them in a loader worker copies nothing.
        self.utts = FixedView(index["utts"])
        # `<shard>:<utt>` of each written index, made when asked (errors, batch_culprits name samples by it).
        shards = zip(self.files, self.offsets[:-1], self.offsets[1:])
        views = [FixedView(index["utts"][a:b], f"{self.root / f}:") for f, a, b in shards]
        self.paths = JoinedView(views, self.offsets)
        self.items = CropDataset(self.paths, index["labels"], index["num_samples"], **crop)
        self.crop_samples, self.sample_rate = self.items.crop_samples, self.items.sample_rate
        if index["sample_rate"] != self.sample_rate:
            raise ListError(f"{where}: written at {index['sample_rate']} Hz, not at {self.sample_rate} Hz")
        self.global_batch, self.micro_batch, self.accumulation = global_batch, micro_batch, accumulation
        self.rank, self.world_size, self.seed, self.buffer = rank, world_size, seed, shuffle_buffer
        self.epoch, self.start_step = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return int(self.offsets[-1]) // self.global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.start_step) * self.accumulation

    def crop_seed(self, index: int) -> List[int]:
        """The seed of utterance `index`'s crop, speed and augmentation draws in the current epoch."""
        return [self.seed, self.epoch, TAG_CROP, index]

    def worker_plan(self, worker: int, workers: int) -> Tuple[int, int, int, int]:
        """(logical worker w, its first epoch position, its micro-batches, how many of them to skip).

        The loader takes micro-batches from its workers in turn, so micro-batch j of the rank's epoch
        comes from logical worker j % workers, which reads the j // workers-th micro-batch of its
        contiguous run. Resumed at micro-batch S the loader starts again at worker 0: loader worker k
        then plays logical worker (k + S) % workers, so the order of an uninterrupted run is kept."""
        total = self.steps_per_epoch * self.accumulation  # this rank's micro-batches
        done = self.start_step * self.accumulation
        w = (worker + done) % workers
        before = sum(len(range(v, total, workers)) for v in range(w))
        first = (self.rank * total + before) * self.micro_batch
        return w, first, len(range(w, total, workers)), len(range(w, done, workers))

    def _read(self, lo: int, hi: int) -> Iterator[Tuple[int, str, bytes]]:
        """(written index, audio extension, audio bytes) of epoch positions [lo, hi): the shards in this
        epoch's order, each opened only when it overlaps and left as soon as the range ends in it."""
        wds = import_webdataset()
        order = np.random.default_rng([self.seed, self.epoch, TAG_SHARD_ORDER]).permutation(len(self.files))
        start = 0
        for s in order:
            a, b = max(lo - start, 0), min(hi - start, int(self.counts[s]))
            start += int(self.counts[s])
            if a >= b:
                continue
            first, end, path = int(self.offsets[s]) + a, int(self.offsets[s]) + b, self.root / self.files[s]

            def members(f, first=first, end=end, path=path):
                # Members before the range are passed over unread (select_files); the first member past
                # it ends the shard, so group_by_keys sees only the wanted samples.
                for m in wds.tariterators.tar_file_iterator(f, select_files=lambda n: key_index(n) >= first):
                    if key_index(m["fname"]) >= end:
                        return
                    m["__url__"] = str(path)
                    yield m

            got, stale = first, f"{path} is not the shard {SHARDS_JSON} lists; rewrite the shards"
            try:
                with open(path, "rb") as f:
                    for sample in wds.tariterators.group_by_keys(members(f)):
                        audio = [k for k in sample if not k.startswith("__") and k != "json"]
                        if key_index(sample["__key__"]) != got or len(audio) != 1 or "json" not in sample:
                            raise ListError(f"{stale} (sample '{sample['__key__']}')")
                        if json.loads(sample["json"])["utt"] != self.utts[got]:
                            raise ListError(f"{stale} (sample {got} is not '{self.utts[got]}')")
                        yield got, audio[0], sample[audio[0]]
                        got += 1
            except ListError:
                raise
            except (OSError, EOFError, ValueError, tarfile.TarError) as e:  # webdataset appends " @ <file>"
                raise ListError(f"{path}: unreadable at sample {got}: {str(e).split(' @ ')[0]}") from None
            if got != end:
                raise ListError(f"{path}: no sample {got}, {SHARDS_JSON} lists up to {end - 1}: a truncated shard")

    def _shuffled(self, samples: Iterator, rng: np.random.Generator) -> Iterator:
        """A shuffle buffer of `self.buffer` samples: each new sample replaces a random one, which is
        emitted; the rest in random order at the end. Own code, not webdataset's `shuffle`, for a numpy
        generator seeded from (seed, epoch, rank, worker)."""
        buf = []
        for s in samples:
            if len(buf) < self.buffer:
                buf.append(s)
                continue
            j = int(rng.integers(len(buf)))
            buf[j], s = s, buf[j]
            yield s
        for j in rng.permutation(len(buf)):
            yield buf[j]

    def _item(self, index: int, data: bytes) -> Dict[str, object]:
        def read(num_samples: int, rng: np.random.Generator):
            n = int(self.items.lengths[index])
            return read_crop_int16(io.BytesIO(data), num_samples, n, rng, self.sample_rate, self.paths[index])

        return self.items.crop_item(index, self.crop_seed(index), read)

    def __iter__(self) -> Iterator[Dict[str, object]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        w, first, count, skip = self.worker_plan(worker, workers)
        if count <= skip:
            return
        mb = self.micro_batch
        rng = np.random.default_rng([self.seed, self.epoch, TAG_BUFFER, self.rank, w])
        stream = self._shuffled(self._read(first, first + count * mb), rng)
        for b in range(count):
            batch = [next(stream) for _ in range(mb)]
            if b >= skip:  # a resumed run reads the skipped batches (the buffer needs them) but decodes none
                yield collate([self._item(index, data) for index, _, data in batch])


def pass_batch(batch):
    """The loader's collate_fn for a ShardStream, which collates itself (module level: picklable)."""
    return batch
