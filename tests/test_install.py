"""Installing this project: every `pip install` line users read installs this project (from the clone or a
wheel built from it), never PyPI's `speakerlab` (3D-Speaker's package); the distribution names are ours."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ROOT, write_wav

TINY = ROOT / "tests" / "data" / "legacy_checkpoint" / "campplus_tiny.pt"

# Options of `pip install` whose next word is a value, not a requirement.
VALUE_OPTIONS = {"-r", "--requirement", "-c", "--constraint", "--index-url", "-i", "--extra-index-url", "-f"}
VALUE_OPTIONS |= {"--find-links", "-t", "--target", "--prefix", "--root", "-w"}


def install_lines():
    """(file:line, the words after `pip install`) of README.md, docs/, the recipes' READMEs, the code's messages."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "egs").glob("*/README.md"))]
    files += sorted((ROOT / "speakerlab").rglob("*.py")) + sorted((ROOT / "egs" / "tools").glob("*.sh"))
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"pip install ([^`\n]*)", line):
                # The command ends at a comment, a closing quote or parenthesis, `;` or `&&`.
                command = re.split(r"\s#|[`);\"]|&&|, | or | then | in ", m.group(1))[0]
                yield f"{path.relative_to(ROOT)}:{number}", command


def requirement_names(command: str):
    """The distribution names a `pip install` command asks an index for (paths and wheels are not names)."""
    words = shlex.split(command.replace("'", " ").replace('"', " "))
    skip = False
    for word in words:
        if skip or word.startswith("-"):
            skip = word in VALUE_OPTIONS
            continue
        if word.startswith((".", "/", "~", "<", "$")) or word.endswith(".whl") or "/" in word:
            continue  # a path: the clone, ./runtime, a built wheel
        yield re.split(r"[\[<>=!~; ]", word, maxsplit=1)[0].lower().replace("_", "-")


def project_name(pyproject) -> str:
    """[project].name of a pyproject.toml (tomllib is Python >= 3.11; the project supports 3.10)."""
    return re.search(r'^\[project\]\n(?:.*\n)*?name = "([^"]+)"', pyproject.read_text(), re.M).group(1)


def test_the_distributions_are_not_named_like_3d_speakers_package():
    assert project_name(ROOT / "pyproject.toml") == "speakerlab-recipes"
    assert project_name(ROOT / "runtime" / "pyproject.toml") == "speakerlab-recipes-runtime"


def test_every_install_line_installs_this_project_not_the_one_named_speakerlab_on_pypi():
    lines = list(install_lines())
    assert len(lines) >= 10  # README, docs and the error messages do have install lines
    ours = []
    for where, command in lines:
        for name in requirement_names(command):
            # speakerlab is 3D-Speaker's on PyPI; ours are on no index: from the clone or a wheel only.
            assert name != "speakerlab" and not name.startswith("speakerlab-recipes"), f"{where}: pip install {command}"
        ours += [where for word in ("-e .", "./runtime", ".whl") if word in command]
    # README says how to install the full project and the runtime, docs/deployment.md the runtime.
    assert any(w.startswith("README.md") for w in ours) and any(w.startswith("docs/deployment.md") for w in ours)


@pytest.mark.parametrize(
    "command, names",
    [
        ("speakerlab[runtime]", ["speakerlab"]),
        ("--no-deps speakerlab", ["speakerlab"]),
        ('"numpy>=1.24" "scipy>=1.10"', ["numpy", "scipy"]),
        ("-e '.[diarization]'", []),
        ("./runtime", []),
        ("dist/speakerlab_recipes-0.1.0-py3-none-any.whl", []),
        ("torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu", ["torch"]),
    ],
)
def test_requirement_names_reads_what_an_index_is_asked_for(command, names):
    assert list(requirement_names(command)) == names


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment (no system site-packages: no torch) with `pip install ./runtime` in it, from
    the index and wheels this machine's pip is configured with."""
    venv = tmp_path_factory.mktemp("runtime") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", str(ROOT / "runtime")]
    run = subprocess.run(pip, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return venv


@pytest.mark.slow  # a venv and pip install of numpy, scipy, soundfile, onnxruntime: ~50 s; an export: ~20 s
def test_the_runtime_installs_without_torch_and_embeds_and_diarizes_like_the_torch_path(runtime_venv, tmp_path):
    """`pip install ./runtime` into a fresh venv: no torch there; a waveform ONNX file exported here (torch path)
    embeds (speakerlab-embed --onnx) to the torch path's embeddings and diarizes (speakerlab-diarize --onnx) to
    its RTTM; torch commands and too-short audio are one line each; the Python API of docs/deployment.md."""
    from speakerlab.diarization.cli import run as diarize
    from speakerlab.inference.cli import run_embed
    from speakerlab.inference.deploy.export import main as export

    bin_dir = runtime_venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", OMP_NUM_THREADS="1")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert run("python", "-c", "import torch").returncode != 0
    assert run("python", "-c", "import speakerlab; print(speakerlab.__file__)").stdout.startswith(str(runtime_venv))
    for command in ("speakerlab-export", "speakerlab-train", "speakerlab-extract"):
        done = run(command, "--help")
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
        assert done.stderr.startswith(f"error: {command} needs torch; this is speakerlab-recipes-runtime")

    model = tmp_path / "tiny.onnx"
    assert export(["--checkpoint", str(TINY), "--format", "onnx", "--waveform", "--out", str(model)]) == 0
    rng = np.random.default_rng(5)
    scp = tmp_path / "wav.scp"
    scp.write_text(
        "".join(
            f"u{i} {write_wav(tmp_path / f'u{i}.wav', 0.1 * rng.standard_normal(int(1.3 * r)), r)}\n"
            for i, r in enumerate((8000, 16000, 44100))
        )
    )
    done = run("speakerlab-embed", str(scp), "onnx.npz", "--onnx", str(model))
    assert done.returncode == 0, done.stderr
    assert run_embed([str(scp), str(tmp_path / "torch.npz"), "--checkpoint", str(TINY)]) == 0
    np.testing.assert_allclose(
        np.load(tmp_path / "onnx.npz")["embeddings"], np.load(tmp_path / "torch.npz")["embeddings"], atol=1e-4
    )

    # Two alternating "speakers" (tones of two pitches in noise) with pauses: energy VAD, AHC.
    t = np.arange(24000) / 16000
    turns = [0.3 * np.sin(2 * np.pi * f * t) + 0.02 * rng.standard_normal(t.size) for f in (180, 420, 180, 420)]
    wave = np.concatenate([np.concatenate([x, np.zeros(6400)]) for x in turns])
    conv = write_wav(tmp_path / "conv.wav", wave)
    options = ["--vad", "energy", "--clustering", "ahc"]
    done = run("speakerlab-diarize", str(conv), "--onnx", str(model), *options, "--rttm", "onnx.rttm")
    assert done.returncode == 0, done.stderr
    assert diarize([str(conv), "--checkpoint", str(TINY), *options, "--rttm", str(tmp_path / "torch.rttm")]) == 0
    ours = (tmp_path / "onnx.rttm").read_text()
    assert ours.startswith("SPEAKER conv 1 ") and ours == (tmp_path / "torch.rttm").read_text()
    silero = run("speakerlab-diarize", str(conv), "--onnx", str(model), "--rttm", "x.rttm")
    assert silero.returncode == 2 and silero.stderr.startswith("error: the Silero VAD needs the silero-vad package")

    write_wav(tmp_path / "short.wav", np.full(300, 0.1))
    api = (
        "import sys\n"
        "from speakerlab.inference import load_embedder, load_onnx\n"
        "e = load_embedder(onnx=sys.argv[1], resample=False)\n"
        "print(type(e).__name__, load_onnx(sys.argv[1]).embed_waves([e.read('u1.wav')]).shape)\n"
        "e.embed_waves([e.read('short.wav')])\n"
    )
    done = run("python", "-c", api, str(model))
    assert done.stdout.split() == ["OnnxEmbedder", "(1,", "16)"], done.stderr
    assert done.stderr.strip().endswith(
        "ValueError: wave of 300 samples is too short for one frame of 400 samples (snip_edges=True)"
    )
