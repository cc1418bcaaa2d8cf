"""A run's training data: the corpora of `data.train` read into compact lists
(speakerlab.dataio.tables.compact), checked
at start, and this rank's loader over them (indexed audio crops, the feature store, or tar shards).

Start-up cost does not grow with the corpus beyond reading its lists: with `utt2num_samples` (the prepare stage,
which checked every file) only SPOT_CHECKS files spread over each corpus are checked to exist and have the listed
length; `data.check_audio: true`, or a corpus without that index, checks every file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import torch

from speakerlab.config import SELF_SUPERVISED, Config, ConfigError, needs_labels
from speakerlab.dataio.loaders.batches import CropDataset, GlobalBatchSampler, TooFewItems, collate
from speakerlab.dataio.loaders.shard_stream import ShardStream, pass_batch
from speakerlab.dataio.loaders.shards import load_shard_data
from speakerlab.dataio.tables.compact import CompactLists, read_compact, subset_data_dir, without_labels
from speakerlab.dataio.tables.corpora import Corpus, TrainLists, train_corpora
from speakerlab.dataio.tables.lists import ListError, rerun_features
from speakerlab.dataio.tables.prepare import index_lengths
from speakerlab.dataio.waveform.augment import Augmenter
from speakerlab.features.store import FeatureCropDataset, FeatureStore, collate_feats
from speakerlab.frontends import feature_spec
from speakerlab.train.hardware.batch_plan import BatchPlan
from speakerlab.train.launch.distributed import DistInfo

SPOT_CHECKS = 32  # audio files checked at every start when the length index exists


def check_audio(lists: CompactLists, cfg: Config) -> None:
    """The listed files exist and have the indexed lengths at `data.sample_rate` (all of them, or SPOT_CHECKS
    spread over the list: see the module doc); a corpus without the index gets its lengths here. Errors name
    wav.scp and the line of each file (every missing one), or the stale utt2num_samples entry."""
    n = len(lists)
    full = lists.lengths is None or cfg.data.check_audio
    chosen = range(n) if full else sorted(set(list(range(0, n, max(1, n // SPOT_CHECKS)))[:SPOT_CHECKS] + [n - 1]))
    sample = subset_data_dir(lists, chosen)
    sample.check_audio_exists()
    try:
        lengths = index_lengths(sample, cfg.data.sample_rate)
    except ListError as e:
        raise ListError(f"{e} (config key 'data.sample_rate' is {cfg.data.sample_rate})") from None
    if lists.lengths is None:
        lists.lengths = np.array([lengths[u] for u in sample.utts], dtype=np.int64)
        return
    listed = {u: int(lists.lengths[i]) for i, u in zip(chosen, sample.utts)}
    stale = [(u, listed[u], lengths[u]) for u in sample.utts if listed[u] != lengths[u]]
    if stale:
        utt, listed, actual = stale[0]
        raise ListError(
            f"{lists.root / 'utt2num_samples'}: '{utt}' says {listed} samples, the file has {actual} "
            f"({len(stale)} of {len(chosen)} checked are stale); {rerun_features('speakerlab-prepare', lists.root)}"
        )


def load_train_lists(cfg: Config, log: Callable[[str], None]) -> TrainLists:
    """The corpora of `data.train` (speakerlab.dataio.tables.corpora.resolve_corpora has read a manifest) as one
    training set; its audio checked (module doc), or with `data.shards` its lists checked against the shards' index."""
    corpora = []
    for key, c in train_corpora(cfg.data):
        try:
            lists = read_compact(c.dir)
            if not cfg.data.shards:
                check_audio(lists, cfg)
        except ListError as e:
            raise ListError(f"{e} (config key '{key}')" if c.name else str(e)) from None
        if needs_labels(cfg) and not lists.labelled:
            raise ListError(
                f"{Path(c.dir) / 'utt2spk'}: file does not exist, and loss.name {cfg.loss.name} classifies speakers "
                f"(config key '{key}'); to train on unlabelled audio set loss.name to {' or '.join(SELF_SUPERVISED)}"
            )
        if not needs_labels(cfg):  # a self-supervised objective: the speakers of a labelled dir are not read
            lists = without_labels(lists)
        corpora.append(Corpus(name=c.name, lists=lists, weight=c.weight))
    data = TrainLists(corpora)
    if cfg.data.shards:
        load_shard_data(cfg.data, data, log)
    else:
        log(f"training data: {data.describe()}")
    return data


class JoinedStore:
    """The feature stores of several corpora as one: `store['name/utt']` is corpus `name`'s `store['utt']`, and
    row r of the whole (FeatureStore.rows, .load) is row r - starts[c] of the c-th store."""

    def __init__(self, stores: Dict[str, FeatureStore]):
        self.stores, self.parts = stores, list(stores.values())
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in self.parts])]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def root_of(self, utt: str) -> Path:
        name = utt.partition("/")[0]
        return self.stores[name].root if name in self.stores else self.parts[0].root

    def __contains__(self, utt: str) -> bool:
        name, _, rest = utt.partition("/")
        return name in self.stores and rest in self.stores[name]

    def __getitem__(self, utt: str) -> np.ndarray:
        name, _, rest = utt.partition("/")
        return self.stores[name][rest]

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """The row of each `name/utt` of `keys` (an `S` array (N,)), -1 where absent: int64 (N,)."""
        rows = np.full(len(keys), -1, dtype=np.int64)
        for (name, store), start in zip(self.stores.items(), self.starts):
            prefix = f"{name}/".encode("utf-8")
            width = keys.itemsize - len(prefix)  # of the ids after the prefix
            mine = np.char.startswith(keys, prefix) if width > 0 else np.zeros(len(keys), dtype=bool)
            if not mine.any():
                continue
            # The ids without `name/`: each fixed-width row of bytes shifted left by the prefix's length.
            chars = keys[mine].view(np.uint8).reshape(-1, keys.itemsize)[:, len(prefix) :]
            found = store.rows(np.ascontiguousarray(chars).view(f"S{width}").ravel())
            rows[mine] = np.where(found >= 0, found + start, -1)
        return rows

    def load(self, row: int) -> np.ndarray:
        c = int(np.searchsorted(self.starts, row, side="right")) - 1
        return self.parts[c].load(row - int(self.starts[c]))


def feature_dataset(cfg: Config, data: TrainLists, crop: int) -> FeatureCropDataset:
    """Frame crops of each corpus's `feats.scp` (data.feats), checked against the config's fbank options."""
    fb = feature_spec(cfg.features, cfg.data.sample_rate).fbank
    stores = {c.name: FeatureStore(c.lists.root, fb) for c in data.corpora}
    store = JoinedStore(stores) if data.corpora[0].name else stores[""]
    return FeatureCropDataset(store, data.utts, data.paths, data.labels, crop, fb)


def make_loader(
    cfg: Config,
    data: TrainLists,
    plan: BatchPlan,
    info: DistInfo,
    pin_memory: bool,
    augmenter: Optional[Augmenter] = None,
    channel=None,
):
    """(DataLoader, sampler) of this rank: crops of the indexed lists, of the feature store, or a stream
    of tar shards (which batches itself and is the run's sampler)."""
    crop = int(round(cfg.data.crop_seconds * cfg.data.sample_rate))
    cropping = dict(  # how every audio item is drawn and read, indexed or from shards
        crop_samples=crop,
        sample_rate=cfg.data.sample_rate,
        augment=augmenter,
        speed_factors=cfg.augment.speed_factors,
        speed_prob=cfg.augment.speed_prob,
        skip_bad=cfg.data.on_bad_audio == "skip",
        channel=channel,
        # DINO: each crop of an utterance gets its own augmentation draw, as in the papers
        augment_copies=cfg.dino.global_crops + cfg.dino.local_crops if cfg.loss.name == "dino" else 1,
    )
    hw = cfg.hardware
    # A generator of its own: without one, every iter(DataLoader) draws its workers' base seed from torch's
    # global random state, which the front-end's dither also draws from, so a run resumed mid-epoch (one draw
    # fewer before the restored state) would dither differently from an uninterrupted one. The data's own
    # randomness never comes from torch (crops and order are drawn from (seed, epoch, position)).
    own = torch.Generator().manual_seed(cfg.train.seed)
    workers = dict(num_workers=hw.num_workers, pin_memory=pin_memory, generator=own)
    if hw.num_workers > 0:
        workers.update(prefetch_factor=hw.prefetch_factor, persistent_workers=False)
    split = (plan.global_batch, plan.per_device, plan.accumulation, info.rank, info.world_size, cfg.train.seed)
    try:
        if cfg.data.shards:
            stream = ShardStream(cfg.data.shards, *split, cfg.data.shuffle_buffer, **cropping)
            return torch.utils.data.DataLoader(stream, batch_size=None, collate_fn=pass_batch, **workers), stream
        if cfg.data.feats:
            dataset = feature_dataset(cfg, data, crop)
        else:
            dataset = CropDataset(data.paths, data.labels, data.lengths, **cropping)
        sampler = GlobalBatchSampler(len(dataset), *split, blocks=data.blocks)
    except TooFewItems as e:  # not one step of an epoch: name the keys that decide it
        raise ConfigError(
            f"config key 'train.global_batch_size' ({plan.global_batch}): {e} of data.train: lower it or train on "
            "more utterances"
        ) from None
    collate_fn = collate_feats if cfg.data.feats else collate
    return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, **workers), sampler
