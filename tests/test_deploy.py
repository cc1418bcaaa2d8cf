"""Deployment without torch: the waveform ONNX wrapper (lengths, padded batches), its metadata, the torch-free
runtime (`speakerlab-embed --onnx`, `load_embedder(onnx=...)`) and its bad inputs, the int8 check's verdict.

The fast tests run on a small waveform graph written here with the onnx package (per row: mean and mean square
of the samples, so every expected value is known) wrapped by the exporter's own `with_lengths`; the files the
exporter makes from registered models are checked in tests/test_deploy_export.py (slow: torch.export).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT, torch_free_env, write_wav

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from speakerlab.inference.deploy.graph import set_metadata, with_lengths  # noqa: E402
from speakerlab.inference.deploy.runtime import FEATURES_FORMAT, load_onnx  # noqa: E402
from tests.stats_onnx import metadata, stats, stats_graph  # noqa: E402


@pytest.fixture(scope="module")
def stats_file(tmp_path_factory) -> Path:
    model = with_lengths(stats_graph())
    onnx.checker.check_model(model)
    set_metadata(model, metadata(threshold="0.5", threshold_source="exp/scores/test.json"))
    path = tmp_path_factory.mktemp("onnx") / "stats.onnx"
    onnx.save(model, path)
    return path


def test_padded_batch_gives_each_row_its_own_embedding(stats_file):
    """The Loop branch: rows cut to their lengths; the whole-batch branch when every length is N."""
    rng = np.random.default_rng(0)
    waves = [rng.standard_normal(n).astype(np.float32) for n in (1700, 5003, 2400, 5003)]
    padded = np.zeros((4, 5003), np.float32)
    for i, w in enumerate(waves):
        padded[i, : len(w)] = w
    embedder = load_onnx(stats_file)
    got = embedder(padded, np.array([len(w) for w in waves]))
    np.testing.assert_allclose(got, np.stack([stats(w) for w in waves]), rtol=1e-5, atol=1e-6)
    full = embedder(padded)  # lengths default to N: every row whole, zeros included
    np.testing.assert_allclose(full, np.stack([stats(r) for r in padded]), rtol=1e-5, atol=1e-6)


def test_metadata_and_batching_follow_the_torch_path(stats_file):
    embedder = load_onnx(stats_file)
    assert (embedder.sample_rate, embedder.embedding_size, embedder.threshold) == (16000, 2, 0.5)
    rng = np.random.default_rng(1)
    waves = [rng.standard_normal(n).astype(np.float32) for n in (1600, 4000, 1600, 2500)]
    np.testing.assert_allclose(embedder.embed_waves(waves, max_batch=2), np.stack([stats(w) for w in waves]), rtol=1e-5)


def mixed_rate_folder(root: Path) -> Path:
    """A wav.scp of 1.2 s files at 8, 16, 22.05, 44.1 and 48 kHz (one stereo)."""
    rng = np.random.default_rng(2)
    lines = []
    for i, rate in enumerate((8000, 16000, 22050, 44100, 48000)):
        shape = (int(1.2 * rate), 2) if rate == 22050 else int(1.2 * rate)
        path = write_wav(root / "wavs" / f"u{i}.wav", 0.1 * rng.standard_normal(shape), rate)
        lines.append(f"u{i} {path}\n")
    (root / "wav.scp").write_text("".join(lines))
    return root / "wav.scp"


def runtime_modules() -> set:
    """The modules runtime/pyproject.toml ships, with the packages that hold them."""
    text = (ROOT / "runtime" / "pyproject.toml").read_text()
    modules = set(re.findall(r'^    "(speakerlab[\w.]*)",$', text, re.M))
    return modules | {m.rsplit(".", i)[0] for m in modules for i in range(1, m.count(".") + 1)}


def test_the_runtime_distribution_ships_every_module_its_commands_import(stats_file, tmp_path):
    """speakerlab-embed --onnx, speakerlab-diarize --onnx --vad energy, speakerlab-der, speakerlab-verify --onnx and
    the Python API run where torch cannot be imported, and import no speakerlab module that runtime/pyproject.toml
    leaves out."""
    record = tmp_path / "modules.txt"
    env = {**torch_free_env(tmp_path), "SPEAKERLAB_TEST_MODULES": str(record)}
    rng = np.random.default_rng(4)
    conversation = np.concatenate([np.zeros(4000), 0.3 * rng.standard_normal(40000), np.zeros(8000)])
    wav = write_wav(tmp_path / "conv.wav", conversation)
    (tmp_path / "wav.scp").write_text(f"conv {wav}\n")
    rttm = tmp_path / "conv.rttm"
    runs = {
        "speakerlab.inference.cli:embed": [
            str(tmp_path / "wav.scp"),
            str(tmp_path / "e.npz"),
            "--onnx",
            str(stats_file),
        ],
        "speakerlab.diarization.cli:main": [
            str(wav),
            "--onnx",
            str(stats_file),
            "--vad",
            "energy",
            "--rttm",
            str(rttm),
        ],
        "speakerlab.diarization.der:main": ["--help"],
        "speakerlab.inference.cli:verify": [str(wav), str(wav), "--onnx", str(stats_file), "--threshold", "0.5"],
    }
    for target, args in runs.items():
        module, function = target.split(":")
        code = f"import sys; from {module} import {function}; sys.argv[1:] = {args!r}; {function}()"
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert run.returncode == 0, (target, run.stderr)
    api = "from speakerlab.inference import load_onnx; load_onnx(__import__('sys').argv[1]).embed_waves([[0.1] * 1600])"
    assert subprocess.run([sys.executable, "-c", api, str(stats_file)], env=env).returncode == 0
    assert rttm.read_text().startswith("SPEAKER conv 1 ")
    imported = set(record.read_text().split())
    assert {
        "speakerlab.inference.deploy.runtime",
        "speakerlab.diarization.pipeline",
        "speakerlab.diarization.der",
    } <= imported
    assert imported - runtime_modules() == set()


def test_a_command_that_needs_torch_says_so_in_one_line_in_the_runtime_install():
    """runtime/pyproject.toml has every console script of the full install: the runtime's own with the same
    entry points, the others on speakerlab.commands:needs_torch, which names the command in one line, exit 2."""
    full = dict(re.findall(r'^(speakerlab-[\w-]+) = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M))
    runtime = dict(re.findall(r'^(speakerlab-[\w-]+) = "([^"]+)"', (ROOT / "runtime/pyproject.toml").read_text(), re.M))
    assert runtime.keys() == full.keys()
    own = {name for name, target in runtime.items() if target != "speakerlab.commands:needs_torch"}
    assert own == {
        "speakerlab-embed",
        "speakerlab-diarize",
        "speakerlab-der",
        "speakerlab-verify",
        "speakerlab-plda",
        "speakerlab-enrol",
        "speakerlab-identify",
    }
    assert all(runtime[name] == full[name] for name in own)
    code = "import sys, speakerlab.commands as c; sys.argv[0] = '/v/bin/speakerlab-export'; c.needs_torch()"
    run = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stdout == "" and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("error: speakerlab-export needs torch; this is speakerlab-recipes-runtime")


def test_a_wave_shorter_than_one_frame_is_the_torch_paths_error_and_resample_false_stays_on_onnxruntime(tmp_path):
    """A file batched by fbank frames: a wave below one window is the ValueError of the torch path's Fbank, not an
    onnxruntime INVALID_ARGUMENT; load_embedder(onnx=..., resample=False) is the OnnxEmbedder, torch not imported."""
    from speakerlab.features.fbank import Fbank
    from speakerlab.frontends import FbankConfig

    model = with_lengths(stats_graph())
    set_metadata(model, metadata(batching=json.dumps({"by": "frames", "window": 400, "shift": 160})))
    path = tmp_path / "frames.onnx"
    onnx.save(model, path)
    with pytest.raises(ValueError) as torch_error:
        Fbank(FbankConfig())(__import__("torch").zeros(1, 399))
    with pytest.raises(ValueError) as onnx_error:
        load_onnx(path).embed_waves([np.zeros(399, np.float32)])
    assert (
        str(onnx_error.value)
        == str(torch_error.value)
        == ("wave of 399 samples is too short for one frame of 400 samples (snip_edges=True)")
    )
    code = (
        "import sys; from speakerlab.inference import load_embedder; e = load_embedder(onnx=sys.argv[1], "
        "resample=False, threads=1); print(type(e).__name__, e.resample, 'torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code, str(path)], env=torch_free_env(tmp_path), capture_output=True)
    assert run.stdout.decode().split() == ["OnnxEmbedder", "False", "False"], run.stderr.decode()


def test_embed_onnx_runs_without_torch_on_mixed_rates(stats_file, tmp_path):
    """speakerlab-embed --onnx and load_embedder(onnx=...) in a process where `import torch` fails; files of five
    rates resampled by scipy's resample_poly; the stereo file's first channel, with a warning naming it."""
    from scipy.signal import resample_poly

    from speakerlab.dataio.audio import read_first_channel

    scp = mixed_rate_folder(tmp_path)
    env = torch_free_env(tmp_path)
    assert subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True).returncode != 0
    out = tmp_path / "emb.npz"
    embed = "from speakerlab.inference.cli import embed; embed()"  # the console script speakerlab-embed
    cmd = [sys.executable, "-c", embed, str(scp), str(out), "--onnx", str(stats_file)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "u2.wav: 2 channels, using the first" in run.stderr and "Traceback" not in run.stderr
    api = (
        "from speakerlab.inference import load_embedder; import sys; e = load_embedder(onnx=sys.argv[1]); "
        "print(e.embed_waves([e.read(sys.argv[2])])[0].tolist()); print('torch' in sys.modules)"
    )
    first = scp.read_text().split()[1]
    run_api = subprocess.run(
        [sys.executable, "-c", api, str(stats_file), first], env=env, capture_output=True, text=True
    )
    assert run_api.returncode == 0, run_api.stderr
    got = np.load(out)
    assert list(got["ids"]) == [f"u{i}" for i in range(5)]
    for i, line in enumerate(scp.read_text().splitlines()):
        wave, rate = read_first_channel(line.split()[1], lambda m: None)
        expected = stats(
            resample_poly(wave.astype(np.float64), 16000 // np.gcd(16000, rate), rate // np.gcd(16000, rate))
        )
        np.testing.assert_allclose(got["embeddings"][i], expected, rtol=1e-4)
    api_out, torch_loaded = run_api.stdout.splitlines()
    np.testing.assert_allclose(json.loads(api_out), got["embeddings"][0], rtol=1e-6)
    assert torch_loaded == "False"


def embed_cli(*args) -> tuple:
    from speakerlab.inference.cli import run_embed

    return run_embed(list(map(str, args)))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a model at all\n", "not a readable ONNX file"),
        ("foreign", "an ONNX file without speakerlab metadata (another project's?)"),
        ("features", "this ONNX file takes features (B, T, F), not audio; export with speakerlab-export --waveform"),
        ("newer", "ONNX format 'speakerlab.waveform/9' is not 'speakerlab.waveform/1'"),
    ],
)
def test_a_file_that_is_not_ours_is_one_error_line(content, message, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        model = with_lengths(stats_graph())
        fmt = {"foreign": None, "features": FEATURES_FORMAT, "newer": "speakerlab.waveform/9"}[content]
        set_metadata(model, metadata(format=fmt) if fmt else {"producer.note": "another project"})
        onnx.save(model, path)
    scp = tmp_path / "wav.scp"
    scp.write_text(f"a {write_wav(tmp_path / 'a.wav', np.zeros(16000))}\n")
    assert embed_cli(scp, tmp_path / "out.npz", "--onnx", path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {message}") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.npz").exists()


def test_short_file_and_wrong_rate_without_resampling_are_errors(stats_file, tmp_path, capsys):
    short = write_wav(tmp_path / "short.wav", 0.1 * np.ones(1599))  # one sample below 0.1 s
    scp = tmp_path / "wav.scp"
    scp.write_text(f"a {write_wav(tmp_path / 'a.wav', np.zeros(16000))}\nb {short}\n")
    assert embed_cli(scp, tmp_path / "out.npz", "--onnx", stats_file) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {scp}:2: b: {short}: too short for an embedding: 1599 samples (0.100 s) at 16000 Hz, this model's "
        "shortest input is 1600 (0.100 s)"
    )
    assert not (tmp_path / "out.npz").exists()
    # docs/deployment.md's bad-input table quotes this message (it once quoted an older one's frame counts)
    row = next(x for x in (ROOT / "docs" / "deployment.md").read_text().splitlines() if "too short for an" in x)
    message = r"too short for an embedding: \d+ samples \(\d\.\d{3} s\) at \d+ Hz, this model's shortest input is"
    assert re.search(message, row), row
    narrow = write_wav(tmp_path / "narrow.wav", np.zeros(8000), 8000)
    from speakerlab.dataio.audio import AudioError

    with pytest.raises(AudioError, match=r"narrow.wav: 8000 Hz, the model takes 16000 Hz \(resampling is off\)$"):
        load_onnx(stats_file, resample=False).read(str(narrow))


def test_nan_audio_writes_nothing(stats_file, tmp_path, capsys):
    bad = write_wav(tmp_path / "nan.wav", np.full(16000, np.nan), subtype="FLOAT")
    scp = tmp_path / "wav.scp"
    scp.write_text(f"a {bad}\n")
    assert embed_cli(scp, tmp_path / "out.npz", "--onnx", stats_file) == 2
    assert "gave a non-finite embedding" in capsys.readouterr().err
    assert not (tmp_path / "out.npz").exists()


def test_exp_threshold_is_the_cosine_eer_threshold_of_the_exp_dir(tmp_path):
    """The threshold a waveform file carries is the one scored on that checkpoint's embeddings: a summary of
    another checkpoint of the run (a fine-tuning run's pretrained.pt, an earlier epoch) used to be taken as well,
    the first by name."""
    from speakerlab.inference.verify import scored_threshold

    def exp_threshold(source, model_id):  # as speakerlab-export stores it: the threshold and its file
        found = scored_threshold(source, model_id)
        return found and (found[0], str(found[1]))

    exp = tmp_path / "exp"
    (exp / "checkpoints").mkdir(parents=True)
    (exp / "scores").mkdir()
    assert exp_threshold(exp, "m1") is None
    summary = {"scoring": {"method": "cosine", "model_id": "m1"}, "operating_points": {"eer": {"threshold": 0.3125}}}
    (exp / "scores" / "b.json").write_text(json.dumps(summary))
    asnorm = {**summary, "scoring": {"method": "cosine+asnorm300", "model_id": "m1"}}
    (exp / "scores" / "a.json").write_text(json.dumps(asnorm))
    other = {"scoring": {"method": "cosine", "model_id": "m0"}, "operating_points": {"eer": {"threshold": 0.75}}}
    (exp / "scores" / "a_pretrained.json").write_text(json.dumps(other))
    assert exp_threshold(exp, "m1") == (0.3125, str(exp / "scores" / "b.json"))
    assert exp_threshold(exp / "checkpoints" / "epoch_010.pt", "m1") == (0.3125, str(exp / "scores" / "b.json"))
    assert exp_threshold(exp / "pretrained.pt", "m0") == (0.75, str(exp / "scores" / "a_pretrained.json"))
    assert exp_threshold(exp, "m2") is None and exp_threshold(exp, "") is None


def test_int8_refusal_names_its_reasons():
    from speakerlab.inference.deploy.quantize import refusal

    ok = {"cosine_mean": 0.999, "cosine_min": 0.99, "eer_fp32": 4.10, "eer_int8": 4.25}
    assert refusal(ok, max_eer_increase=0.2, min_cosine=0.98) is None
    worse = {**ok, "eer_int8": 4.75, "cosine_mean": 0.9}
    assert refusal(worse, 0.2, 0.98) == (
        "EER 4.75% against fp32 4.10% (+0.65 points > 0.2 allowed); mean cosine to fp32 0.9000 < 0.98"
    )


def test_a_graph_the_quantiser_cannot_handle_is_one_error():
    from speakerlab.inference.deploy.quantize import QuantizeError, quantize_model_graph

    broken = stats_graph()
    broken.graph.node[0].input[1] = "no_such_value"
    with pytest.raises(QuantizeError, match=r"^int8 dynamic of stats: the quantiser failed: "):
        quantize_model_graph(broken, "dynamic", [], "stats")


def test_export_without_the_onnx_packages_says_what_to_install_and_torchscript_still_works(tmp_path):
    """requirements.txt (the recipes' install) has no onnx: speakerlab-export then refuses --format onnx in one line
    naming the packages and the extra, writes nothing, and exports TorchScript as before (it used to stop at import
    with a traceback, --help included)."""
    block = "import sys; [sys.modules.__setitem__(m, None) for m in ('onnx', 'onnxscript', 'onnxruntime')]; "
    code = block + "from speakerlab.inference.deploy.export import main; sys.exit(main(sys.argv[1:]))"
    tiny = str(Path(__file__).parent / "data" / "legacy_checkpoint" / "campplus_tiny.pt")
    for fmt, rc in (("onnx", 2), ("torchscript", 0)):
        out = tmp_path / f"m.{fmt}"
        run = subprocess.run(
            [sys.executable, "-c", code, "--checkpoint", tiny, "--format", fmt, "--out", str(out)],
            text=True,
            capture_output=True,
        )
        assert run.returncode == rc, run.stderr
        assert "Traceback" not in run.stderr
        assert out.exists() == (rc == 0)
    assert run.returncode == 0 and "torchscript" in run.stdout + run.stderr


def test_export_silences_the_libraries_noise_only_and_needs_a_format_unless_waveform(capsys, caplog):
    """While exporting, torch.onnx's torchvision warnings and onnxruntime's pre-processing advice are dropped and
    every other library message passes; without --waveform or --int8, --format is a usage error naming it."""
    import logging

    from speakerlab.inference.deploy.export import main
    from speakerlab.inference.deploy.quiet import quiet_libraries

    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    with caplog.at_level(logging.WARNING), quiet_libraries():
        registration.warning("torchvision is not installed. Skipping %s", "torchvision::nms")
        logging.warning("Please consider to run pre-processing before quantization. Refer to example: ...")
        logging.warning("a message that matters")
        registration.error("an exporter error")
    assert [r.getMessage() for r in caplog.records] == ["a message that matters", "an exporter error"]
    assert registration.level == level  # put back
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", "c.pt", "--out", "m.onnx"])
    assert stop.value.code == 2
    assert "--format onnx|torchscript is required (--waveform alone implies onnx)" in capsys.readouterr().err


def test_export_over_its_own_checkpoint_is_refused_and_the_checkpoint_stays(tmp_path, capsys):
    """--out naming the checkpoint being exported (the file, a link to it, or the exp dir's latest) used to replace
    the trained model with the export; now one error line says it is an input and the checkpoint is untouched."""
    from speakerlab.inference.deploy.export import main
    from tests.helpers import save_tiny_checkpoint

    ckpt = save_tiny_checkpoint(tmp_path / "exp" / "checkpoints" / "epoch_001.pt")
    before = ckpt.read_bytes()
    (tmp_path / "link.pt").symlink_to(ckpt)
    for source, out, alias in (
        (ckpt, ckpt, ""),
        (ckpt, tmp_path / "link.pt", f" (as {ckpt})"),
        (tmp_path / "exp", ckpt, ""),
    ):
        assert main(["--checkpoint", str(source), "--format", "torchscript", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"error: {out}: an input of this command{alias}; writing an output there would replace it" in err, err
        assert ckpt.read_bytes() == before


def test_int8_options_without_int8_are_a_usage_error(tmp_path, capsys):
    """--calibration, --trials, --force and the check's limits without --int8 used to write the fp32 file silently,
    as if a forgotten --int8 had been checked; now a usage error names them and nothing is written."""
    from speakerlab.inference.deploy.export import main

    out = tmp_path / "m.onnx"
    given = ["--calibration", "data/val", "--trials", "data/test", "--min-cosine", "0.9", "--force"]
    with pytest.raises(SystemExit) as stop:
        main(["--checkpoint", "c.pt", "--waveform", *given, "--out", str(out)])
    assert stop.value.code == 2 and not out.exists()
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (
        "speakerlab-export: error: --calibration, --trials, --min-cosine, --force go with --int8 dynamic|static "
        "(the int8 calibration and check), not an fp32 file"
    )
    int8 = ["--waveform", "--int8", "static", "--calibration", "d", "--out", "m"]
    with pytest.raises(SystemExit):  # a negative count used to drop that many utterances from the list's end
        main(["--checkpoint", "c.pt", *int8, "--calibration-utts", "-3"])
    assert "error: --calibration-utts must be >= 1, got -3" in capsys.readouterr().err
    for fmt, out, right in (("torchscript", "m.onnx", ".pt"), ("onnx", "m.pt", ".onnx")):
        with pytest.raises(SystemExit):  # a TorchScript file named .onnx: the runtime then calls it unreadable
            main(["--checkpoint", "c.pt", "--format", fmt, "--out", str(tmp_path / out)])
        err = capsys.readouterr().err
        assert f"--out {tmp_path / out}: a {Path(out).suffix} name for a {fmt} file: name it {right}" in err, err


def test_int8_calibration_list_errors_name_the_list_and_line(tmp_path):
    """An empty calibration wav.scp used to reach the quantiser ('the quantiser failed: No data is collected.'), an
    unreadable file named only itself; now each is one error naming the wav.scp (and its line)."""
    from speakerlab.dataio.audio import AudioError
    from speakerlab.dataio.tables.lists import ListError
    from speakerlab.inference.deploy.export import calibration_audio

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "wav.scp").write_text("")
    with pytest.raises(ListError, match=rf"^{tmp_path / 'empty' / 'wav.scp'}: no utterances$"):
        calibration_audio(tmp_path / "empty", 16000, 200)
    good = write_wav(tmp_path / "a.wav", np.full(1600, 0.1))
    (tmp_path / "junk.wav").write_bytes(b"not audio" * 100)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "wav.scp").write_text(f"a {good}\nb {tmp_path / 'junk.wav'}\n")
    line = rf"^{tmp_path / 'bad' / 'wav.scp'}:2: b: {tmp_path / 'junk.wav'}: cannot read audio"
    with pytest.raises(AudioError, match=line):
        calibration_audio(tmp_path / "bad", 16000, 200)


def test_verify_onnx_decides_at_the_threshold_the_file_carries(tmp_path, capsys):
    """An ONNX file exported from a scored exp dir carries that checkpoint's cosine EER threshold; without a
    calibration or --threshold, speakerlab-verify --onnx decides at it, not at the untuned default."""
    from speakerlab.inference.cli import run_verify

    model = with_lengths(stats_graph())
    set_metadata(model, metadata(threshold="0.123", threshold_source="exp/scores/test.json"))
    onnx.save(model, tmp_path / "t.onnx")
    rng = np.random.default_rng(3)
    a, b = (write_wav(tmp_path / f"{n}.wav", 0.1 * rng.standard_normal(16000)) for n in "ab")
    assert run_verify([str(a), str(b), "--onnx", str(tmp_path / "t.onnx")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"threshold 0.123000 (EER threshold carried by {tmp_path / 't.onnx'}: exp/scores/test.json)"
    assert run_verify([str(a), str(b), "--onnx", str(tmp_path / "t.onnx"), "--threshold", "0.7"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "threshold 0.700000 (--threshold)"
