"""Sharded corpora (speakerlab.dataio.loaders.shards): the writer's WebDataset layout, the stream's epoch split across
ranks and loader workers, determinism and resume, items equal to CropDataset's, bad settings, torchrun, the index
as memory-mapped arrays (format 2)."""

import io
import json
import os
import subprocess
import sys
import tarfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
import yaml

from speakerlab.config import ConfigError, DataSettings, load_config
from speakerlab.dataio.audio import AudioError
from speakerlab.dataio.loaders.batches import CropDataset
from speakerlab.dataio.loaders.shard_stream import ShardStream
from speakerlab.dataio.loaders.shards import ARRAYS, load_index, load_shard_data, main, write_shards
from speakerlab.dataio.tables.compact import read_compact
from speakerlab.dataio.tables.corpora import Corpus, TrainLists
from speakerlab.dataio.tables.lists import ListError
from speakerlab.dataio.tables.prepare import prepare
from speakerlab.train.loop import main as train_main
from tests.helpers import assert_no_traceback, free_port, losses, make_data_dir, tiny_config, write_wav

ROOT = Path(__file__).resolve().parent.parent


def corpus(tmp_path, speakers=4, per_speaker=6, seconds=0.3):
    """A data dir whose utterance ids hold dots (webdataset would split keys there), and its shards."""
    utts = {f"spk.{s}-utt.{u}": f"spk.{s}" for s in range(speakers) for u in range(per_speaker)}
    data = make_data_dir(tmp_path / "train", utts, seconds=seconds)
    write_shards(data, tmp_path / "shards", per_shard=5, log=lambda m: None)
    return data, tmp_path / "shards"


def written(shards):
    """The index of `shards` with its arrays as lists (ids decoded)."""
    index = load_index(shards)
    arrays = {"utts": [u.decode() for u in index["utts"].tolist()], "labels": index["labels"].tolist()}
    return {**index, **arrays, "num_samples": index["num_samples"].tolist()}


def loader_batches(stream, workers):
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers, collate_fn=lambda b: b)
    return list(loader)


def epoch(shards, epoch_no=0, start=0, workers=0, rank=0, world=1, mb=2, accum=2, **kw):
    stream = ShardStream(shards, mb * accum * world, mb, accum, rank, world, seed=3, crop_samples=3000, **kw)
    stream.set_epoch(epoch_no, start)
    return stream, loader_batches(stream, workers)


def test_writer_layout_is_webdatasets(tmp_path):
    data, shards = corpus(tmp_path)
    index = written(shards)
    files = sorted(p.name for p in shards.glob("shard-*.tar"))
    assert files == [f"shard-{i:06d}.tar" for i in range(5)] == [s["file"] for s in index["shards"]]
    assert [s["count"] for s in index["shards"]] == [5, 5, 5, 5, 4] and index["total"] == 24
    assert index["speakers"] == [f"spk.{s}" for s in range(4)] and index["sample_rate"] == 16000
    samples = list(wds.WebDataset([str(shards / f) for f in files], shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(24)]  # keys: no dots, no slashes
    with tarfile.open(shards / files[0]) as tar:
        assert tar.getnames()[:2] == ["000000000.json", "000000000.wav"]
    seen = []
    for i, s in enumerate(samples):
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {"wav", "json"}
        meta = json.loads(s["json"])
        assert meta == {"utt": index["utts"][i], "spk": meta["utt"].split("-")[0], "num_samples": 4800}
        assert s["wav"] == (data / "wav" / f"{meta['utt']}.wav").read_bytes()  # the original bytes
        assert index["speakers"][index["labels"][i]] == meta["spk"]
        seen.append(meta["utt"])
    assert sorted(seen) == sorted((data / "utt2spk").read_text().split()[::2]) and seen != sorted(seen)
    assert len({json.loads(s["json"])["spk"] for s in samples[:5]}) > 1  # a shard mixes speakers


def test_writer_size_limit_rerun_and_cli(tmp_path, capsys):
    data, _ = corpus(tmp_path)
    out = tmp_path / "by_size"
    assert main(["--data", str(data), "--out", str(out), "--shard-mb", "0.03"]) == 0
    index = json.loads((out / "shards.json").read_text())
    assert len(index["shards"]) > 2 and index["total"] == 24
    assert all((out / s["file"]).stat().st_size < 0.03 * 2**20 + 12000 for s in index["shards"])
    stamp = (out / "shards.json").stat().st_mtime_ns
    assert main(["--data", str(data), "--out", str(out), "--shard-mb", "0.03"]) == 0
    assert "nothing to do" in capsys.readouterr().err and (out / "shards.json").stat().st_mtime_ns == stamp
    assert main(["--data", str(data), "--out", str(out), "--per-shard", "100"]) == 0  # other options: rewritten
    names = ["labels.npy", "num_samples.npy", "shard-000000.tar", "shards.json", "utts.npy"]
    assert [p.name for p in sorted(out.iterdir())] == names
    prepare(data)  # writes utt2num_samples anew
    assert main(["--data", str(data), "--out", str(out), "--per-shard", "100"]) == 0  # as stage 2 after prepare
    assert "nothing to do" in capsys.readouterr().err
    os.utime(data / "wav.scp")  # newer lists: rewritten
    assert main(["--data", str(data), "--out", str(out), "--per-shard", "100"]) == 0
    assert (out / "shards.json").stat().st_mtime_ns > stamp
    # Another data dir, or a manifest edited since, into the same --out: once 'nothing to do' when its lists were
    # older than shards.json, and training then said to run this very command again
    other = make_data_dir(tmp_path / "other", {"x-1": "x", "y-1": "y"}, seconds=0.3)
    os.utime(other / "wav.scp", ns=(0, 0))
    os.utime(other / "utt2spk", ns=(0, 0))
    assert main(["--data", str(other), "--out", str(out), "--per-shard", "100"]) == 0
    assert sorted(written(out)["utts"]) == ["x-1", "y-1"]
    manifest = tmp_path / "corpora.yaml"
    manifest.write_text(yaml.safe_dump([{"name": "a", "dir": str(other)}]))
    assert main(["--data", str(manifest), "--out", str(out), "--per-shard", "100"]) == 0
    manifest.write_text(yaml.safe_dump([{"name": "b", "dir": str(other)}]))
    assert main(["--data", str(manifest), "--out", str(out), "--per-shard", "100"]) == 0
    assert sorted(written(out)["utts"]) == ["b/x-1", "b/y-1"]
    (data / "wav" / "spk.0-utt.0.wav").unlink()
    assert main(["--data", str(data), "--out", str(out)]) == 2
    assert f"{data / 'wav.scp'}:1:" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("per_speaker", [6, 7])  # 24 utterances: 3 global batches of 8; 28: 4 left over
def test_every_rank_same_steps_each_utterance_at_most_once(tmp_path, workers, per_speaker):
    _, shards = corpus(tmp_path, per_speaker=per_speaker)
    seen = []
    for rank in range(2):
        stream, batches = epoch(shards, 1, workers=workers, rank=rank, world=2)
        assert stream.steps_per_epoch == 3 and len(stream) == len(batches) == 3 * 2  # steps x accumulation
        for b in batches:
            assert b["wave"].shape == (2, 3000) and b["wave"].dtype == torch.int16 and b["finite"].all()
            seen += b["index"].tolist()
    assert len(seen) == len(set(seen)) == 24
    if per_speaker == 6:
        assert sorted(seen) == list(range(24))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_deterministic_epochs_differ_and_resume_continues(tmp_path):
    _, shards = corpus(tmp_path, per_speaker=9)  # 36 utterances, global 4: 9 steps

    def indices(batches):
        return [b["index"].tolist() for b in batches]

    for workers, accum in [(0, 2), (2, 1), (2, 2), (3, 1)]:
        _, full = epoch(shards, 2, workers=workers, accum=accum)
        _, again = epoch(shards, 2, workers=workers, accum=accum)
        assert indices(full) == indices(again)
        assert all(torch.equal(a["wave"], b["wave"]) for a, b in zip(full, again))
        for start in (1, 3):  # resumed at step `start`: the tail of the uninterrupted epoch
            stream, tail = epoch(shards, 2, start=start, workers=workers, accum=accum)
            assert len(stream) == len(tail) and indices(tail) == indices(full)[start * accum :], (workers, accum)
            assert all(torch.equal(a["wave"], b["wave"]) for a, b in zip(tail, full[start * accum :]))
    _, other = epoch(shards, 3)
    assert indices(other) != indices(epoch(shards, 2)[1])
    assert sorted(sum(indices(other), [])) == sorted(sum(indices(epoch(shards, 2)[1]), []))  # 36 % 4 == 0


def test_items_equal_crop_datasets(tmp_path):
    """The stream's crops (and speed draws) are CropDataset's from the original files for the same seed,
    for wav and flac, long and shorter-than-the-crop utterances."""
    rng = np.random.default_rng(0)
    root = tmp_path / "train"
    scp, u2s = [], []
    for i in range(8):
        ext, n = ("flac" if i % 2 else "wav"), (2000 if i % 3 == 0 else 9000 + 100 * i)
        path = write_wav(root / f"u{i}.{ext}", rng.integers(-3000, 3000, n).astype(np.int16) / 32768.0)
        scp.append(f"u.{i} {path}\n")
        u2s.append(f"u.{i} s{i % 2}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    write_shards(root, tmp_path / "shards", per_shard=3, log=lambda m: None)
    index = written(tmp_path / "shards")
    paths = {line.split()[0]: line.split()[1] for line in scp}
    kw = {"speed_factors": [0.9, 1.0, 1.1], "speed_prob": 0.5}
    stream, batches = epoch(tmp_path / "shards", 4, workers=2, mb=2, accum=1, **kw)
    reference = CropDataset([paths[u] for u in index["utts"]], index["labels"], index["num_samples"], 3000, **kw)
    speeds = set()
    for b in batches:
        for row, i in enumerate(b["index"].tolist()):
            want = reference[(i, stream.crop_seed(i))]
            assert np.array_equal(b["wave"][row].numpy(), want["wave"]), index["utts"][i]
            assert b["label"][row] == want["label"] and b["speed"][row] == want["speed"]
            speeds.add(want["speed"])
    assert len(speeds) > 1 and stream.paths[0] == f"{tmp_path / 'shards' / 'shard-000000.tar'}:{index['utts'][0]}"


def test_bad_settings_and_stale_or_broken_shards(tmp_path, capsys):
    cfg, train = tiny_config(tmp_path, val=False)
    with pytest.raises(ConfigError, match="config key 'data.shards'"):
        load_config(cfg, ["data.shards=x", "data.feats=true"])
    with pytest.raises(ConfigError, match="data.shuffle_buffer"):
        load_config(cfg, ["data.shuffle_buffer=0"])
    exp, shards = str(tmp_path / "e"), tmp_path / "shards"
    assert train_main(["--config", str(cfg), "--exp-dir", exp, f"data.shards={shards}"]) == 2
    assert f"{shards / 'shards.json'}: no complete shards" in capsys.readouterr().err
    write_shards(train, shards, per_shard=6, log=lambda m: None)
    lines = (train / "utt2spk").read_text().splitlines()
    (train / "utt2spk").write_text("\n".join(lines[:-1] + [lines[-1].split()[0] + " s0"]) + "\n")
    assert train_main(["--config", str(cfg), "--exp-dir", exp, f"data.shards={shards}"]) == 2
    err = capsys.readouterr().err
    assert "was not written from the lists of config key 'data.train'" in err and "speakerlab-shards --data" in err
    # A shard cut short is named when it is read (not a silent short epoch: the other ranks would hang).
    tar = shards / "shard-000001.tar"
    tar.write_bytes(tar.read_bytes()[:5000])
    stream = ShardStream(shards, 16, 16, 1, crop_samples=3000)
    with pytest.raises(ListError, match=f"{tar}: unreadable at sample 6: unexpected end of data"):
        list(stream)
    write_shards(train, shards, per_shard=6, log=lambda m: None)  # lists changed: rewritten whole
    whole, tar = list(stream), shards / "shard-000002.tar"  # a shard that ends early but cleanly
    with tarfile.open(tar) as src:
        members = [(m, src.extractfile(m).read()) for m in src.getmembers()][:4]
    with tarfile.open(tar, "w") as dst:
        for m, data in members:
            dst.addfile(m, io.BytesIO(data))
    with pytest.raises(ListError, match=f"{tar}: no sample 14, shards.json lists up to 15: a truncated shard"):
        list(stream)
    assert len(whole) == 1


TORCHRUN_STREAM = """
import json, sys
import torch, torch.distributed as dist
from speakerlab.dataio.loaders.shard_stream import ShardStream
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = {}
for epoch in range(2):
    stream = ShardStream(sys.argv[1], 8, 2, 2, rank, world, seed=7, shuffle_buffer=5, crop_samples=1600)
    stream.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2, collate_fn=lambda b: b)
    batches = [b["index"].tolist() for b in loader]
    gathered = [None] * world
    dist.all_gather_object(gathered, {"steps": len(batches) // 2, "indices": sum(batches, [])})
    out[epoch] = gathered
if rank == 0:
    json.dump(out, open(sys.argv[2], "w"))
dist.destroy_process_group()
"""


def torchrun(tmp_path, port, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", *args]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_traceback(r.stdout, r.stderr)


@pytest.mark.slow
def test_torchrun_ranks_split_every_epoch(tmp_path):
    """Two processes over the shards, two loader workers each: both ranks run the same steps, and the
    epoch's utterances are seen exactly once between them, in every epoch."""
    _, shards = corpus(tmp_path, per_speaker=8)  # 32 utterances: 4 steps of 8
    script = tmp_path / "stream.py"
    script.write_text(TORCHRUN_STREAM)
    torchrun(tmp_path, free_port(), str(script), str(shards), str(tmp_path / "seen.json"))
    seen = json.loads((tmp_path / "seen.json").read_text())
    for ranks in seen.values():
        assert [r["steps"] for r in ranks] == [4, 4]
        assert sorted(ranks[0]["indices"] + ranks[1]["indices"]) == list(range(32))
    assert seen["0"][0]["indices"] != seen["1"][0]["indices"]


@pytest.mark.slow
def test_torchrun_training_on_shards(tmp_path):
    """Real DDP training from shards, a loader worker per rank: both epochs end (no rank waits on another
    at the epoch end) after the steps of training from the data dir; stopped mid-epoch and run again
    (same world size and workers), it gives the uninterrupted run's losses."""
    cfg, train = tiny_config(tmp_path, val=False)
    write_shards(train, train / "shards", per_shard=5, log=lambda m: None)
    args = ["-m", "speakerlab.train", "--config", str(cfg), f"data.shards={train / 'shards'}", "hardware.num_workers=1"]
    exp, exp2 = tmp_path / "ddp", tmp_path / "ddp2"
    torchrun(tmp_path, free_port(), *args, "--exp-dir", str(exp))
    log = (exp / "train.log").read_text()
    assert "global 8 = 2 device(s) x 4 x accum 1" in log and "training done: 2 epochs, 4 steps" in log
    assert sorted(losses(exp)) == [1, 2, 3, 4]
    torchrun(tmp_path, free_port(), *args, "--exp-dir", str(exp2), "--max-steps", "1")
    torchrun(tmp_path, free_port(), *args, "--exp-dir", str(exp2))
    assert "resumed from" in (exp2 / "train.log").read_text()
    a, b = losses(exp), losses(exp2)
    assert sorted(b) == [1, 2, 3, 4] and all(b[k] == pytest.approx(a[k], rel=1e-5, abs=1e-6) for k in a)


def test_a_sample_that_does_not_decode_is_named_and_skipped_or_stops(tmp_path):
    """data.on_bad_audio holds for shards too: the item of a sample whose bytes do not decode names
    `<shard>:<utt>` in `bad` (skip), or its AudioError does (stop)."""
    data = make_data_dir(tmp_path / "train", {f"s{s}-{u}": f"s{s}" for s in range(2) for u in range(4)}, seconds=0.3)
    (data / "wav" / "s1-3.wav").write_bytes(b"RIFF, but not a wav file at all" * 40)
    (data / "utt2num_samples").write_text("".join(f"s{s}-{u} 4800\n" for s in range(2) for u in range(4)))
    write_shards(data, tmp_path / "shards", per_shard=3, log=lambda m: None)
    _, batches = epoch(tmp_path / "shards", mb=4, accum=2, skip_bad=True)
    bad = [why for b in batches for why in b["bad"] if why]
    assert len(bad) == 1 and bad[0].startswith(f"{tmp_path / 'shards'}/shard-") and ".tar:s1-3: " in bad[0]
    with pytest.raises(AudioError, match=r"shard-\d+\.tar:s1-3: cannot read audio"):
        epoch(tmp_path / "shards", mb=4, accum=2)


def test_a_format_1_index_is_refused_in_one_line_and_rewritten(tmp_path, capsys):
    """shards.json of format 1 (the per-utterance lists inside it, no arrays beside it) stops training with one
    line giving the command that rewrites it; that command does (newer than the lists and with the same options,
    it is still not 'nothing to do')."""
    cfg, train = tiny_config(tmp_path, val=False)
    shards = tmp_path / "shards"
    write_shards(train, shards, per_shard=6, log=lambda m: None)
    now = written(shards)
    for name in ARRAYS:
        (shards / f"{name}.npy").unlink()
    (shards / "shards.json").write_text(json.dumps({**now, "format": 1}))
    exp = str(tmp_path / "e")
    assert train_main(["--config", str(cfg), "--exp-dir", exp, f"data.shards={shards}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {shards / 'shards.json'}: format 1, this version reads format 2 (the per-utterance lists as arrays "
        f"beside shards.json); rewrite the shards: speakerlab-shards --data {train} --out {shards}"
    )
    assert main(["--data", str(train), "--out", str(shards), "--per-shard", "6"]) == 0
    assert "nothing to do" not in capsys.readouterr().err
    assert written(shards) == {**now, "format": 2}
    assert train_main(["--config", str(cfg), "--exp-dir", exp, f"data.shards={shards}", "train.epochs=1"]) == 0


def test_a_stream_over_200k_utterances_holds_no_object_per_utterance(tmp_path):
    """The index of 200k utterances is three memory-mapped arrays; a ShardStream over it holds Python objects per
    shard, not per utterance (format 1's lists held two str per utterance, ids and culprit names: ~30 MB here),
    and makes an id or a `<shard>:<utt>` name when one is read."""
    n, per = 200_000, 10_000
    shards = tmp_path / "shards"
    shards.mkdir()
    ids = [f"id{i % 1000:05d}-yt{i * 7919 % 10**9:09d}-{i:07d}" for i in range(n)]
    np.save(shards / "utts.npy", np.array([u.encode() for u in ids]))
    np.save(shards / "labels.npy", np.arange(n, dtype=np.int32) % 1000)
    np.save(shards / "num_samples.npy", np.full(n, 48000, dtype=np.int64))
    files = [{"file": f"shard-{k:06d}.tar", "count": per} for k in range(n // per)]  # no tar needed to start
    index = {"format": 2, "sample_rate": 16000, "speakers": [f"id{s:05d}" for s in range(1000)], "total": n}
    (shards / "shards.json").write_text(json.dumps({**index, "shards": files}))
    tracemalloc.start()
    try:
        stream = ShardStream(shards, 16, 16, 1, crop_samples=3000)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < n, held  # under a byte per utterance: the views of 20 shards
    assert isinstance(stream.utts.array, np.memmap) and isinstance(stream.items.labels, np.memmap)
    assert stream.utts[n - 1] == ids[n - 1] and stream.items.lengths[n - 1] == 48000
    assert stream.paths[per] == f"{shards / 'shard-000001.tar'}:{ids[per]}"
    assert stream.paths[n - 1] == f"{shards / 'shard-000019.tar'}:{ids[n - 1]}" and len(stream.paths) == n


def test_the_index_is_checked_against_the_lists_as_arrays(tmp_path):
    """load_shard_data compares the shards' utterances and labels with data.train's as arrays, in the writer's
    order (a seeded permutation of the lists) or any other (a manifest's corpora listed in another order); an
    utterance moved to another speaker makes the shards stale."""
    a = make_data_dir(tmp_path / "a", {f"s{s}-{u}": f"s{s}" for s in range(3) for u in range(3)}, seconds=0.2)
    b = make_data_dir(tmp_path / "b", {f"s{s}-{u}": f"s{s}" for s in range(2) for u in range(2)}, 0.2, seed=1)
    manifest = tmp_path / "ab.yaml"
    manifest.write_text(yaml.safe_dump([{"name": "a", "dir": str(a)}, {"name": "b", "dir": str(b)}]))
    write_shards(manifest, tmp_path / "shards", per_shard=4, log=lambda m: None)
    settings = DataSettings(train=str(manifest), shards=str(tmp_path / "shards"))

    def lists(*names):
        return TrainLists([Corpus(name=c, lists=read_compact(tmp_path / c)) for c in names])

    for order in (("a", "b"), ("b", "a")):
        logged = []
        load_shard_data(settings, lists(*order), logged.append)
        assert logged == [f"training data {settings.shards}: 13 utterances, 5 speakers in shards"]
    (b / "utt2spk").write_text((b / "utt2spk").read_text().replace("s1-1 s1", "s1-1 s0"))
    with pytest.raises(ListError, match="13 utterances, 5 speakers\\) was not written from the lists"):
        load_shard_data(settings, lists("a", "b"), print)


def test_an_unlabelled_dir_is_sharded_and_read_by_a_self_supervised_run_only(tmp_path):
    """A data dir without utt2spk gives shards without speakers (`spk` null, labels -1); a self-supervised run's
    unlabelled lists match them and labelled shards of the same audio alike (labels unread), a labelled run's lists
    do not; a manifest mixing labelled and unlabelled corpora is one line naming the missing utt2spk."""
    from speakerlab.dataio.tables.compact import UNLABELLED, without_labels

    data = make_data_dir(tmp_path / "d", {f"s{s}-{u}": f"s{s}" for s in range(2) for u in range(3)}, seconds=0.2)
    write_shards(data, tmp_path / "labelled", per_shard=4, log=lambda m: None)
    (data / "utt2spk").unlink()
    (data / "spk2utt").unlink(missing_ok=True)
    assert main(["--data", str(data), "--out", str(tmp_path / "bare"), "--per-shard", "4"]) == 0
    index = written(tmp_path / "bare")
    assert index["speakers"] == [] and index["labels"] == [UNLABELLED] * 6 and index["total"] == 6
    with tarfile.open(tmp_path / "bare" / "shard-000000.tar") as tar:
        meta = json.loads(tar.extractfile(next(m for m in tar if m.name.endswith(".json"))).read())
    assert meta["spk"] is None and meta["utt"] in index["utts"]
    # A re-run of the stage (as every stage 2 re-runs) once stopped on the missing utt2spk with a traceback
    assert main(["--data", str(data), "--out", str(tmp_path / "bare"), "--per-shard", "4"]) == 0
    unlabelled = TrainLists([Corpus(name="", lists=read_compact(data))])
    for shards, held in (("bare", "unlabelled"), ("labelled", "their labels unread")):
        logged = []
        load_shard_data(DataSettings(train=str(data), shards=str(tmp_path / shards)), unlabelled, logged.append)
        assert logged == [f"training data {tmp_path / shards}: 6 utterances, {held} in shards"]
    labelled = make_data_dir(tmp_path / "l", {f"s{s}-{u}": f"s{s}" for s in range(2) for u in range(3)}, seconds=0.2)
    write_shards(labelled, tmp_path / "l_shards", per_shard=4, log=lambda m: None)
    as_unlabelled = TrainLists([Corpus(name="", lists=without_labels(read_compact(labelled)))])
    load_shard_data(DataSettings(train=str(labelled), shards=str(tmp_path / "l_shards")), as_unlabelled, print)
    bare_lists = TrainLists([Corpus(name="", lists=read_compact(labelled))])
    with pytest.raises(ListError, match="0 speakers\\) was not written from the lists"):
        load_shard_data(DataSettings(train=str(labelled), shards=str(tmp_path / "bare")), bare_lists, print)
    manifest = tmp_path / "mixed.yaml"
    manifest.write_text(yaml.safe_dump([{"name": "a", "dir": str(labelled)}, {"name": "b", "dir": str(data)}]))
    with pytest.raises(ListError) as e:
        write_shards(manifest, tmp_path / "mixed", log=lambda m: None)
    assert str(e.value).startswith(f"{data / 'utt2spk'}: file does not exist, and the other corpora have theirs")


def test_a_manifest_without_out_is_a_usage_error_saying_to_give_it(tmp_path, capsys):
    """<data>/shards is the default dir of a data dir; a manifest (a file) has none: the error says to give --out."""
    manifest = tmp_path / "corpora.yaml"
    manifest.write_text("- {path: data/a}\n")
    with pytest.raises(SystemExit) as stop:
        main(["--data", str(manifest)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"--data {manifest} is a manifest of corpora: give --out" in err, err
    assert not (tmp_path / "corpora.yaml" / "shards").exists() and manifest.is_file()


def test_lists_written_again_unchanged_keep_the_shards_fresh(tmp_path):
    """A preparing stage run again writes the same lists: they keep their modification time, so stage 2 finds the
    shards up to date instead of rebuilding them (hours for VoxCeleb2); a changed list is written and rebuilds."""
    from speakerlab.dataio.tables.lists import load_data_dir, write_lists

    data = make_data_dir(tmp_path / "train", {f"s{s}-{u}": f"s{s}" for s in range(2) for u in range(4)}, seconds=0.3)
    lists = load_data_dir(data)
    write_lists(data, lists.utts, lists.wav, lists.utt2spk)  # the lists as the corpus preparers write them
    said = []
    write_shards(data, tmp_path / "shards", per_shard=3, log=said.append)
    before = {n: (data / n).stat().st_mtime_ns for n in ("wav.scp", "utt2spk", "spk2utt")}
    write_lists(data, lists.utts, lists.wav, lists.utt2spk)
    assert {n: (data / n).stat().st_mtime_ns for n in before} == before
    write_shards(data, tmp_path / "shards", per_shard=3, log=said.append)
    assert said[-1].endswith("nothing to do"), said
    kept = lists.utts[:-1]  # one utterance fewer: the lists change, and the shards are rebuilt
    write_lists(data, kept, lists.wav, lists.utt2spk)
    assert (data / "wav.scp").read_text().count("\n") == len(kept)
    write_shards(data, tmp_path / "shards", per_shard=3, log=said.append)
    assert not said[-1].endswith("nothing to do") and load_index(tmp_path / "shards")["total"] == len(kept)
