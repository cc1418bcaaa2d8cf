"""Sharded corpora: a data dir as WebDataset tar shards, written once, streamed by training.

    speakerlab-shards --data data/train --out data/train/shards [--shard-mb 256 | --per-shard N]
    speakerlab-shards --data conf/corpora.yaml --out data/mix/shards     # several corpora (a data.train manifest)

For data on network storage or past one disk: training then reads a few large files front to back
instead of a million small ones at random (`data.shards: data/train/shards`).

Layout (the `webdataset` package's): `shard-000000.tar` ... hold one sample per utterance, tar
members sharing a key: `<key>.<ext>`, the audio file's original bytes (no re-encoding), and
`<key>.json` (`utt`, `spk`, `num_samples`). The key is the utterance's running index in the
shards, `%09d` (webdataset splits keys at the first dot: utterance ids may hold dots and slashes).
Utterances are in a seeded shuffle of the data dir, so a shard holds many speakers. The index is
per written index the utterance, its label and length as arrays beside it (`utts.npy`, fixed-width
UTF-8 bytes; `labels.npy` int32; `num_samples.npy` int64: memory-mapped by training, no Python object
per utterance in any process), then `shards.json`, written last (a dir with it is complete): the
shard files and their sample counts, the speakers (data-dir order), the sample rate. Format 1 held
the per-utterance lists in shards.json; it is refused, with the command that rewrites it.

Training (`ShardStream`): an epoch is the concatenation of the shards' samples, the shard order a
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

import contextlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import IterableDataset

from speakerlab.commands import CommandParser, run_command
from speakerlab.config import DataSettings
from speakerlab.dataio.audio import audio_info, read_crop_int16
from speakerlab.dataio.loaders.batches import CropDataset, check_split, collate
from speakerlab.dataio.tables.columns import FixedView, JoinedView, as_keys
from speakerlab.dataio.tables.corpora import joined_data_dir, resolve_corpora
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.prepare import index_lengths
from speakerlab.outputs import check_folder_output, output_file, write_text

SHARDS_JSON = "shards.json"
FORMAT = 2
ARRAYS = ("utts", "labels", "num_samples")  # `<name>.npy` beside shards.json, (N,) each
# Distinct numpy seed sequences per use; the indexed path's are (seed, epoch) and (seed, epoch, 1).
TAG_SHARD_ORDER, TAG_CROP, TAG_BUFFER = 10, 11, 12


def _wds():
    """webdataset, imported on first use: only sharded corpora need it (requirements.txt lists it)."""
    try:
        import webdataset
        import webdataset.tariterators
    except ImportError:
        raise ImportError("sharded corpora need webdataset: pip install webdataset (see requirements.txt)") from None
    return webdataset


def _key_index(member: str) -> int:
    """`000000123.flac` -> 123; -1 for a name that is not `<digits>.<ext>`."""
    key = member.rsplit("/", 1)[-1].split(".", 1)[0]
    return int(key) if key.isdigit() else -1


def _fresh(index_path: Path, roots: List[Path], options: dict) -> bool:
    """shards.json exists, is newer than the lists it was written from, with the same options."""
    if not index_path.is_file():
        return False
    # Not utt2num_samples: the prepare stage rewrites it at every run, before this one in stage 2.
    newer = [r / n for r in roots for n in ("wav.scp", "utt2spk")]
    if any(p.stat().st_mtime_ns >= index_path.stat().st_mtime_ns for p in newer):
        return False
    try:
        index = json.loads(index_path.read_text())
    except ValueError:
        return False
    shards_there = all((index_path.parent / s.get("file", "")).is_file() for s in index.get("shards", []))
    arrays_there = all((index_path.parent / f"{n}.npy").is_file() for n in ARRAYS)
    return index.get("format") == FORMAT and index.get("options") == options and shards_there and arrays_there


def write_shards(
    data_dir,
    out,
    shard_mb: float = 256.0,
    per_shard: Optional[int] = None,
    seed: int = 0,
    sample_rate: int = 16000,
    log=print,
) -> Path:
    """Write `data_dir` as tar shards under `out` (see the module doc); returns `out/shards.json`. `data_dir` may
    be a YAML manifest of several corpora (speakerlab.dataio.tables.corpora): the shards then hold all of them, with
    namespaced ids, as a run with that manifest as data.train reads them.

    A shard is closed at `per_shard` samples when given, else before it would pass `shard_mb` MiB.
    Lengths come from `utt2num_samples` when the prepare stage wrote it, else from the headers. Skips
    the work when shards.json is newer than the lists and was written with the same options."""
    root, out = Path(data_dir), check_folder_output(out)
    limits = {"shard_mb": None, "per_shard": per_shard} if per_shard else {"shard_mb": shard_mb, "per_shard": None}
    options = {"seed": seed, "sample_rate": sample_rate, **limits}
    index_path = out / SHARDS_JSON
    settings = DataSettings(train=str(root))
    resolve_corpora(settings)
    data, parts = joined_data_dir(settings)
    if _fresh(index_path, [d.root for d in parts], options):
        log(f"shards: {index_path} is newer than the lists of {root}: nothing to do")
        return index_path
    for part in parts:
        part.check_audio_exists()
    if data.num_samples:  # one header against the index: a wrong --sample-rate shows here
        audio_info(data.wav[data.utts[0]], sample_rate)
        lengths = data.num_samples
    else:
        lengths = index_lengths(data, sample_rate)
    out.mkdir(parents=True, exist_ok=True)
    index_path.unlink(missing_ok=True)  # incomplete from here until it is written again, last
    for old in list(out.glob("shard-*.tar")) + list(out.glob(".shard-*.tar.tmp*")):
        old.unlink()
    order = [data.utts[i] for i in np.random.default_rng(seed).permutation(len(data.utts))]
    spk2idx, wds = data.spk2idx, _wds()
    shards: List[dict] = []
    writer, size, limit = None, 0, shard_mb * 2**20
    with contextlib.ExitStack() as shard_file:  # closing it renames the shard in: a shard-*.tar is always whole
        for i, utt in enumerate(order):
            audio = Path(data.wav[utt]).read_bytes()
            full = shards and (shards[-1]["count"] >= per_shard if per_shard else size + len(audio) > limit)
            if writer is None or full:
                if writer is not None:
                    writer.close()
                    shard_file.close()
                shards.append({"file": f"shard-{len(shards):06d}.tar", "count": 0})
                stream = shard_file.enter_context(output_file(out / shards[-1]["file"], "wb"))
                writer, size = wds.TarWriter(stream, encoder=False), 0
            ext = Path(data.wav[utt]).suffix.lower().lstrip(".")
            ext = ext if ext and ext != "json" and "." not in ext else "audio"
            meta = {"utt": utt, "spk": data.utt2spk[utt], "num_samples": lengths[utt]}
            size += writer.write({"__key__": f"{i:09d}", ext: audio, "json": json.dumps(meta).encode()}) + 1536
            shards[-1]["count"] += 1
        if writer is not None:
            writer.close()
    arrays = {
        "utts": as_keys(order),
        "labels": np.array([spk2idx[data.utt2spk[u]] for u in order], dtype=np.int32),
        "num_samples": np.array([lengths[u] for u in order], dtype=np.int64),
    }
    for name, values in arrays.items():  # before shards.json, which says they are complete
        with output_file(out / f"{name}.npy", "wb") as f:
            np.save(f, values)
    index = {
        "format": FORMAT,
        "data": str(root),
        "options": options,
        "sample_rate": sample_rate,
        "speakers": data.speakers,
        "total": len(order),
        "shards": shards,
    }
    write_text(index_path, json.dumps(index))
    log(f"shards: {len(order)} utterances of {root} in {len(shards)} shard(s) under {out}")
    return index_path


def load_index(shard_dir) -> dict:
    """The checked shards.json of `shard_dir`, with its arrays (ARRAYS) memory-mapped under their names; a missing
    or inconsistent one raises naming the file and key, and the command that rewrites it."""
    path = Path(shard_dir) / SHARDS_JSON
    if not path.is_file():
        raise ListError(f"{path}: no complete shards; run speakerlab-shards --data DIR --out {shard_dir}")
    try:
        index = json.loads(path.read_text())
    except ValueError as e:
        raise ListError(f"{path}: not JSON: {e}") from None
    rewrite = f"rewrite the shards: speakerlab-shards --data {index.get('data', 'DIR')} --out {shard_dir}"
    if index.get("format") != FORMAT:
        raise ListError(
            f"{path}: format {index.get('format')!r}, this version reads format {FORMAT} (the per-utterance lists "
            f"as arrays beside {SHARDS_JSON}); {rewrite}"
        )
    for key in ("sample_rate", "speakers", "total", "shards"):
        if key not in index:
            raise ListError(f"{path}: no key '{key}'; {rewrite}")
    for name in ARRAYS:
        try:
            index[name] = np.load(path.parent / f"{name}.npy", mmap_mode="r")
        except (OSError, ValueError) as e:
            raise ListError(f"{path.parent / name}.npy: unreadable ({e}); {rewrite}") from None
    n, counted = index["total"], sum(s["count"] for s in index["shards"])
    if not (counted == n == len(index["utts"]) == len(index["labels"]) == len(index["num_samples"])):
        raise ListError(f"{path}: key 'total' is {n}, the shards count {counted}, utts.npy holds {len(index['utts'])}")
    return index


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
            raise ValueError(f"{where}: {index['total']} utterances are fewer than one global batch ({global_batch})")
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
        wds = _wds()
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
                for m in wds.tariterators.tar_file_iterator(f, select_files=lambda n: _key_index(n) >= first):
                    if _key_index(m["fname"]) >= end:
                        return
                    m["__url__"] = str(path)
                    yield m

            got, stale = first, f"{path} is not the shard {SHARDS_JSON} lists; rewrite the shards"
            try:
                with open(path, "rb") as f:
                    for sample in wds.tariterators.group_by_keys(members(f)):
                        audio = [k for k in sample if not k.startswith("__") and k != "json"]
                        if _key_index(sample["__key__"]) != got or len(audio) != 1 or "json" not in sample:
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


def _written_from(index: dict, lists) -> bool:
    """The shards of `index` (load_index) hold exactly the utterances of `lists` with the same labels (compared as
    arrays). The writer's order, a seeded permutation of the lists, is tried first: one gather, no sort."""
    utts, labels = index["utts"], index["labels"]
    keys = as_keys(lists.utts)
    if len(keys) != len(utts):
        return False
    order = np.random.default_rng(index.get("options", {}).get("seed", 0)).permutation(len(keys))
    if (utts == keys[order]).all() and (labels == lists.labels[order]).all():
        return True
    have, want = np.argsort(utts, kind="stable"), np.argsort(keys, kind="stable")
    return bool((utts[have] == keys[want]).all() and (labels[have] == lists.labels[want]).all())


def load_shard_data(settings, lists, log) -> None:
    """Check `data.shards`' index against the lists of `data.train` (`lists`,
    speakerlab.dataio.tables.corpora.TrainLists; not its audio: the shards hold it): the same utterances of the
    same speakers, else the shards are stale.
    `settings`: the config's data section (speakerlab.config.DataSettings)."""
    index = load_index(settings.shards)
    spk = index["speakers"]
    if spk != lists.speakers or not _written_from(index, lists):
        raise ListError(
            f"{Path(settings.shards) / SHARDS_JSON} ({index['total']} utterances, {len(spk)} speakers) was not "
            f"written from the lists of config key 'data.train' ({len(lists)} utterances, {len(lists.speakers)} "
            f"speakers); rewrite them: speakerlab-shards --data DATA_DIR_OR_MANIFEST --out {settings.shards}"
        )
    log(f"training data {settings.shards}: {index['total']} utterances, {len(spk)} speakers in shards")


def pass_batch(batch):
    """The loader's collate_fn for a ShardStream, which collates itself (module level: picklable)."""
    return batch


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-shards", description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="Kaldi data dir with wav.scp, utt2spk; or a YAML manifest of corpora")
    ap.add_argument("--out", help="shard dir (default <data>/shards)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--shard-mb", type=float, default=256.0, help="close a shard before it passes this size")
    size.add_argument("--per-shard", type=int, help="utterances per shard instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of the utterance order in the shards")
    ap.add_argument("--sample-rate", type=int, default=16000, help="the rate every file must have")
    args = ap.parse_args(argv)
    if args.shard_mb <= 0 or (args.per_shard is not None and args.per_shard < 1):
        ap.error("--shard-mb must be > 0 and --per-shard >= 1")
    out = args.out or str(Path(args.data) / "shards")
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    return run_command(
        lambda: write_shards(args.data, out, args.shard_mb, args.per_shard, args.seed, args.sample_rate, log),
        (ListError, ValueError),  # ValueError: a ConfigError of the manifest too
    )


if __name__ == "__main__":
    sys.exit(main())
