"""egs/tools/env.sh: pip runs only for what is missing, from SPEAKERLAB_WHEELS alone when it is set."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def source_env(tmp_path, requirements: str, **extra):
    """Source env.sh in an active "virtualenv" whose `python` is this interpreter behind a wrapper that
    records every `python -m pip ...` instead of running it."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "pip.log"
    wrapper = bin_dir / "python"
    wrapper.write_text(
        f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {log}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    (tmp_path / "reqs.txt").write_text(requirements)
    env = {**os.environ, "VIRTUAL_ENV": str(tmp_path / "venv"), "PATH": f"{bin_dir}:{os.environ['PATH']}", **extra}
    env.pop("CONDA_PREFIX", None)
    env["SPEAKERLAB_REQUIREMENTS"] = os.path.relpath(tmp_path / "reqs.txt", ROOT)
    r = subprocess.run(
        ["bash", "-c", f'source {ROOT}/egs/tools/env.sh && echo "PYTHONPATH=${{PYTHONPATH:-}}"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return (log.read_text() if log.exists() else ""), r.stdout


def test_nothing_is_installed_when_everything_is_importable(tmp_path):
    pip, _ = source_env(tmp_path, "-r requirements.txt\nnumpy>=1.0\n")
    assert pip == ""


def test_only_the_missing_requirements_are_installed_from_the_wheels_dir(tmp_path):
    wheels = tmp_path / "wheels"
    reqs = "numpy>=1.0\nspeakerlab-absent-package>=1.0\nnumpy-too-new==999.0\ntorch>=99.0\n"
    pip, out = source_env(tmp_path, reqs, SPEAKERLAB_WHEELS=str(wheels))
    assert pip.splitlines() == [
        f"-m pip install -q --no-compile --no-index --find-links {wheels} speakerlab-absent-package>=1.0 "
        "numpy-too-new==999.0 torch>=99.0"
    ]
    pip, out = source_env(tmp_path / "online", reqs)
    assert "--no-index" not in pip and "speakerlab-absent-package>=1.0" in pip
