"""Sharded corpora: a data dir as WebDataset tar shards, written once, streamed by training.

    speakerlab-shards --data data/train --out data/train/shards [--shard-mb 256 | --per-shard N]
    speakerlab-shards --data conf/corpora.yaml --out data/mix/shards     # several corpora (a data.train manifest)

For data on network storage or past one disk: training then reads a few large files front to back
instead of a million small ones at random (`data.shards: data/train/shards`).

Layout (the `webdataset` package's): `shard-000000.tar` ... hold one sample per utterance, tar
members sharing a key: `<key>.<ext>`, the audio file's original bytes (no re-encoding), and
`<key>.json` (`utt`, `spk`: null for a data dir without utt2spk, `num_samples`). The key is the
utterance's running index in the shards, `%09d` (webdataset splits keys at the first dot: utterance
ids may hold dots and slashes). Utterances are in a seeded shuffle of the data dir, so a shard holds
many speakers. The index is per written index the utterance, its label and length as arrays beside it
(`utts.npy`, fixed-width UTF-8 bytes; `labels.npy` int32, -1 throughout for unlabelled data;
`num_samples.npy` int64: memory-mapped by training, no Python object per utterance in any process),
then `shards.json`, written last (a dir with it is complete): the shard files and their sample
counts, the speakers (data-dir order; none when unlabelled), the sample rate. A self-supervised run
(data.labels false) streams labelled and unlabelled shards alike, their labels unread. Format 1 held
the per-utterance lists in shards.json; it is refused, with the command that rewrites it.

Training streams them: speakerlab.dataio.loaders.shard_stream (ShardStream: epochs, ranks, workers, resume).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np

from speakerlab.commands import CommandParser, run_command
from speakerlab.config import DataSettings
from speakerlab.dataio.audio import audio_info
from speakerlab.dataio.tables.columns import as_keys
from speakerlab.dataio.tables.compact import UNLABELLED
from speakerlab.dataio.tables.corpora import joined_data_dir, resolve_corpora
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.prepare import index_lengths
from speakerlab.outputs import check_folder_output, output_file, write_text

SHARDS_JSON = "shards.json"
FORMAT = 2
ARRAYS = ("utts", "labels", "num_samples")  # `<name>.npy` beside shards.json, (N,) each


def import_webdataset():
    """webdataset, imported on first use: only sharded corpora need it (requirements.txt lists it)."""
    try:
        import webdataset
        import webdataset.tariterators
    except ImportError:
        raise ImportError("sharded corpora need webdataset: pip install webdataset (see requirements.txt)") from None
    return webdataset


def key_index(member: str) -> int:
    """`000000123.flac` -> 123; -1 for a name that is not `<digits>.<ext>`."""
    key = member.rsplit("/", 1)[-1].split(".", 1)[0]
    return int(key) if key.isdigit() else -1


def _fresh(index_path: Path, data: Path, roots: List[Path], options: dict) -> bool:
    """shards.json exists, was written from `data` (a data dir, or a manifest of the corpora `roots`) with the same
    options, and is newer than the lists (and the manifest)."""
    if not index_path.is_file():
        return False
    # Not utt2num_samples: the prepare stage rewrites it at every run, before this one in stage 2.
    newer = [r / n for r in roots for n in ("wav.scp", "utt2spk") if (r / n).exists()]  # no utt2spk: unlabelled
    newer += [data] if data.is_file() else []  # a manifest's names and weights are in the shards' ids
    if any(p.stat().st_mtime_ns >= index_path.stat().st_mtime_ns for p in newer):
        return False
    try:
        index = json.loads(index_path.read_text())
    except ValueError:
        return False
    shards_there = all((index_path.parent / s.get("file", "")).is_file() for s in index.get("shards", []))
    arrays_there = all((index_path.parent / f"{n}.npy").is_file() for n in ARRAYS)
    same = index.get("format") == FORMAT and index.get("data") == str(data) and index.get("options") == options
    return same and shards_there and arrays_there


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
    the work when shards.json was written from the same `data_dir` with the same options, and is newer than the
    lists (and the manifest)."""
    root, out = Path(data_dir), check_folder_output(out)
    limits = {"shard_mb": None, "per_shard": per_shard} if per_shard else {"shard_mb": shard_mb, "per_shard": None}
    options = {"seed": seed, "sample_rate": sample_rate, **limits}
    index_path = out / SHARDS_JSON
    settings = DataSettings(train=str(root))
    resolve_corpora(settings)
    data, parts = joined_data_dir(settings)
    if _fresh(index_path, root, [d.root for d in parts], options):
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
    spk2idx, wds = data.spk2idx, import_webdataset()
    labels = [spk2idx[data.utt2spk[u]] for u in order] if data.utt2spk else [UNLABELLED] * len(order)
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
            meta = {"utt": utt, "spk": data.utt2spk.get(utt), "num_samples": lengths[utt]}  # spk null: unlabelled
            size += writer.write({"__key__": f"{i:09d}", ext: audio, "json": json.dumps(meta).encode()}) + 1536
            shards[-1]["count"] += 1
        if writer is not None:
            writer.close()
    arrays = {
        "utts": as_keys(order),
        "labels": np.array(labels, dtype=np.int32),
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


def _written_from(index: dict, lists) -> bool:
    """The shards of `index` (load_index) hold exactly the utterances of `lists`, with the same labels where `lists`
    are labelled (compared as arrays). The writer's order, a seeded permutation of the lists, is tried first: one
    gather, no sort."""
    utts, labels = index["utts"], index["labels"]
    keys = as_keys(lists.utts)
    if len(keys) != len(utts):
        return False

    def same(have: np.ndarray, want: np.ndarray) -> bool:
        return bool(
            (utts[have] == keys[want]).all() and (not lists.labelled or (labels[have] == lists.labels[want]).all())
        )

    order = np.random.default_rng(index.get("options", {}).get("seed", 0)).permutation(len(keys))
    return same(slice(None), order) or same(np.argsort(utts, kind="stable"), np.argsort(keys, kind="stable"))


def load_shard_data(settings, lists, log) -> None:
    """Check `data.shards`' index against the lists of `data.train` (`lists`,
    speakerlab.dataio.tables.corpora.TrainLists; not its audio: the shards hold it): the same utterances of the
    same speakers, else the shards are stale.
    `settings`: the config's data section (speakerlab.config.DataSettings)."""
    index = load_index(settings.shards)
    spk = index["speakers"]
    if (lists.labelled and spk != lists.speakers) or not _written_from(index, lists):
        raise ListError(
            f"{Path(settings.shards) / SHARDS_JSON} ({index['total']} utterances, {len(spk)} speakers) was not "
            f"written from the lists of config key 'data.train' ({len(lists)} utterances, {len(lists.speakers)} "
            f"speakers); rewrite them: speakerlab-shards --data DATA_DIR_OR_MANIFEST --out {settings.shards}"
        )
    held = f"{len(spk)} speakers" if lists.labelled else "their labels unread" if spk else "unlabelled"
    log(f"training data {settings.shards}: {index['total']} utterances, {held} in shards")


def main(argv=None) -> int:
    ap = CommandParser(prog="speakerlab-shards", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data",
        required=True,
        help="Kaldi data dir (wav.scp; utt2spk unless unlabelled); or a YAML manifest of corpora",
    )
    ap.add_argument("--out", help="shard dir (default <data>/shards)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--shard-mb", type=float, default=256.0, help="close a shard before it passes this size")
    size.add_argument("--per-shard", type=int, help="utterances per shard instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of the utterance order in the shards")
    ap.add_argument("--sample-rate", type=int, default=16000, help="the rate every file must have")
    args = ap.parse_args(argv)
    if args.shard_mb <= 0 or (args.per_shard is not None and args.per_shard < 1):
        ap.error("--shard-mb must be > 0 and --per-shard >= 1")
    if args.out is None and Path(args.data).is_file():  # a manifest: no folder to put <data>/shards in
        ap.error(f"--data {args.data} is a manifest of corpora: give --out, the shard dir to write")
    out = args.out or str(Path(args.data) / "shards")
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    return run_command(
        lambda: write_shards(args.data, out, args.shard_mb, args.per_shard, args.seed, args.sample_rate, log),
        (ListError, ValueError),  # ValueError: a ConfigError of the manifest too
    )


if __name__ == "__main__":
    sys.exit(main())
