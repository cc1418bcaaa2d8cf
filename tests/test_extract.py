"""speakerlab.inference.extract as a module and a command: whole-utterance embeddings of a data dir."""

from pathlib import Path

import numpy as np
import pytest

from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.frontends import FbankConfig, FeatureSpec
from speakerlab.inference.embedder import Embedder, length_batches, load_embedder
from speakerlab.inference.extract import embed_data_dir, main
from speakerlab.models import build_model
from tests.helpers import TINY_CAMPPLUS as TINY
from tests.helpers import make_data_dir, write_wav


@pytest.fixture
def data(tmp_path):
    """Six utterances: four of 0.5 s, two of 0.8 s."""
    root = make_data_dir(tmp_path / "d", {f"u{i}": f"s{i % 2}" for i in range(4)}, seconds=0.5, seed=3)
    rng = np.random.default_rng(5)
    lines, u2s = (root / "wav.scp").read_text(), (root / "utt2spk").read_text()
    for utt in ("v0", "v1"):
        wav = write_wav(root / "wav" / f"{utt}.wav", 0.1 * rng.standard_normal(12800))
        lines += f"{utt} {wav}\n"
        u2s += f"{utt} s2\n"
    (root / "wav.scp").write_text(lines)
    (root / "utt2spk").write_text(u2s)
    return root


def test_batched_extraction_equals_one_utterance_at_a_time(ckpt, data):
    embedder = load_embedder(ckpt, device="cpu")
    ids, emb = embed_data_dir(embedder, data, max_batch=4)
    assert ids == ["u0", "u1", "u2", "u3", "v0", "v1"] and emb.shape == (6, 16) and emb.dtype == np.float32
    scp = dict(line.split() for line in (data / "wav.scp").read_text().splitlines())
    for i, utt in enumerate(ids):
        alone = embedder.embed_waves([embedder.read(scp[utt])])[0]
        np.testing.assert_allclose(emb[i], alone, rtol=1e-4, atol=1e-5)


def test_length_batches_respect_size_and_pad_ratio():
    frames = [100, 300, 100, 110, 300, 100, 100]
    exact = length_batches(frames, max_batch=2, pad_ratio=0.0)
    assert sorted(i for b in exact for i in b) == list(range(7))
    assert all(len(b) <= 2 and len({frames[i] for i in b}) == 1 for b in exact)
    padded = length_batches(frames, max_batch=8, pad_ratio=0.2)
    assert padded == [[0, 2, 5, 6, 3], [1, 4]]


def test_workers_embed_batches_at_once_and_give_the_same_bits(ckpt):
    """`workers` 2: two batches are in `embed` at the same time (a barrier that one thread alone would never pass),
    and the real model on one torch thread per call gives exactly the bits of one worker, in input order."""
    import threading

    import torch

    from speakerlab.inference.common import embed_in_batches

    barrier, inside = threading.Barrier(2, timeout=30), []

    def embed(rows):
        if len(inside) < 2:
            inside.append(threading.get_ident())
            barrier.wait()  # BrokenBarrierError after 30 s unless a second batch is in here too
        return rows[:, :3] * 2

    waves = [np.full(n, n, np.float32) for n in (400, 300, 400, 500, 300)]
    out = embed_in_batches(waves, lambda n: n, embed, max_batch=2, workers=2)
    assert len(set(inside)) == 2 and np.array_equal(out[:, 0], [800, 600, 800, 1000, 600])

    before = torch.get_num_threads()
    embedder = load_embedder(ckpt, device="cpu")
    rng = np.random.default_rng(4)
    waves = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(8000, 24000, 24)]
    try:
        torch.set_num_threads(1)
        alone = embedder.embed_waves(waves, max_batch=4)
        embedder.workers = 2
        threads_seen = []
        features = embedder.features.forward
        embedder.features.forward = lambda x: (threads_seen.append(torch.get_num_threads()), features(x))[1]
        together = embedder.embed_waves(waves, max_batch=4)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(alone, together) and set(threads_seen) == {1} and len(threads_seen) >= 12


def test_padded_batches_repeat_shorter_waves(ckpt):
    """pad_ratio > 0: a shorter wave in the batch is repeated, not zero-padded."""
    embedder = load_embedder(ckpt, device="cpu")
    rng = np.random.default_rng(0)
    short, longer = rng.standard_normal(8000).astype(np.float32), rng.standard_normal(8800).astype(np.float32)
    together = embedder.embed_waves([short, longer], pad_ratio=0.2)
    expected = embedder.embed_waves([np.resize(short, 8800)])[0]
    np.testing.assert_allclose(together[0], expected, rtol=1e-4, atol=1e-5)


def test_command_writes_embeddings_and_names_bad_input(ckpt, data, tmp_path, capsys):
    out = tmp_path / "e" / "emb.npz"
    assert main(["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--device", "cpu"]) == 0
    ids, emb = read_embeddings(out)
    assert ids[0] == "u0" and emb.shape == (6, 16) and np.isfinite(emb).all()
    (data / "wav" / "u2.wav").unlink()
    assert main(["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{data / 'wav.scp'}:3" in err and "u2.wav" in err
    assert main(["--checkpoint", str(tmp_path / "nothing"), "--data", str(data), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_audio_is_read_at_the_checkpoint_sample_rate(tmp_path):
    """An 8 kHz model reads 8 kHz files as they are and resamples others to 8 kHz."""
    model = build_model("campplus", **TINY)
    spec = FeatureSpec(FbankConfig(sample_rate=8000))
    embedder = Embedder(model.eval(), spec, "cpu")
    wav8 = write_wav(tmp_path / "a8.wav", 0.1 * np.random.default_rng(0).standard_normal(8000), sample_rate=8000)
    assert embedder.embed_waves([embedder.read(str(wav8))]).shape == (1, 16)
    wav16 = write_wav(tmp_path / "a16.wav", 0.1 * np.random.default_rng(1).standard_normal(16000))
    assert embedder.read(str(wav16)).shape == (8000,)


def test_an_utterance_below_the_shortest_input_is_refused_in_one_line(ckpt, data, tmp_path, capsys):
    """speakerlab-extract: an utterance one sample below the model's shortest input is refused before anything is
    embedded, naming its wav.scp line and counting the others; one at the shortest input is embedded."""
    need = load_embedder(ckpt, device="cpu").min_samples
    rng = np.random.default_rng(1)
    lines, u2s = (data / "wav.scp").read_text(), (data / "utt2spk").read_text()
    for utt, n in (("w0", need - 1), ("w1", need - 5), ("w2", need)):
        lines += f"{utt} {write_wav(data / 'wav' / f'{utt}.wav', 0.1 * rng.standard_normal(n))}\n"
        u2s += f"{utt} s3\n"
    (data / "wav.scp").write_text(lines)
    (data / "utt2spk").write_text(u2s)
    out = tmp_path / "e" / "emb.npz"
    argv = ["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--device", "cpu", "--feats", "no"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: {data / 'wav.scp'}:7: w0 ({data / 'wav' / 'w0.wav'}): too short for an embedding: {need - 1} samples "
        f"({(need - 1) / 16000:.3f} s) at 16000 Hz, this model's shortest input is {need} ({need / 16000:.3f} s) "
        "(1 more utterance(s) as short)"
    )
    assert not out.exists() and not out.with_name("emb.npz.parts").exists()
    # Without the two short ones the one at exactly the shortest input is embedded (finite).
    for name, text in (("wav.scp", lines), ("utt2spk", u2s)):
        (data / name).write_text("".join(ln + "\n" for ln in text.splitlines() if ln.split()[0] not in ("w0", "w1")))
    assert main(argv) == 0
    ids, emb = read_embeddings(out)
    assert "w2" in ids and np.isfinite(emb).all()
    assert main([*argv, "--max-seconds", f"{need / 16000:.3f}"]) == 2
    assert "cuts chunks shorter than this model's shortest input" in capsys.readouterr().err


def test_an_empty_wav_scp_is_one_line_naming_it(ckpt, tmp_path, capsys):
    """An empty data dir (a stage 10 round on an unlabelled dir whose wav.scp is empty) is refused naming its
    wav.scp, not a traceback from the finite check of zero embeddings; no npz is written."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "wav.scp").write_text("")
    out = tmp_path / "e" / "emb.npz"
    assert main(["--checkpoint", str(ckpt), "--data", str(empty), "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {empty / 'wav.scp'}: no utterances in it (an empty wav.scp)\n", err
    assert not out.exists()


def test_an_output_that_cannot_be_written_or_is_an_input_is_refused_before_the_work(ckpt, data, tmp_path, capsys):
    """--out a folder, under a file, the checkpoint itself or a file of the data dir: one line naming it, before
    anything is embedded (no parts left behind), and the input is left as it was."""
    import shutil

    model = shutil.copy(ckpt, tmp_path / "model.pt")
    before = (tmp_path / "model.pt").read_bytes(), (data / "utt2spk").read_bytes()
    (tmp_path / "folder").mkdir()
    for out, said in (
        (tmp_path / "folder", f"error: {tmp_path / 'folder'} is a folder, not a file"),
        (model / "x.npz", f"error: {model / 'x.npz'} cannot be written: {model} is a file, not a folder"),
        (model, f"error: {model}: an input of this command"),
        (data / "utt2spk", f"error: {data / 'utt2spk'}: an input of this command"),
    ):
        argv = ["--checkpoint", str(model), "--data", str(data), "--out", str(out), "--device", "cpu"]
        assert main(argv + ["--num-workers", "0"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(said) and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert not Path(f"{out}.parts").exists()
    assert ((tmp_path / "model.pt").read_bytes(), (data / "utt2spk").read_bytes()) == before


@pytest.mark.parametrize(
    "option, said",
    [
        (["--shard-units", "0"], "--shard-units must be at least 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--max-seconds", "-1"], "--max-seconds must not be negative, got -1"),
        (["--pad-ratio", "-0.5"], "--pad-ratio must not be negative, got -0.5"),
        (["--batch-seconds", "0"], "--batch-seconds must be > 0, got 0"),
    ],
)
def test_option_values_that_mean_nothing_are_a_usage_error(ckpt, data, tmp_path, capsys, option, said):
    """--shard-units 0 was a ZeroDivisionError traceback; the others were accepted and silently meant something else
    (batches of one, never chunking)."""
    out = tmp_path / "emb.npz"
    with pytest.raises(SystemExit) as exit_:
        main(["--checkpoint", str(ckpt), "--data", str(data), "--out", str(out), "--device", "cpu", *option])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"speakerlab-extract: error: {said}"
    assert not out.exists()
