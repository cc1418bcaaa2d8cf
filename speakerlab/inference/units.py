"""The units of extraction and their two sources: the audio of a data dir, or its offline feature store.

A unit is an utterance, or an equal chunk of one longer than the extractor's `--max-seconds`
(`plan_units`). `AudioSource` reads units as `(samples,)` segments of the wav.scp files and embeds them
through the model's own front-end; `StoreSource` reads them as `(frames, F)` ranges of the stored Kaldi
fbank (speakerlab-feature-store) and embeds them past the fbank. Both give the extraction lifecycle
(speakerlab.inference.extract) the same things: unit lengths, batch lengths, a Dataset of units, the
embedding call and, for error messages, where each utterance came from. `choose_store` picks the store
for the `--feats auto|yes|no` choice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from speakerlab.dataio.audio import audio_info, read_segment
from speakerlab.dataio.tables.lists import DataDir, ListError
from speakerlab.features.fbank import num_frames
from speakerlab.frontends import FRONT_ENDS
from speakerlab.inference.embedder import Embedder


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


class AudioSource:
    """Units from the audio files of `data` (all checked to exist first): samples through the model's
    front-end, batched by the front-end's batch length (fbank frames, or samples for front-ends that
    normalise the whole wave), so units of equal batch length embed exactly as they would alone."""

    kind = "audio"

    def __init__(self, embedder: Embedder, data: DataDir):
        data.check_audio_exists()
        self.embedder, self.data = embedder, data

    def length(self, samples: int) -> int:
        """Samples -> this source's unit length (samples)."""
        return samples

    def batch_length(self, n: int) -> int:
        return self.embedder.features.batch_length(n)

    def budget(self, seconds: float) -> int:
        """Padded batch length of `seconds` of audio."""
        return self.embedder.features.batch_length(int(seconds * self.embedder.sample_rate))

    def dataset(self, utt: np.ndarray, start: np.ndarray, length: np.ndarray) -> Dataset:
        paths = [self.data.wav[u] for u in self.data.utts]
        return AudioUnits(paths, utt, start, length, self.embedder.sample_rate)

    def embed(self, waves: torch.Tensor) -> torch.Tensor:
        """`(B, samples)` -> `(B, D)`."""
        return self.embedder(waves)

    def origins(self) -> List[str]:
        """Where each utterance's embedding came from, for error messages: its wav.scp line."""
        scp = self.data.root / "wav.scp"
        return [f"{scp}:{self.data.wav_line[u]}: {u} ({self.data.wav[u]})" for u in self.data.utts]


class StoreSource:
    """Units from `store`, an opened `FeatureStore` of `data` holding the embedder's fbank: frame ranges,
    cut at the frame count of the audio's samples, batched by frames."""

    kind = "feats"

    def __init__(self, embedder: Embedder, data: DataDir, store):
        self.embedder, self.data, self.store = embedder, data, store

    def length(self, samples: int) -> int:
        """Samples -> this source's unit length (fbank frames)."""
        return num_frames(samples, self.embedder.spec.fbank)

    def batch_length(self, n: int) -> int:
        return n

    def budget(self, seconds: float) -> int:
        """Frames in `seconds`."""
        return int(seconds / (self.embedder.spec.fbank.frame_shift_ms / 1000))

    def dataset(self, utt: np.ndarray, start: np.ndarray, length: np.ndarray) -> Dataset:
        return FeatureUnits(self.store, self.data.utts, utt, start, length)

    def embed(self, feats: torch.Tensor) -> torch.Tensor:
        """`(B, frames, F)` stored fbank -> `(B, D)`."""
        return self.embedder.embed_fbank(feats)

    def origins(self) -> List[str]:
        """Where each utterance's embedding came from, for error messages: its feats.scp entry."""
        return [f"{self.data.root / 'feats.scp'}: {u}" for u in self.data.utts]


UnitSource = Union[AudioSource, StoreSource]


def unit_source(embedder: Embedder, data: DataDir, store=None) -> UnitSource:
    """The store's units when `store` (a `FeatureStore` of `data`) is given, else the audio's."""
    return AudioSource(embedder, data) if store is None else StoreSource(embedder, data, store)


def fitting_store(embedder: Embedder, data_dir, log: Optional[Callable[[str], None]] = None):
    """The offline feature store of `data_dir` (a `FeatureStore`) when it exists and holds the
    checkpoint's fbank, else None; `log` says which."""
    if not (Path(data_dir) / "feats.scp").exists():
        return None
    from speakerlab.features.store import FeatureStore

    say = log or (lambda m: None)
    if not FRONT_ENDS[embedder.spec.kind].storable:
        say(f"extract: not using the feature store of {data_dir}: it holds Kaldi fbank, not {embedder.spec.kind}")
        return None
    try:
        store = FeatureStore(data_dir, embedder.spec.fbank)
    except (ValueError, ListError) as e:
        say(f"extract: not using the feature store of {data_dir}: {e}")
        return None
    say(f"extract: fbank from the feature store {Path(data_dir) / 'feats.scp'}")
    return store


def choose_store(embedder: Embedder, data_dir, feats: str, log: Callable[[str], None]):
    """The `--feats` choice -> a `FeatureStore` or None (the audio): `auto` the fitting store if any,
    `yes` the store (a ValueError or ListError saying why it cannot be), `no` none."""
    if feats == "auto":
        return fitting_store(embedder, data_dir, log)
    if feats == "no":
        return None
    from speakerlab.features.store import FeatureStore

    if not FRONT_ENDS[embedder.spec.kind].storable:
        raise ValueError(f"--feats yes: the feature store holds Kaldi fbank, the model takes {embedder.spec.kind}")
    return FeatureStore(data_dir, embedder.spec.fbank)
