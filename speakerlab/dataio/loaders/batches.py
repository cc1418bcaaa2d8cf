"""Training batches: random fixed-length crops, in an order that does not depend on the hardware.

The order of one epoch is a permutation drawn from (seed, epoch). Optimizer step k consumes global
positions [k*G, (k+1)*G) of it (G = global batch), split into world_size x accumulation micro-batches.
Each item's crop offset is drawn from (seed, epoch, position). So the samples seen by every
optimizer step, and their crops, are the same on 1 or 8 GPUs, with any accumulation and any
number of loader workers; and a run resumed at step k continues with exactly the batches it
would have seen. Speed perturbation and augmentation (speakerlab.dataio.waveform.augment) draw from the same
per-item generator, so augmented samples keep that guarantee.

Several corpora with sampling weights (speakerlab.dataio.tables.corpora.TrainLists.blocks): the items of an epoch are
drawn first, from (seed, epoch, 2, corpus): a corpus of n utterances and weight w gives floor(w) copies of all
of them plus round((w - floor(w)) n) of them drawn without repeats, so an epoch holds round(w n) of its
utterances (a fixed number: steps per epoch do not change), a new subset each epoch; the permutation and the
crops then go over those items as above. Weights all 1 draw nothing: the epoch is every utterance once, the
order exactly that of one corpus.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from speakerlab.dataio.audio import AudioError, read_crop_int16
from speakerlab.dataio.waveform.augment import EQ_HZ, Augmenter, Draw
from speakerlab.dataio.waveform.speed import factor_classes, input_length

Item = Tuple[int, int]  # (utterance index, crop seed)
CropReader = Callable[[int, np.random.Generator], Tuple[np.ndarray, bool]]  # (samples, rng) -> (int16 crop, finite)


class CropDataset(Dataset):
    """Indexed by `(utterance index, crop seed)`; returns one item of `collate`'s input (a dict).

    Draws, in this order, from `np.random.default_rng(crop seed)`: the speed class (only when
    `speed_prob` > 0: with that probability a factor drawn uniformly among the factors other than
    1), the crop offset, then the augmentation (`augment.pick`), then the channel's (`channel.apply`). The worker reads
    `input_length(crop, factor)` int16 samples (only those frames), zero-padded to `read_samples`
    (the most any factor needs) so that items stack; the arithmetic happens batched on the
    training device (`speakerlab.train.inputs.pipeline.InputPipeline`). With `augment_copies` C > 1 (a multi-crop
    objective: one per crop) the item's `picked` is a list of C augmentations, each drawn from a generator of its
    own seeded by C numbers drawn after the crop: a function of (crop seed, copy) only. With `skip_bad`, a read
    that fails gives a silent item whose `bad` names the file and the reason (the training step drops that row);
    otherwise the AudioError propagates.
    """

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int],
        lengths: Sequence[int],
        crop_samples: int,
        sample_rate: int = 16000,
        augment: Optional[Augmenter] = None,
        speed_factors: Sequence[float] = (),
        speed_prob: float = 0.0,
        skip_bad: bool = False,
        channel=None,
        augment_copies: int = 1,
    ):
        if not (len(paths) == len(labels) == len(lengths)):
            raise ValueError("paths, labels and lengths must have equal lengths")
        # Kept as given: numpy arrays and speakerlab.dataio.tables.compact views, whose reads in a forked worker write
        # nothing shared (a list's items would have their reference counts written, and their pages copied).
        self.paths, self.labels, self.lengths = paths, labels, lengths
        self.crop_samples, self.sample_rate, self.augment = crop_samples, sample_rate, augment
        self.factors, self.speed_prob = factor_classes(speed_factors), float(speed_prob)
        self.skip_bad, self.channel = skip_bad, channel  # channel: a speakerlab.dataio.waveform.degrade.ChannelAugment
        self.augment_copies = int(augment_copies)
        if self.speed_prob > 0 and len(self.factors) < 2:
            raise ValueError(f"speed_prob {speed_prob} needs a speed factor other than 1, got {list(speed_factors)}")
        self.read_samples = max(input_length(crop_samples, f) for f in self.factors)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, item: Item) -> Dict[str, object]:
        index, crop_seed = item

        def read(num_samples: int, rng: np.random.Generator) -> Tuple[np.ndarray, bool]:
            return read_crop_int16(self.paths[index], num_samples, int(self.lengths[index]), rng, self.sample_rate)

        return self.crop_item(index, crop_seed, read)

    def crop_item(self, index: int, crop_seed, read: CropReader) -> Dict[str, object]:
        """The item of utterance `index` whose crop `read(num_samples, rng) -> (int16 (num_samples,), finite)`
        reads (from its file here; from a tar shard's bytes in `speakerlab.dataio.loaders.shards`); `crop_seed` is
        anything `np.random.default_rng` takes. One function for both, so both draw alike."""
        rng = np.random.default_rng(crop_seed)
        speed = 0
        if self.speed_prob > 0 and rng.random() < self.speed_prob:
            speed = 1 + int(rng.integers(len(self.factors) - 1))
        need = input_length(self.crop_samples, self.factors[speed])
        wave = np.zeros(self.read_samples, dtype=np.int16)
        bad = ""
        try:
            wave[:need], finite = read(need, rng)
        except AudioError as e:
            if not self.skip_bad:
                raise
            bad, finite = str(e), True
        picked = None
        if self.augment is not None and self.augment_copies > 1:
            seeds = rng.integers(0, 2**62, self.augment_copies)
            picked = [self.augment.pick(np.random.default_rng(int(s)), self.crop_samples) for s in seeds]
        elif self.augment is not None:
            picked = self.augment.pick(rng, self.crop_samples)
        if self.channel is not None:
            wave[:need] = self.channel.apply(wave[:need], rng)
        return {
            "wave": wave,
            "finite": finite,
            "label": int(self.labels[index]),
            "index": index,
            "speed": speed,
            "picked": picked,
            "bad": bad,
        }


def collate(items: Sequence[Dict[str, object]]) -> Dict[str, object]:
    """Dataset items -> one batch (runs in the loader worker). B items, R reverberated, S noise segments:

    wave (B, N') int16; finite (B,) bool (False: the file had NaN / inf samples);
    label / index / speed (B,) int64; snr (C x B,) float32 (nan: no additive noise);
    rir (R, L) int16 zero-padded, rir_item (R,) int64 the augmented row of each;
    noise (S, crop) int16, noise_item (S,) int64; eq (Q, len(EQ_HZ)) float32 the equaliser gains in dB of the Q
    equalised rows, eq_item (Q,) int64 those rows; draws: each augmented row's `Draw` (a list, stays on the host);
    bad: per item "" or why its audio could not be read (a list, stays on the host); copies: C, the augmented
    copies of each item (items with a list of C augmentations, CropDataset augment_copies), rows copy-major
    (row c x B + i: copy c of item i); 1 otherwise.
    """
    b = len(items)
    copies = len(items[0]["picked"]) if isinstance(items[0]["picked"], list) else 1
    picked = [it["picked"] for it in items]
    if copies > 1:
        picked = [it["picked"][c] for c in range(copies) for it in items]
    rirs = [(i, p.rir) for i, p in enumerate(picked) if p is not None and p.rir is not None]
    segs = [(i, s) for i, p in enumerate(picked) if p is not None for s in p.noise]
    rir = np.zeros((len(rirs), max((r.shape[0] for _, r in rirs), default=1)), dtype=np.int16)
    for row, (_, r) in enumerate(rirs):
        rir[row, : r.shape[0]] = r
    noise = np.stack([s for _, s in segs]) if segs else np.zeros((0, 1), dtype=np.int16)
    draws = [p.draw if p is not None else Draw() for p in picked]
    eqs = [(i, d.eq_db) for i, d in enumerate(draws) if d.eq_db]

    def ints(values) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64)

    return {
        "wave": torch.from_numpy(np.stack([it["wave"] for it in items])),
        "finite": torch.tensor([bool(it["finite"]) for it in items]),
        "label": ints(it["label"] for it in items),
        "index": ints(it["index"] for it in items),
        "speed": ints(it["speed"] for it in items),
        "snr": torch.tensor([d.snr_db for d in draws], dtype=torch.float32).reshape(copies * b),
        "rir": torch.from_numpy(rir),
        "rir_item": ints(i for i, _ in rirs),
        "noise": torch.from_numpy(noise),
        "noise_item": ints(i for i, _ in segs),
        "eq": torch.tensor([g for _, g in eqs], dtype=torch.float32).reshape(len(eqs), len(EQ_HZ)),
        "eq_item": ints(i for i, _ in eqs),
        "draws": draws,
        "bad": [str(it.get("bad", "")) for it in items],
        "copies": copies,
    }


class TooFewItems(ValueError):
    """Fewer training items than one global batch: not one step of an epoch could be drawn."""


def check_split(global_batch: int, micro_batch: int, accumulation: int, world_size: int) -> None:
    """A global batch is world size x accumulation x micro batch, exactly (both batch orders need it)."""
    if micro_batch * accumulation * world_size != global_batch:
        raise ValueError(
            f"global batch {global_batch} != micro batch {micro_batch} x accumulation "
            f"{accumulation} x world size {world_size}"
        )


class GlobalBatchSampler(Sampler[List[Item]]):
    """Yields this rank's micro-batches, `accumulation` per optimizer step, for one epoch.

    Set the epoch (and the step to start from, when resuming mid-epoch) with `set_epoch` before
    iterating. Each epoch has `num_items // global_batch` steps; the remainder is dropped (it
    changes with the permutation, so every item is still seen across epochs).
    """

    def __init__(
        self,
        num_items: int,
        global_batch: int,
        micro_batch: int,
        accumulation: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        blocks: Optional[Sequence[Tuple[int, float]]] = None,
    ):
        check_split(global_batch, micro_batch, accumulation, world_size)
        self.blocks = [(int(n), float(w)) for n, w in blocks] if blocks else [(num_items, 1.0)]
        if sum(n for n, _ in self.blocks) != num_items:
            raise ValueError(f"blocks {self.blocks} do not add up to {num_items} items")
        self.epoch_items = sum(_drawn(n, w) for n, w in self.blocks)
        if self.epoch_items < global_batch:
            what = f"{num_items} training utterances" + (" (weighted)" if self.epoch_items != num_items else "")
            raise TooFewItems(f"{what} are fewer than one global batch ({global_batch})")
        self.num_items, self.global_batch = num_items, global_batch
        self.micro_batch, self.accumulation = micro_batch, accumulation
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.start_step = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return self.epoch_items // self.global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.start_step) * self.accumulation

    def items(self) -> np.ndarray:
        """The utterance indices of this epoch, before the permutation `(epoch_items,)` (see the module doc)."""
        if all(w == 1.0 for _, w in self.blocks):
            return np.arange(self.num_items)
        out, start = [], 0
        for c, (n, w) in enumerate(self.blocks):
            whole = int(np.floor(w))
            out.extend([np.arange(start, start + n)] * whole)
            rest = _drawn(n, w) - whole * n
            if rest:
                out.append(start + np.random.default_rng([self.seed, self.epoch, 2, c]).permutation(n)[:rest])
            start += n
        return np.concatenate(out)

    def __iter__(self) -> Iterator[List[Item]]:
        items = self.items()
        perm = items[np.random.default_rng([self.seed, self.epoch]).permutation(self.epoch_items)]
        # One seed per global position; distinct streams for (seed, epoch, position).
        crop_seeds = np.random.default_rng([self.seed, self.epoch, 1]).integers(0, 2**62, self.epoch_items)
        mb = self.micro_batch
        for step in range(self.start_step, self.steps_per_epoch):
            base = step * self.global_batch
            for a in range(self.accumulation):
                lo = base + (a * self.world_size + self.rank) * mb
                yield [(int(perm[p]), int(crop_seeds[p])) for p in range(lo, lo + mb)]


def _drawn(n: int, weight: float) -> int:
    """How many items an epoch draws from a corpus of `n` with this weight: round(weight x n)."""
    return int(np.floor(weight)) * n + int(round((weight - np.floor(weight)) * n))
