"""Several corpora in one training run: `data.train` as a list of {name, dir, weight, val} (or a YAML manifest of
that list), their speaker-id namespaces, and the joined training set.

    data:
      train:
        - {name: vb2, dir: data/vb2}
        - {name: vox2, dir: data/vox2_dev, weight: 2.0, val: data/vox1_test}
        - {name: cnc2, dir: data/cnceleb_train}
      # or: train: conf/corpora.yaml, a file holding that list (its relative dirs are relative to its folder)

Each corpus's utterance and speaker ids are read as `name/id`: `vox2/id00012` and `vb2/id00012` are two
speakers, and the classifier's classes (the checkpoint's speaker list) carry the namespace. A run on one data dir
given by its path (`train: data/vox2_dev`) keeps its ids as they are. The corpora come one after the other in the
given order, each sorted by id; a weight says how many passes over a corpus an epoch makes
(speakerlab.dataio.loaders.batches); `val` is a data dir with trials scored for that corpus during training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np
import yaml

from speakerlab.config import DataSettings, TrainCorpus
from speakerlab.dataio.tables.columns import JoinedView
from speakerlab.dataio.tables.compact import CompactLists
from speakerlab.dataio.tables.lists import DataDir, ListError, load_data_dir
from speakerlab.settings import ConfigError, build_settings, read_yaml

MANIFEST_SUFFIXES = (".yaml", ".yml")


def _record_lines(path: Path) -> List[int]:
    """The line (1-based) where each record of the YAML list in `path` starts (read_yaml has checked the YAML)."""
    with open(path) as f:
        node = yaml.compose(f, Loader=yaml.SafeLoader)
    return [item.start_mark.line + 1 for item in node.value] if isinstance(node, yaml.SequenceNode) else []


def read_manifest(path: Path) -> List[TrainCorpus]:
    """A YAML file holding the list of data.train's records; errors name the file and the record's key. A
    relative `dir` or `val` is relative to the manifest's folder (the list moves with its corpora, whatever the
    current directory); a `dir` or `val` that is not an existing folder is an error naming the file and line."""
    try:
        raw = read_yaml(path, "manifest")
    except ConfigError as e:
        raise ConfigError(f"config key 'data.train': {e}") from None
    if not isinstance(raw, list):
        raise ConfigError(f"config key 'data.train': manifest {path} must hold a list of {{name, dir}} records")
    try:
        records = [build_settings(TrainCorpus, item, f"data.train[{i}]") for i, item in enumerate(raw)]
    except ConfigError as e:
        raise ConfigError(f"{e} (in the manifest {path})") from None
    for i, (record, line) in enumerate(zip(records, _record_lines(path))):
        for key in ("dir", "val"):
            folder = getattr(record, key)
            if not folder:
                continue
            folder = str(path.parent / folder)  # an absolute `folder` stays as it is
            setattr(record, key, folder)
            if not Path(folder).is_dir():
                what = "is not a folder" if Path(folder).exists() else "does not exist"
                raise ConfigError(f"{path}:{line}: {key} {folder} {what} (config key 'data.train[{i}].{key}')")
    return records


def resolve_corpora(data: DataSettings) -> None:
    """Read a manifest into `data.train` (so the run records the corpora themselves) and check the list: every
    corpus has a name, distinct, without whitespace or '/', and a dir; weights need the indexed path."""
    if isinstance(data.train, str) and Path(data.train).suffix in MANIFEST_SUFFIXES:
        data.train = read_manifest(Path(data.train))
    if isinstance(data.train, str):
        return
    if not data.train:
        raise ConfigError("config key 'data.train' must list at least one corpus")
    names = [c.name for c in data.train]
    for i, c in enumerate(data.train):
        key = f"config key 'data.train[{i}]"
        if not c.name or any(ch.isspace() or ch == "/" for ch in c.name):
            raise ConfigError(f"{key}.name' must be a speaker-id namespace without whitespace or '/', got {c.name!r}")
        if c.name in names[:i]:
            raise ConfigError(
                f"{key}.name': {c.name!r} is also the name of data.train[{names.index(c.name)}]; each corpus needs "
                "its own speaker-id namespace"
            )
        if not c.dir:
            raise ConfigError(f"{key}.dir' is required (a Kaldi data dir with wav.scp, utt2spk)")
        if data.shards and c.weight != 1.0:
            raise ConfigError(
                f"{key}.weight' ({c.weight:g}): tar shards (data.shards) stream every utterance once per epoch; "
                "sampling weights need the indexed lists (unset data.shards)"
            )


def train_corpora(data: DataSettings) -> List[Tuple[str, TrainCorpus]]:
    """(config key, corpus) of each corpus of `data.train` (resolved); one data dir is the corpus without a name."""
    if isinstance(data.train, str):
        return [("data.train", TrainCorpus(dir=data.train))]
    return [(f"data.train[{i}]", c) for i, c in enumerate(data.train)]


def joined_data_dir(data: DataSettings) -> Tuple[DataDir, List[DataDir]]:
    """The corpora of `data.train` as one DataDir with namespaced ids (what tar shards are written from), and
    each corpus's own DataDir (whose errors name its files)."""
    parts = [
        (c, load_data_dir(c.dir, need_speakers=(Path(c.dir) / "utt2spk").exists())) for _, c in train_corpora(data)
    ]
    bare = [d.root for _, d in parts if not d.utt2spk]
    if bare and len(bare) < len(parts):
        raise ListError(
            f"{bare[0] / 'utt2spk'}: file does not exist, and the other corpora have theirs: the corpora of one run "
            "(and of its shards) are all labelled or all unlabelled"
        )
    if len(parts) == 1 and not parts[0][0].name:
        return parts[0][1], [parts[0][1]]
    joined = DataDir(root=parts[0][1].root, utts=[], wav={}, wav_line={})
    for c, d in parts:
        ns = f"{c.name}/"
        joined.utts += [ns + u for u in d.utts]
        joined.wav.update({ns + u: p for u, p in d.wav.items()})
        joined.wav_line.update({ns + u: n for u, n in d.wav_line.items()})
        joined.utt2spk.update({ns + u: ns + s for u, s in d.utt2spk.items()})
        joined.num_samples.update({ns + u: n for u, n in d.num_samples.items()})
    if not all(d.num_samples for _, d in parts):
        joined.num_samples = {}
    return joined, [d for _, d in parts]


@dataclass(kw_only=True)
class Corpus:
    """One corpus of a training run: its lists, the namespace of its ids (`name/utt`, `name/spk`; "" for a run
    on one data dir given by its path, whose ids stay as they are) and its sampling weight."""

    name: str
    lists: CompactLists
    weight: float = 1.0

    @property
    def prefix(self) -> str:
        return f"{self.name}/" if self.name else ""


class TrainLists:
    """The training set of a run: its corpora one after the other, utterance i of the whole being utterance
    i - starts[c] of corpus c, speaker ids namespaced so that two corpora's `id00012` are two speakers.

    `speakers` are all corpora's namespaced speaker ids, sorted (as a DataDir's, and as the tar shards written from
    the same corpora list them); `labels` (N,) int32 index them (all UNLABELLED, -1, when the corpora are);
    `lengths` (N,) int64 or None; `paths[i]`, `utts[i]` (namespaced) decode one string; `blocks` = [(utterances,
    weight)] per corpus, for the sampler (speakerlab.dataio.loaders.batches)."""

    def __init__(self, corpora: List[Corpus]):
        self.corpora = corpora
        self.starts = np.concatenate([[0], np.cumsum([len(c.lists) for c in corpora])]).astype(np.int64)
        if len({c.lists.labelled for c in corpora}) > 1:
            raise ValueError("the corpora of a run are all labelled or all unlabelled (compact.without_labels)")
        names = np.concatenate([np.char.add(c.prefix.encode(), c.lists.speakers) for c in corpora])
        order = np.argsort(names, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        offsets = np.concatenate([[0], np.cumsum([len(c.lists.speakers) for c in corpora])])
        if self.labelled:
            self.labels = np.concatenate([rank[c.lists.labels + o] for c, o in zip(corpora, offsets)]).astype(np.int32)
        else:  # every label UNLABELLED, as each corpus's
            self.labels = np.concatenate([c.lists.labels for c in corpora]).astype(np.int32)
        self.speakers: List[str] = [s.decode("utf-8") for s in names[order].tolist()]
        known = all(c.lists.lengths is not None for c in corpora)
        self.lengths = np.concatenate([c.lists.lengths for c in corpora]) if known else None
        self.paths = JoinedView([c.lists.paths for c in corpora], self.starts)
        self.utts = JoinedView([c.lists.utts(c.prefix) for c in corpora], self.starts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def labelled(self) -> bool:
        return self.corpora[0].lists.labelled

    @property
    def blocks(self) -> List[Tuple[int, float]]:
        return [(len(c.lists), c.weight) for c in self.corpora]

    def describe(self) -> str:
        parts = [
            f"{c.name or c.lists.root}: {len(c.lists)} utterances, "
            + (f"{len(c.lists.speakers)} speakers" if c.lists.labelled else "unlabelled")
            + (f", weight {c.weight:g}" if c.weight != 1.0 else "")
            for c in self.corpora
        ]
        return "; ".join(parts)
