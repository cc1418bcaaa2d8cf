"""Streaming extraction: chunking, shards and resumption, several processes, bounded memory."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.dataio.tables.lists import load_data_dir
from speakerlab.inference.embedder import load_embedder
from speakerlab.inference.extract import StreamingExtractor, main, plan_units
from tests.helpers import assert_no_traceback, free_port, write_wav

ROOT = Path(__file__).resolve().parent.parent


def make_dir(root: Path, n: int, seconds, seed: int = 0) -> Path:
    """n utterances whose lengths cycle through `seconds`."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    scp, u2s = [], []
    for i in range(n):
        samples = int(seconds[i % len(seconds)] * 16000)
        wav = write_wav(root / "wav" / f"u{i:04d}.wav", (0.1 * rng.standard_normal(samples)).astype(np.float32))
        scp.append(f"u{i:04d} {wav}\n")
        u2s.append(f"u{i:04d} s{i % 3}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    return root


def test_plan_units_cuts_long_utterances_into_equal_chunks():
    utt, start, length = plan_units([100, 250, 300, 301], max_len=100)
    assert utt.tolist() == [0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert length.tolist() == [100, 83, 84, 83, 100, 100, 100, 75, 75, 76, 75]
    assert start.tolist() == [0, 0, 83, 167, 0, 100, 200, 0, 75, 150, 226]
    assert plan_units([500], 0)[2].tolist() == [500]  # 0: never cut


def test_chunked_embeddings_are_the_mean_of_their_chunks(ckpt, tmp_path):
    data = make_dir(tmp_path / "d", 5, [0.6, 2.2, 0.8])
    embedder = load_embedder(ckpt, device="cpu")
    out = tmp_path / "e.npz"
    assert (
        main(
            [
                "--checkpoint",
                str(ckpt),
                "--data",
                str(data),
                "--out",
                str(out),
                "--max-seconds",
                "1.0",
                "--num-workers",
                "0",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    ids, emb = read_embeddings(out)
    scp = dict(line.split() for line in (data / "wav.scp").read_text().splitlines())
    for i, utt in enumerate(ids):
        wave = embedder.read(scp[utt])
        if len(wave) <= 16000:  # short: embedded whole, as without chunking
            expected = embedder.embed_waves([wave])[0]
        else:  # 2.2 s: three chunks of 11733/11734 samples, averaged
            edges = np.linspace(0, len(wave), 4).round().astype(int)
            expected = embedder.embed_waves([wave[a:b] for a, b in zip(edges[:-1], edges[1:])]).mean(axis=0)
        np.testing.assert_allclose(emb[i], expected, rtol=1e-4, atol=1e-5)
    assert not out.with_name("e.npz.parts").exists()


def test_rerun_skips_finished_shards_and_changed_settings_start_again(ckpt, tmp_path, capsys):
    data = make_dir(tmp_path / "d", 12, [0.5, 0.7, 0.9, 1.1])
    out = tmp_path / "e.npz"
    args = [
        "--checkpoint",
        str(ckpt),
        "--data",
        str(data),
        "--out",
        str(out),
        "--shard-units",
        "3",
        "--num-workers",
        "0",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    _, whole = read_embeddings(out)
    # A run that was killed after its first shard: the same command finishes the other three.
    ex = StreamingExtractor(
        load_embedder(ckpt, device="cpu"), load_data_dir(data, need_speakers=False), out, shard_units=3, num_workers=0
    )
    ex.prepare_parts(print)
    ex.run_shard(0)
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "1 of 4 shards already done" in err and "rank 0 embedded 3 shard(s)" in err
    np.testing.assert_allclose(read_embeddings(out)[1], whole, rtol=1e-6, atol=1e-7)
    ex.prepare_parts(print)
    ex.run_shard(0)
    assert main(args[:-4] + ["--max-seconds", "0.6", "--num-workers", "0", "--device", "cpu"]) == 0
    assert "holds parts of another run" in capsys.readouterr().err


def test_a_checkpoint_replaced_in_place_does_not_resume_from_the_old_ones_parts(tmp_path, capsys):
    """A run killed after its first shard, then the checkpoint file rewritten at the same path (stage 6 averaging
    again into avg.pt, say): the re-run must not merge the old model's shard into the new one's embeddings."""
    from tests.helpers import save_tiny_checkpoint

    data = make_dir(tmp_path / "d", 12, [0.5, 0.7, 0.9, 1.1])
    model, out, fresh = tmp_path / "avg.pt", tmp_path / "e.npz", tmp_path / "fresh.npz"
    save_tiny_checkpoint(model, seed=0)
    ex = StreamingExtractor(
        load_embedder(model, device="cpu"), load_data_dir(data, need_speakers=False), out, shard_units=3, num_workers=0
    )
    ex.prepare_parts(print)
    ex.run_shard(0)
    save_tiny_checkpoint(model, seed=1)
    args = ["--checkpoint", str(model), "--data", str(data), "--shard-units", "3", "--num-workers", "0"]
    capsys.readouterr()
    assert main(args + ["--out", str(out), "--device", "cpu"]) == 0
    assert "holds parts of another run" in capsys.readouterr().err
    assert main(args + ["--out", str(fresh), "--device", "cpu"]) == 0
    np.testing.assert_array_equal(read_embeddings(out)[1], read_embeddings(fresh)[1])


def test_kaldi_output_is_readable_by_kaldiio(ckpt, tmp_path):
    import kaldiio

    data = make_dir(tmp_path / "d", 4, [0.5, 0.8])
    out = tmp_path / "e.npz"
    assert (
        main(
            [
                "--checkpoint",
                str(ckpt),
                "--data",
                str(data),
                "--out",
                str(out),
                "--kaldi",
                "--num-workers",
                "0",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    ids, emb = read_embeddings(out)
    scp = kaldiio.load_scp(str(tmp_path / "e.scp"))
    assert sorted(scp) == ids
    for utt, e in zip(ids, emb):
        np.testing.assert_array_equal(scp[utt], e)


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_two_processes_give_the_single_process_embeddings(ckpt, tmp_path):
    data = make_dir(tmp_path / "d", 20, [0.5, 0.7, 1.3, 2.5])
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    common = [
        "--checkpoint",
        str(ckpt),
        "--data",
        str(data),
        "--shard-units",
        "4",
        "--max-seconds",
        "1.0",
        "--num-workers",
        "0",
        "--device",
        "cpu",
    ]
    assert main([*common, "--out", str(one)]) == 0
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "-m",
            "speakerlab.inference.extract",
            *common,
            "--out",
            str(two),
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_traceback(r.stdout, r.stderr)
    assert "rank 0 embedded" in r.stderr and "rank 1 embedded" in r.stderr
    (ids1, e1), (ids2, e2) = read_embeddings(one), read_embeddings(two)
    assert ids1 == ids2
    np.testing.assert_allclose(e2, e1, rtol=1e-5, atol=1e-6)


PEAK = """
import resource, sys
from speakerlab.inference.extract import main
assert main(sys.argv[1:]) == 0
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_peak_memory_grows_less_than_20_percent_with_5x_more_audio(ckpt, tmp_path):
    """25 minutes of audio against 5: decoding everything first would add ~75 MB of float32 per 5
    minutes; streaming holds a batch at a time."""
    peaks = []
    for name, n in (("small", 20), ("large", 100)):
        data = make_dir(tmp_path / name, n, [15.0], seed=n)
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                PEAK,
                "--checkpoint",
                str(ckpt),
                "--data",
                str(data),
                "--out",
                str(tmp_path / f"{name}.npz"),
                "--num-workers",
                "0",
                "--batch-seconds",
                "60",
                "--device",
                "cpu",
            ],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        peaks.append(int(r.stdout.split()[-1]))
    assert peaks[1] < 1.2 * peaks[0], f"peak RSS {peaks[0] / 1024:.0f} MB -> {peaks[1] / 1024:.0f} MB"


def _store_args(ckpt, data, out, *extra):
    return ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--feats", "yes", "--device", "cpu"]


def test_feature_store_units_chunk_shard_and_resume_like_audio(ckpt, tmp_path, capsys):
    """From the store: utterances longer than --max-seconds are the mean of equal frame chunks; parts and
    resumption as on the audio path."""
    from speakerlab.features.fbank import num_frames
    from speakerlab.features.store import FeatureStore
    from speakerlab.features.store import main as store_main

    data = make_dir(tmp_path / "d", 4, [0.6, 2.2, 1.4])
    assert store_main(["--data", str(data)]) == 0
    out = tmp_path / "e.npz"
    args = _store_args(ckpt, data, out) + ["--max-seconds", "1.0", "--shard-units", "2", "--num-workers", "0"]
    assert main(args) == 0
    assert "rank 0 embedded 4 shard(s)" in capsys.readouterr().err  # 7 units (1 + 3 + 2 + 1): 4 shards
    ids, emb = read_embeddings(out)
    embedder, store = load_embedder(ckpt, device="cpu"), FeatureStore(data)
    limit = num_frames(16000, embedder.spec.fbank)
    for i, utt in enumerate(ids):
        feats = torch.tensor(store[utt])
        k = -(-len(feats) // limit)
        edges = np.linspace(0, len(feats), k + 1).round().astype(int)
        chunks = [embedder.embed_fbank(feats[a:b][None])[0].numpy() for a, b in zip(edges[:-1], edges[1:])]
        np.testing.assert_allclose(emb[i], np.mean(chunks, axis=0), rtol=1e-4, atol=1e-5)
    # A run killed after one shard: the same command embeds only the other three.
    ex = StreamingExtractor(
        embedder, load_data_dir(data, need_speakers=False), out, 1.0, shard_units=2, num_workers=0, store=store
    )
    ex.prepare_parts(print)
    ex.run_shard(0)
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "1 of 4 shards already done" in err and "rank 0 embedded 3 shard(s)" in err
    np.testing.assert_allclose(read_embeddings(out)[1], emb, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_feature_store_under_torchrun_only_rank_0_writes(ckpt, tmp_path):
    """Two processes from the store: each embeds its shards, rank 0 alone writes OUT, equal to one process."""
    from speakerlab.features.store import main as store_main

    data = make_dir(tmp_path / "d", 20, [0.5, 0.7, 1.3, 2.5])
    assert store_main(["--data", str(data)]) == 0
    one, two = tmp_path / "one.npz", tmp_path / "two.npz"
    common = ["--shard-units", "4", "--max-seconds", "1.0", "--num-workers", "1"]
    assert main(_store_args(ckpt, data, one) + common) == 0
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
        + ["-m", "speakerlab.inference.extract", *_store_args(ckpt, data, two), *common],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert_no_traceback(r.stdout, r.stderr)
    assert "rank 0 embedded" in r.stderr and "rank 1 embedded" in r.stderr
    assert r.stderr.count("extract: 20 embeddings") == 1  # one writer
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("two")) == ["two.npz"]
    (ids1, e1), (ids2, e2) = read_embeddings(one), read_embeddings(two)
    assert ids1 == ids2
    np.testing.assert_allclose(e2, e1, rtol=1e-5, atol=1e-6)


def test_cpu_batches_are_bounded_in_audio_whatever_the_number_of_equal_utterances(ckpt, tmp_path):
    """Many utterances of one length would fill batches of --batch-size, a peak that grows with the data
    until that count; on the CPU the default bound is 30 s of padded audio a batch."""
    from speakerlab.features.fbank import num_frames
    from speakerlab.inference.extract import default_batch_seconds

    data = make_dir(tmp_path / "d", 1, [2.0])
    scp = (data / "wav.scp").read_text().split()[1]
    (data / "wav.scp").write_text("".join(f"u{i:03d} {scp}\n" for i in range(64)))
    (data / "utt2spk").unlink()
    embedder = load_embedder(ckpt, device="cpu")
    ex = StreamingExtractor(embedder, load_data_dir(data, need_speakers=False), tmp_path / "e.npz")
    assert default_batch_seconds(torch.device("cpu")) == 30.0
    frames = num_frames(32000, embedder.spec.fbank)
    sizes = [len(b) for shard in ex.shards for b in shard]
    assert sum(sizes) == 64 and max(sizes) == 3000 // frames  # 15 units of 2 s (not 32)
