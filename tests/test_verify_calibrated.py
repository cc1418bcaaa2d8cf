"""speakerlab-verify with a calibration: the calibrated LLR, probability and decision at a false-alarm rate, the
same from a waveform ONNX file that carries the calibration (and without torch) as from the checkpoint; a
calibration of another model refused in one line; the Python API."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from speakerlab.inference.cli import run_verify
from speakerlab.scoring.calibrate import main as calibrate
from speakerlab.sources import read_source
from tests.calibration_data import make_set
from tests.helpers import save_tiny_checkpoint, torch_free_env, write_wav


def voice(seconds: float, f0: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 20))
    return 0.3 * x / np.abs(x).max() + 0.01 * rng.standard_normal(len(t))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """An exp dir with a tiny checkpoint and a calibration of it (fitted on synthetic embeddings that carry its
    digest: what the equality of the two paths needs is the same parameters, not a good fit), two wavs, and a
    calibration of another model."""
    root = tmp_path_factory.mktemp("verify_cal")
    ckpt = save_tiny_checkpoint(root / "exp" / "checkpoints" / "c.pt")
    digest = read_source(ckpt, kind="speakerlab").digest
    assert digest
    for name, model_id in (("exp", digest), ("other", "f" * 64)):
        make_set(root, f"cal_{name}", 12, 6, seed=0, model_id=model_id)
        out = root / name / "calibration.json"
        args = ["--trials", root / f"cal_{name}/trials", "--embeddings", root / f"cal_{name}.npz"]
        assert calibrate([str(a) for a in [*args, "--durations", root / f"cal_{name}", "--out", out]]) == 0
    wavs = [write_wav(root / f"{i}.wav", voice(s, f0, i)) for i, (s, f0) in enumerate([(1.3, 140), (2.1, 150)])]
    return root, ckpt, wavs


def strs(*args) -> list:
    return [str(a) for a in args]


def test_checkpoint_verify_uses_its_exp_calibration_and_refuses_another(calibrated, capsys):
    root, ckpt, (a, b) = calibrated
    assert run_verify(strs(a, b, "--checkpoint", ckpt, "--far", "0.05")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("llr ") and str(root / "exp" / "calibration.json") in out[1]
    assert out[3].startswith("threshold llr ") and "at FAR 5 %" in out[3]
    llr, threshold = float(out[1].split()[1]), float(out[3].split()[2])
    assert out[4] == ("same speaker" if llr >= threshold else "different speakers")
    foreign = root / "other" / "calibration.json"
    assert run_verify(strs(a, b, "--checkpoint", ckpt, "--calibration-file", foreign)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "calibration of model ffffffffffff, not of this model" in err[0]


def test_far_and_prior_are_refused_where_no_calibration_decides(calibrated, tmp_path, capsys):
    """--far / --prior with a cosine threshold (--threshold, --calibration) are a usage error, and with no calibration
    found one error line: never a decision at a cosine threshold that silently ignored them."""
    root, ckpt, (a, b) = calibrated
    for extra in (["--threshold", "0.3", "--far", "0.05"], ["--calibration", "t", "--calibration-embeddings", "e.npz"]):
        with pytest.raises(SystemExit) as e:
            run_verify(strs(a, b, "--checkpoint", ckpt, *extra, "--prior", "0.2"))
        assert e.value.code == 2 and "not with --threshold or --calibration" in capsys.readouterr().err
    bare = tmp_path / "bare" / "checkpoints" / "c.pt"  # the same model, in an exp dir without a calibration
    bare.parent.mkdir(parents=True)
    bare.write_bytes(ckpt.read_bytes())
    assert run_verify(strs(a, b, "--checkpoint", bare, "--far", "0.05")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --far: no calibration of this model")
    assert run_verify(strs(a, b, "--checkpoint", bare)) == 0  # no --far: the cosine threshold, as before
    assert capsys.readouterr().out.splitlines()[1].startswith("threshold ")


@pytest.mark.slow
def test_onnx_file_carries_the_calibration_and_decides_as_the_torch_path(calibrated, tmp_path, capsys):
    """The waveform file exported from the exp dir holds its calibration; verify --onnx (in a process without torch)
    prints the LLR, probability and decision of verify --checkpoint at two FARs; the Python API gives the same."""
    from speakerlab.inference import load_embedder
    from speakerlab.inference.deploy.export import main as export
    from speakerlab.inference.verify import verify_files

    root, ckpt, (a, b) = calibrated
    onnx_file = tmp_path / "m.onnx"
    assert export(strs("--checkpoint", ckpt, "--format", "onnx", "--waveform", "--out", onnx_file)) == 0
    assert "calibration.json carried" in capsys.readouterr().err
    env = torch_free_env(tmp_path)
    for far in ("0.01", "0.2"):
        assert run_verify(strs(a, b, "--checkpoint", ckpt, "--far", far)) == 0
        torch_lines = capsys.readouterr().out.splitlines()
        script = "import sys; from speakerlab.inference.cli import verify; verify(sys.argv[1:])"
        cmd = [sys.executable, "-c", script, a, b, "--onnx", onnx_file, "--far", far]
        run = subprocess.run(strs(*cmd), env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        onnx_lines = run.stdout.splitlines()
        assert onnx_lines[0].split()[0] == "score" and onnx_lines[-1] == torch_lines[-1]  # the same decision
        for k in (0, 1, 2):  # score, llr, probability: to the exported file's 1e-4
            assert float(onnx_lines[k].split()[1]) == pytest.approx(float(torch_lines[k].split()[1]), abs=2e-3)
        assert onnx_lines[3] == torch_lines[3]  # the same stored threshold
        assert f"in {onnx_file}" in onnx_lines[1]
    api = verify_files(load_embedder(onnx=onnx_file), str(a), str(b), far=0.2)
    assert f"{api.llr:.4f}" == onnx_lines[1].split()[1] and api.same == (onnx_lines[-1] == "same speaker")
