"""Galleries and open-set identification: an enrolled speaker's held-out utterance named, a never-enrolled speaker
"unknown", a short file "too short"; add / remove / list; a gallery of another model refused; a gallery that
survives a kill during an update; the command line end to end on a checkpoint."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from speakerlab.dataio.tables.embeddings import read_embeddings
from speakerlab.identification.cli import run_enrol, run_identify
from speakerlab.identification.gallery import Gallery, GalleryError, read_gallery, write_gallery
from speakerlab.identification.identify import identify
from speakerlab.scoring.calibrate import main as calibrate
from speakerlab.scoring.calibration_file import read_calibration
from tests.calibration_data import make_set
from tests.helpers import ROOT, save_tiny_checkpoint, write_wav


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A calibration fitted on 20 speakers and a second set of 20 others: 10 of them enrolled with their first 4
    utterances, the other 10 never enrolled."""
    root = tmp_path_factory.mktemp("ident")
    cal_dir = make_set(root, "cal", 20, 8, seed=0)
    out = root / "cal.json"
    args = ["--trials", cal_dir / "trials", "--embeddings", root / "cal.npz", "--durations", cal_dir, "--out", out]
    assert calibrate([str(a) for a in args]) == 0
    ev_dir = make_set(root, "ev", 20, 8, seed=1)
    ids, emb = read_embeddings(root / "ev.npz")
    seconds = {u: float(x) for u, x in (line.split() for line in (ev_dir / "utt2dur").read_text().splitlines())}
    g = Gallery.empty("m" * 64, emb.shape[1])
    for s in range(10):
        rows = [i for i, u in enumerate(ids) if u.startswith(f"ev-s{s}-") and int(u.rsplit("u", 1)[1]) < 4]
        g.add(f"ev-s{s}", [ids[i] for i in rows], emb[rows], [seconds[ids[i]] for i in rows])
    return read_calibration(out), g, ids, emb, seconds


def test_enrolled_speaker_named_and_never_enrolled_unknown(world):
    cal, g, ids, emb, seconds = world
    named = unknown = 0
    held = [i for i, u in enumerate(ids) if int(u.rsplit("u", 1)[1]) >= 4 and seconds[u] >= 2]
    for i in held:
        r = identify(g, cal, emb[i], seconds[ids[i]], fpir=0.05)
        speaker = ids[i].rsplit("-", 1)[0]
        if int(speaker.split("-s")[1]) < 10:
            named += r.answer == speaker
            assert r.answer in (speaker, "unknown")  # never another enrolled speaker on this easy data
            assert r.margin is not None and (r.answer != speaker or r.margin > 0)
        else:
            unknown += r.answer == "unknown"
    n_enrolled = sum(int(ids[i].split("-s")[1].split("-")[0]) < 10 for i in held)
    assert named >= 0.8 * n_enrolled and unknown >= 0.8 * (len(held) - n_enrolled)
    short = identify(g, cal, emb[held[0]], 0.5, min_seconds=1.0)
    assert short.answer == "too short" and short.line() == "too short (0.50 s)"


def test_add_remove_list_and_another_models_gallery_refused(world, tmp_path):
    _, g, *_ = world
    path = tmp_path / "g.npz"
    write_gallery(path, g)
    back = read_gallery(path)
    assert back.summary() == g.summary() and back.summary()[0][:2] == ("ev-s0", 4)
    assert back.remove("ev-s3", str(path)) == 4 and "ev-s3" not in back.names()
    with pytest.raises(GalleryError, match="no speaker 'nobody' enrolled"):
        back.remove("nobody", str(path))
    with pytest.raises(GalleryError, match="a gallery of model mmmmmmmmmmmm, not of this model oooooooooooo"):
        back.check_model("o" * 64, str(path))
    with pytest.raises(GalleryError, match="must name its model"):
        Gallery.empty("", 4)


def test_gallery_survives_a_kill_during_an_update(world, tmp_path):
    """A process SIGKILLed half-way through writing the new gallery: the file is the old one, whole, and the next
    update works."""
    _, g, *_ = world
    path = tmp_path / "g.npz"
    write_gallery(path, g)
    before = path.read_bytes()
    script = (
        "import os, signal, sys, numpy as np\n"
        "from speakerlab.identification import gallery as G\n"
        "real = np.savez\n"
        "def torn(f, **arrays):\n"
        "    import io\n"
        "    buf = io.BytesIO(); real(buf, **arrays); f.write(buf.getvalue()[: len(buf.getvalue()) // 2]); f.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "np.savez = torn\n"
        "g = G.read_gallery(sys.argv[1]); g.remove('ev-s0', 'x'); G.write_gallery(sys.argv[1], g)\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(path)], cwd=ROOT, capture_output=True)
    assert run.returncode == -9
    assert path.read_bytes() == before and read_gallery(path).summary() == g.summary()
    again = read_gallery(path)
    again.remove("ev-s0", str(path))
    write_gallery(path, again)
    assert "ev-s0" not in read_gallery(path).names()


def test_enrol_and_identify_commands_on_a_checkpoint(tmp_path, capsys):
    """speakerlab-enrol add / list / remove and speakerlab-identify with a calibration of the checkpoint: every line
    has its answer, a short file 'too short'; a calibration-less identify and another model's gallery are refused."""
    from speakerlab.sources import read_source

    ckpt = save_tiny_checkpoint(tmp_path / "exp" / "checkpoints" / "c.pt")
    digest = read_source(ckpt, kind="speakerlab").digest
    cal_dir = make_set(tmp_path, "cal", 12, 6, seed=0, model_id=digest)
    args = ["--trials", cal_dir / "trials", "--embeddings", tmp_path / "cal.npz", "--durations", cal_dir]
    assert calibrate([str(a) for a in [*args, "--out", tmp_path / "exp" / "calibration.json"]]) == 0
    rng = np.random.default_rng(0)
    wav = {
        n: write_wav(tmp_path / f"{n}.wav", 0.1 * rng.standard_normal(int(s * 16000)))
        for n, s in [("a1", 1.5), ("a2", 1.4), ("b1", 1.6), ("x", 1.5), ("short", 0.3)]
    }
    gal = str(tmp_path / "people.npz")
    src = ["--checkpoint", str(ckpt)]
    assert run_enrol(["add", gal, "alice", str(wav["a1"]), str(wav["a2"]), *src]) == 0
    assert run_enrol(["add", gal, "bob", str(wav["b1"]), *src]) == 0
    capsys.readouterr()
    assert run_enrol(["list", gal]) == 0
    assert capsys.readouterr().out.splitlines() == ["alice\t2\t2.9", "bob\t1\t1.6"]
    files = [str(wav["x"]), str(wav["a1"]), str(wav["short"])]
    assert run_identify([gal, *files, *src, "--min-seconds", "0.5"]) == 0
    got = capsys.readouterr()
    lines = got.out.splitlines()
    # 12 calibration speakers, each left out against the other 11: FPIR 1 % over 2 enrolled is measured there
    assert "threshold at FPIR 1 % over 2 speakers: measured" in got.err
    assert [ln.split("\t")[0] for ln in lines] == files and lines[2].endswith("too short (0.30 s)")
    assert all(("FPIR 1 %" in ln) for ln in lines[:2]) and lines[1].split("\t")[1].split()[0] in ("alice", "unknown")
    other = save_tiny_checkpoint(tmp_path / "other" / "c.pt", seed=1)
    assert run_identify([gal, files[0], "--checkpoint", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a gallery of model" in err[0]
    bare = tmp_path / "bare" / "checkpoints" / "c.pt"  # the same model, in an exp dir without a calibration
    bare.parent.mkdir(parents=True)
    bare.write_bytes(ckpt.read_bytes())
    assert run_identify([gal, files[0], "--checkpoint", str(bare)]) == 2
    assert "no calibration of this model" in capsys.readouterr().err
    assert run_identify([gal, files[0], *src, "--fpir", "1e-6"]) == 2  # the FPIR asked for is named, not a FAR alone
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --fpir 1e-06 over 2 speaker(s): not measured"), err
    assert "analytic threshold's FAR 5e-07 was not measurable" in err[0]
    assert run_enrol(["remove", gal, "bob"]) == 0 and read_gallery(gal).names() == ["alice"]
    assert run_enrol(["remove", gal, "alice"]) == 0 and read_gallery(gal).names() == []
    capsys.readouterr()
    assert run_identify([gal, files[0], *src]) == 2  # an emptied gallery: one line naming it
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {gal}: no speaker enrolled: speakerlab-enrol add {gal} NAME FILES..."
    ]


def test_enrol_and_identify_from_onnx_without_torch(tmp_path):
    """speakerlab-enrol / -identify on a waveform ONNX file carrying a model digest and a calibration, in processes
    where `import torch` fails."""
    pytest.importorskip("onnxruntime")
    from speakerlab.inference.deploy.graph import set_metadata, with_lengths
    from tests.helpers import torch_free_env
    from tests.stats_onnx import metadata, stats_graph

    cal_dir = make_set(tmp_path, "cal", 12, 6, seed=0, model_id="s" * 64)
    out = tmp_path / "cal.json"
    args = ["--trials", cal_dir / "trials", "--embeddings", tmp_path / "cal.npz", "--durations", cal_dir, "--out", out]
    assert calibrate([str(a) for a in args]) == 0
    model = with_lengths(stats_graph())
    set_metadata(model, metadata(model_id="s" * 64, calibration=out.read_text()))
    onnx_file = tmp_path / "stats.onnx"
    import onnx

    onnx.save(model, onnx_file)
    rng = np.random.default_rng(1)
    wavs = [
        str(write_wav(tmp_path / f"w{i}.wav", a + 0.05 * rng.standard_normal(24000)))
        for i, a in enumerate([0.1, 0.1, 0.3])
    ]
    env = torch_free_env(tmp_path)
    gal = str(tmp_path / "g.npz")

    def run(script: str, *argv) -> subprocess.CompletedProcess:
        code = f"import sys; from speakerlab.identification.cli import {script}; {script}(sys.argv[1:])"
        return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True)

    r = run("enrol", "add", gal, "alice", wavs[0], "--onnx", str(onnx_file))
    assert r.returncode == 0, r.stderr
    r = run("identify", gal, wavs[1], wavs[2], "--onnx", str(onnx_file))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split("\t")[0] for ln in lines] == wavs[1:] and all("FPIR 1 %" in ln for ln in lines)
    assert read_gallery(gal).model_id == "s" * 64
