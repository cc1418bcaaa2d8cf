"""Training batches: random fixed-length crops, in an order that does not depend on the hardware.

The order of one epoch is a permutation drawn from (seed, epoch). Optimizer step k consumes global
positions [k*G, (k+1)*G) of it (G = global batch), split into world_size x accumulation micro-batches.
Each item's crop offset is drawn from (seed, epoch, position). So the samples seen by every
optimizer step, and their crops, are the same on 1 or 8 GPUs, with any accumulation and any
number of loader workers; and a run resumed at step k continues with exactly the batches it
would have seen. Augmentation (speakerlab.augment) draws from the same per-item generator, right
after the crop, so augmented samples keep that guarantee.
"""
from __future__ import annotations

from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from speakerlab.audio import read_crop

Item = Tuple[int, int]  # (utterance index, crop seed)
Augment = Callable[[np.ndarray, np.random.Generator], np.ndarray]  # (crop,) float32 -> (crop,) float32


class CropDataset(Dataset):
    """Indexed by `(utterance index, crop seed)`; returns `(wave (crop,), label, utterance index)`.

    `augment` (e.g. a `speakerlab.augment.Augmenter`) transforms each crop with the item's generator."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int], lengths: Sequence[int],
                 crop_samples: int, sample_rate: int = 16000, augment: Optional[Augment] = None):
        if not (len(paths) == len(labels) == len(lengths)):
            raise ValueError("paths, labels and lengths must have equal lengths")
        self.paths, self.labels, self.lengths = list(paths), list(labels), list(lengths)
        self.crop_samples, self.sample_rate, self.augment = crop_samples, sample_rate, augment

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item: Item):
        index, crop_seed = item
        rng = np.random.default_rng(crop_seed)
        wave = read_crop(self.paths[index], self.crop_samples, self.lengths[index], rng, self.sample_rate)
        if self.augment is not None:
            wave = self.augment(wave, rng)
        return torch.from_numpy(np.ascontiguousarray(wave)), self.labels[index], index


class GlobalBatchSampler(Sampler[List[Item]]):
    """Yields this rank's micro-batches, `accumulation` per optimizer step, for one epoch.

    Set the epoch (and the step to start from, when resuming mid-epoch) with `set_epoch` before
    iterating. Each epoch has `num_items // global_batch` steps; the remainder is dropped (it
    changes with the permutation, so every item is still seen across epochs).
    """

    def __init__(self, num_items: int, global_batch: int, micro_batch: int, accumulation: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0):
        if micro_batch * accumulation * world_size != global_batch:
            raise ValueError(f"global batch {global_batch} != micro batch {micro_batch} x accumulation "
                             f"{accumulation} x world size {world_size}")
        if num_items < global_batch:
            raise ValueError(f"{num_items} training utterances are fewer than one global batch ({global_batch})")
        self.num_items, self.global_batch = num_items, global_batch
        self.micro_batch, self.accumulation = micro_batch, accumulation
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.start_step = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return self.num_items // self.global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.start_step) * self.accumulation

    def __iter__(self) -> Iterator[List[Item]]:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.num_items)
        # One seed per global position; distinct streams for (seed, epoch, position).
        crop_seeds = np.random.default_rng([self.seed, self.epoch, 1]).integers(0, 2**62, self.num_items)
        mb = self.micro_batch
        for step in range(self.start_step, self.steps_per_epoch):
            base = step * self.global_batch
            for a in range(self.accumulation):
                lo = base + (a * self.world_size + self.rank) * mb
                yield [(int(perm[p]), int(crop_seeds[p])) for p in range(lo, lo + mb)]
