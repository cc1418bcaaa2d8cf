"""Offline features: fbank of every utterance of a data dir, stored once as Kaldi feats.ark/feats.scp.

    speakerlab-feature-store --data data/train --data data/test [--config conf/voxceleb/campplus.yaml ...]

Writes `<data>/feats.ark`, `<data>/feats.scp` (Kaldi's own format, through kaldiio, so Kaldi and
other toolkits read them too) and `<data>/feats.json`, the fbank options they were computed with
(no dither, no mean normalisation: readers normalise as their config says). feats.json is written
last, so a data dir with it has a complete store. Readers: extraction (`speakerlab.inference.extract --feats`)
and training without augmentation (`data.feats: true`), which then crops frames instead of decoding
audio. A store whose options differ from the config's is an error naming the option. feats.json also
holds a digest of the wav.scp the store was computed from: a store of other lists (the data preparation
stage re-run on changed recordings) is rebuilt by the next run of this command, and readers refuse it,
saying to re-run it. The scp names the ark as this command was given it (relative paths from the folder it ran in,
as Kaldi's are); feats.json records that folder and the ark's size, so a reader in another folder reads this
store's ark and never another one of the same relative name (`FeatureStore._check_arks`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from speakerlab.commands import CommandParser
from speakerlab.dataio.audio import AudioError, read_audio
from speakerlab.dataio.tables.columns import as_keys, read_keyed
from speakerlab.dataio.tables.embeddings import import_kaldiio, write_kaldi_ark
from speakerlab.dataio.tables.lists import ListError, load_data_dir, read_wav_scp, rerun_features
from speakerlab.features.fbank import Fbank, num_frames
from speakerlab.frontends import FRONT_ENDS, FbankConfig, feature_spec
from speakerlab.outputs import write_text

FEATS_SCP, FEATS_ARK, FEATS_CONF = "feats.scp", "feats.ark", "feats.json"


def write_store(data_dir, fbank: Fbank, log=print) -> Path:
    """fbank `(T, F)` float32 of every utterance of `data_dir` -> its feats.ark / feats.scp / feats.json."""
    root = Path(data_dir)
    if fbank.config.dither != 0.0:
        raise ValueError("a feature store holds deterministic features: build it with dither 0")
    data = load_data_dir(root, need_speakers=False)
    data.check_audio_exists()
    if _up_to_date(root, fbank.config, len(data.utts)):  # a re-run of the stage costs nothing
        log(f"feature store {root / FEATS_SCP}: up to date ({len(data.utts)} utterances)")
        return root / FEATS_SCP
    (root / FEATS_CONF).unlink(missing_ok=True)  # the store is incomplete until this is written again
    frames = []

    def features():
        for utt in data.utts:
            where = f"{root / 'wav.scp'}:{data.wav_line[utt]}"
            try:
                wave = read_audio(data.wav[utt], fbank.config.sample_rate)
                feats = fbank(torch.from_numpy(wave).unsqueeze(0))[0].numpy()
            except AudioError as e:  # names the file
                raise ListError(f"{where}: {e}") from None
            except ValueError as e:  # the fbank's: a file shorter than one frame
                raise ListError(f"{where}: {data.wav[utt]}: {e}") from None
            frames.append(feats.shape[0])
            yield utt, feats

    with torch.no_grad():
        write_kaldi_ark(root / FEATS_ARK, root / FEATS_SCP, features())
    frames = sum(frames)
    meta = {
        "fbank": dataclasses.asdict(fbank.config),
        "utterances": len(data.utts),
        "frames": frames,
        "wav_scp_sha1": lists_digest(root),
        # Where the scp's relative ark paths start, and the ark's size: a reader in another folder finds the ark
        # from here, and never takes another store's ark of the same relative name (FeatureStore._check_arks).
        "written_from": os.getcwd(),
        "ark_bytes": (root / FEATS_ARK).stat().st_size,
    }
    write_text(root / FEATS_CONF, json.dumps(meta, indent=1))
    log(f"feature store {root / FEATS_SCP}: {len(data.utts)} utterances, {frames} frames")
    return root / FEATS_SCP


def lists_digest(root: Path) -> str:
    """SHA-1 of `root/wav.scp` as it is now: which utterances a store holds, and from which files."""
    return hashlib.sha1((root / "wav.scp").read_bytes()).hexdigest()


def _up_to_date(root: Path, config: FbankConfig, utterances: int) -> bool:
    """A complete store of `root` with these fbank options and utterance count, of the wav.scp there now and
    newer than it (a list rewritten since may name re-converted audio)."""
    conf = root / FEATS_CONF
    if not conf.is_file() or conf.stat().st_mtime < (root / "wav.scp").stat().st_mtime:
        return False
    meta = json.loads(conf.read_text())
    return (
        meta.get("fbank") == dataclasses.asdict(config)
        and meta.get("utterances") == utterances
        and meta.get("wav_scp_sha1") == lists_digest(root)
    )


def _holds(ark: Path, key: bytes, offset: int, size: Optional[int]) -> bool:
    """Whether `ark` is the store's: `size` bytes where the store recorded it, else `key ` just before `offset` (a
    Kaldi scp's offset points past it)."""
    if size is not None:
        return ark.stat().st_size == size
    start = offset - len(key) - 1
    if start < 0:
        return False
    with open(ark, "rb") as f:
        f.seek(start)
        return f.read(len(key) + 1) == key + b" "


class FeatureStore:
    """Read side of a store: `store[utt]` -> `(T, F)` float32, or by row: `store.load(store.rows(keys)[i])`.
    Holds only the scp entries, as a few arrays (speakerlab.dataio.tables.columns.KeyedColumn; picklable: loader
    workers open the ark per read)."""

    def __init__(self, data_dir, expect: Optional[FbankConfig] = None):
        root = self.root = Path(data_dir)
        conf = root / FEATS_CONF
        if not conf.is_file():
            raise ListError(f"{conf}: no complete feature store; run speakerlab-feature-store --data {root}")
        meta = json.loads(conf.read_text())
        self.config = meta["fbank"]
        self.entries = read_keyed(root / FEATS_SCP)
        self.base = ""  # the folder relative ark paths start from ("": this process's)
        self._check_arks(meta)
        stored = meta.get("wav_scp_sha1")
        if stored is not None and stored != lists_digest(root):
            listed = read_keyed(root / "wav.scp", lambda p: {u: v for u, (_, v) in read_wav_scp(p).items()}).keys
            new = int((self.entries.rows(listed) < 0).sum())
            gone = len(self.entries) - (len(listed) - new)  # ids are unique in both lists
            what = f"{new} utterance(s) of wav.scp not in it, {gone} no longer listed" if new or gone else "other files"
            raise ListError(
                f"{root / FEATS_SCP}: the feature store was computed from another wav.scp ({what}: the data "
                f"preparation stage ran again since); {rerun_features('speakerlab-feature-store', root)}"
            )
        if expect is not None:
            want = dataclasses.asdict(expect)
            for key in sorted(set(want) | set(self.config)):
                if want.get(key) != self.config.get(key) and key != "dither":
                    raise ValueError(
                        f"{conf}: features computed with {key}={self.config.get(key)!r}, the config "
                        f"asks for {key}={want.get(key)!r}; rebuild the store or change features.{key}"
                    )

    def _check_arks(self, meta: dict) -> None:
        """Find the ark of the first and last entries: a store's paths are as speakerlab-feature-store was given them
        (relative ones from the folder it ran in, as Kaldi's are). A relative ark is taken from the folder this runs
        in, else from the one the store was written from (feats.json's `written_from`), and only where it has the
        size the store wrote (`ark_bytes`; a store written before these two, where the entry's utterance id is
        just before its offset, as `key ` is in an ark): every recipe's store is data/<set>/feats.ark, and another
        recipe's folder holds an ark of that name whose bytes would be read as these features. Found nowhere, the
        store says so when opened, not a loader worker mid-run. Two rows, not all: a store writes one ark, and a
        start-up at millions of utterances checks in constant time."""
        size, origin = meta.get("ark_bytes"), meta.get("written_from")
        last = len(self.entries) - 1
        for row in sorted({0, last}) if last >= 0 else ():
            ark, offset = self.entries.values[row].rsplit(":", 1)
            key = self.entries.keys[row]
            places = [Path(ark)] if os.path.isabs(ark) or origin is None else [Path(ark), Path(origin) / ark]
            fits = [p for p in places if p.is_file() and _holds(p, key, int(offset), size)]
            if fits:
                self.base = "" if fits[0] == places[0] else origin
                continue
            seen = [f"{p} holds another store's features" for p in places if p.is_file()]
            raise ListError(
                f"{self.root / FEATS_SCP}: '{key.decode('utf-8')}' is in {ark}: "
                + ("; ".join(seen) if seen else f"no such file from {Path.cwd()}" + (f" or {origin}" if origin else ""))
                + " (relative paths are from the folder speakerlab-feature-store ran in: run from there, or "
                f"{rerun_features('speakerlab-feature-store', self.root)})"
            )

    def __len__(self) -> int:
        return len(self.entries)

    def root_of(self, utt: str) -> Path:
        """The data dir whose store `utt` belongs in (as JoinedStore.root_of): this one's."""
        return self.root

    def __contains__(self, utt: str) -> bool:
        return utt in self.entries

    def __getitem__(self, utt: str) -> np.ndarray:
        row = self.entries.find(utt)
        if row < 0:
            raise ListError(f"'{utt}' is not in the feature store ({len(self.entries)} utterances)")
        return self.load(row)

    def rows(self, keys: np.ndarray) -> np.ndarray:
        """The row of each utterance id of `keys` (an `S` array (N,)), -1 for one not in the store: int64 (N,)."""
        return self.entries.rows(keys)

    def load(self, row: int) -> np.ndarray:
        """The features `(T, F)` float32 of row `row` (of `rows`)."""
        entry = self.entries.values[row]
        if self.base:  # an absolute entry stays as it is: os.path.join keeps its last absolute part
            entry = os.path.join(self.base, entry)
        return np.asarray(import_kaldiio().load_mat(entry), dtype=np.float32)


class FeatureCropDataset(Dataset):
    """Training without augmentation from a store: `(utterance index, crop seed)` -> `{"feats" (n, F)
    float32, "finite", "label", "index"}`, n = the frames of `crop_samples`. The crop offset is drawn
    from `np.random.default_rng(crop seed)` as audio crops are; a shorter utterance is repeated from
    a random phase, as `speakerlab.dataio.audio.read_crop` repeats short audio."""

    def __init__(
        self,
        store: FeatureStore,
        utts: Sequence[str],
        paths: Sequence[str],
        labels: Sequence[int],
        crop_samples: int,
        fbank: FbankConfig,
    ):
        # Kept as given (arrays, compact views: see speakerlab.dataio.loaders.batches.CropDataset).
        self.store, self.utts, self.paths, self.labels = store, utts, paths, labels
        self.crop_samples, self.frames = crop_samples, num_frames(crop_samples, fbank)
        # Each utterance's row in the store, found once for all (vectorised): an item reads by row, no search.
        rows = store.rows(as_keys(utts))
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            raise ListError(
                f"{len(missing)} training utterance(s) not in the feature store, e.g. '{utts[int(missing[0])]}'; "
                f"{rerun_features('speakerlab-feature-store', store.root_of(utts[int(missing[0])]))}"
            )
        self.rows = rows.astype(np.int32 if len(store) < 2**31 else np.int64)

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, item) -> Dict[str, object]:
        index, crop_seed = item
        rng = np.random.default_rng(crop_seed)
        feats, n = self.store.load(int(self.rows[index])), self.frames
        total = feats.shape[0]
        if total >= n:
            start = int(rng.integers(0, total - n + 1))
            crop = feats[start : start + n]
        else:
            start = int(rng.integers(0, total))
            crop = np.tile(feats, (-(-(start + n) // total), 1))[start : start + n]
        return {
            "feats": np.ascontiguousarray(crop),
            "finite": bool(np.isfinite(crop).all()),
            "label": int(self.labels[index]),
            "index": index,
        }


def collate_feats(items) -> Dict[str, torch.Tensor]:
    """Items of `FeatureCropDataset` -> feats (B, n, F) float32, finite (B,) bool, label / index (B,) int64."""
    return {
        "feats": torch.from_numpy(np.stack([it["feats"] for it in items])),
        "finite": torch.tensor([it["finite"] for it in items]),
        "label": torch.tensor([it["label"] for it in items], dtype=torch.int64),
        "index": torch.tensor([it["index"] for it in items], dtype=torch.int64),
    }


def main(argv=None) -> int:
    from speakerlab.config import ConfigError, load_config

    ap = CommandParser(prog="speakerlab-feature-store", description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, action="append", help="Kaldi data dir with wav.scp (repeatable)")
    ap.add_argument("--config", action="append", help="experiment config(s) whose features section to use")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. features.num_mel_bins=64")
    args = ap.parse_args(argv)
    try:
        raw = None if args.config else {"model": {"name": "campplus"}, "data": {"train": args.data[0]}}
        cfg = load_config(args.config, args.overrides, raw=raw)
        spec = feature_spec(cfg.features, cfg.data.sample_rate)
        if not FRONT_ENDS[spec.kind].storable:  # the others are computed from the audio every time
            print(f"feature store: nothing to store for features.kind {spec.kind}", file=sys.stderr)
            return 0
        fbank = Fbank(spec.fbank)
        for data_dir in args.data:
            write_store(data_dir, fbank)
    except (ListError, ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
