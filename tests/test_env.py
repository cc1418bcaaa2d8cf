"""egs/tools/env.sh: pip runs only for what is missing, from SPEAKERLAB_WHEELS alone when it is set;
speakerlab itself is installed only when missing (also offline, from the wheels dir), and another
checkout's install is left alone while this checkout's code runs."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = re.findall(r"^(speakerlab-[\w-]+) =", (ROOT / "pyproject.toml").read_text(), re.M)


def source_env(tmp_path, requirements: str, root: Path = ROOT, scripts=SCRIPTS, then: str = "", rc: int = 0, **extra):
    """Source `root`/egs/tools/env.sh in an active "virtualenv" whose `python` is this interpreter behind a
    wrapper that records every `python -m pip ...` instead of running it, and whose bin dir holds the
    console scripts `scripts`; then run `then`. -> (the recorded pip calls, the finished process)."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = tmp_path / "pip.log"
    wrapper = bin_dir / "python"
    wrapper.write_text(
        f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {log}; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    for name in scripts:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "reqs.txt").write_text(requirements)
    env = {**os.environ, "VIRTUAL_ENV": str(tmp_path / "venv"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("CONDA_PREFIX", None)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # pip's --compile and the bytecode step follow it: set per test
    env.update(extra)
    env["SPEAKERLAB_REQUIREMENTS"] = os.path.relpath(tmp_path / "reqs.txt", root)
    r = subprocess.run(
        ["bash", "-c", f'source {root}/egs/tools/env.sh && echo "PYTHONPATH=${{PYTHONPATH:-}}" && {then or ":"}'],
        cwd=tmp_path,  # not the checkout, which `python -c` would import from
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == rc, r.stderr
    return (log.read_text() if log.exists() else ""), r


def said(r) -> list:
    """env.sh's log lines (`[HH:MM:SS] env: ...`) of a finished run, without the prefix."""
    return [line.split("] env: ", 1)[1] for line in r.stderr.splitlines() if "] env: " in line]


def test_nothing_is_installed_when_everything_is_importable(tmp_path):
    pip, _ = source_env(tmp_path, "-r requirements.txt\nnumpy>=1.0\n")
    assert pip == ""


def test_speakerlab_is_installed_again_when_a_console_script_is_missing(tmp_path):
    pip, r = source_env(tmp_path, "numpy>=1.0\n", scripts=SCRIPTS[1:])
    assert pip.splitlines() == [f"-m pip install -q --no-compile --no-deps -e {ROOT}"]
    assert "installing speakerlab (editable)" in r.stderr


def test_without_bytecode_caching_pip_compiles_and_an_uncompiled_torch_is_compiled_once(tmp_path):
    """PYTHONDONTWRITEBYTECODE set: pip installs with --compile, and a torch without bytecode (here a stand-in
    package first on the path) has its site compiled, once; unset, neither (Python caches what it imports)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("x = 1\n")
    pyc = site / "torch" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc"
    pip, r = source_env(tmp_path / "cached", "numpy>=1.0\n", scripts=SCRIPTS[1:], PYTHONPATH=str(site))
    assert pip.split()[:5] == ["-m", "pip", "install", "-q", "--no-compile"] and not pyc.exists()
    assert not [line for line in said(r) if "bytecode" in line]
    extra = {"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    pip, r = source_env(tmp_path / "uncached", "numpy>=1.0\n", scripts=SCRIPTS[1:], **extra)
    assert pip.split()[:5] == ["-m", "pip", "install", "-q", "--compile"] and pyc.exists()
    assert [line for line in said(r) if "bytecode" in line] == [
        f"compiling the bytecode of {site} once (PYTHONDONTWRITEBYTECODE is set: else every process compiles torch "
        "again)"
    ]
    _, r = source_env(tmp_path / "again", "numpy>=1.0\n", **extra)
    assert not [line for line in said(r) if "bytecode" in line]


def other_checkout(tmp_path) -> Path:
    """A second checkout of this tree (what env.sh and the imports read)."""
    other = tmp_path / "other"
    shutil.copytree(ROOT / "speakerlab", other / "speakerlab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "egs" / "tools", other / "egs" / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy(ROOT / name, other)
    return other


def test_another_checkouts_install_is_left_alone_and_this_checkouts_code_runs(tmp_path):
    """This Python's speakerlab is ROOT (the suite's own install); sourced from a second checkout, env.sh
    installs nothing, says so in one line naming both and how to switch, and that checkout's code runs."""
    other = other_checkout(tmp_path)
    pip, r = source_env(
        tmp_path, "numpy>=1.0\n", root=other, then="python -c 'import speakerlab; print(speakerlab.__file__)'"
    )
    assert pip == ""
    lines = said(r)
    assert len(lines) == 1 and str(ROOT) in lines[0] and str(other) in lines[0]
    assert f"pip install --no-deps -e {other}" in lines[0]
    assert r.stdout.splitlines()[-1] == str(other / "speakerlab" / "__init__.py")


def test_3d_speakers_package_in_the_environment_is_refused_in_one_line(tmp_path):
    """PyPI's `speakerlab` (3D-Speaker's toolkit) also imports as speakerlab: env.sh says to use another
    environment instead of installing this checkout beside it."""
    site = tmp_path / "site"
    (site / "speakerlab").mkdir(parents=True)
    (site / "speakerlab" / "__init__.py").write_text("")
    (site / "speakerlab-0.0.6.dist-info").mkdir()
    (site / "speakerlab-0.0.6.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: speakerlab\nVersion: 0.0.6\nSummary: 3D-Speaker is an open-source toolkit\n"
    )
    pip, r = source_env(tmp_path, "numpy>=1.0\n", rc=2, PYTHONPATH=str(site))
    assert pip == ""
    assert said(r) == [
        f"error: this environment's speakerlab ({site}) is 3D-Speaker's package (PyPI's speakerlab), another "
        "project that also imports as speakerlab; use a separate virtual environment for this checkout"
    ]


def test_another_checkout_with_a_console_script_the_environment_lacks_is_refused(tmp_path):
    other = other_checkout(tmp_path)
    pip, r = source_env(tmp_path, "numpy>=1.0\n", root=other, scripts=SCRIPTS[:-1], rc=2)
    assert pip == ""
    assert said(r) == [
        f"error: this checkout's console script(s) {SCRIPTS[-1]} are not in {tmp_path / 'venv' / 'bin'}, whose "
        f"speakerlab is {ROOT}; switch it to this checkout with: {tmp_path / 'venv' / 'bin' / 'python'} -m pip "
        f"install --no-deps -e {other} (or use another environment)"
    ]


def test_offline_install_without_a_build_backend_in_the_wheels_dir_says_how_to_get_one(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pip, r = source_env(tmp_path, "numpy>=1.0\n", scripts=[], rc=2, SPEAKERLAB_WHEELS=str(wheels))
    assert pip == ""
    assert said(r) == [
        f"error: {wheels} has no setuptools wheel to build speakerlab with; "
        f"bash bench/fetch_gpu_wheels.sh {wheels} adds it"
    ]


@pytest.mark.slow  # builds and installs wheels: 20 s
def test_only_the_missing_requirements_are_installed_from_the_wheels_dir(tmp_path):
    wheels = tmp_path / "wheels"
    reqs = "numpy>=1.0\nspeakerlab-absent-package>=1.0\nnumpy-too-new==999.0\ntorch>=99.0\n"
    pip, _ = source_env(tmp_path, reqs, SPEAKERLAB_WHEELS=str(wheels))
    assert pip.splitlines() == [
        f"-m pip install -q --no-compile --no-index --find-links {wheels} speakerlab-absent-package>=1.0 "
        "numpy-too-new==999.0 torch>=99.0"
    ]
    pip, _ = source_env(tmp_path / "online", reqs)
    assert "--no-index" not in pip and "speakerlab-absent-package>=1.0" in pip


def wheel_of_installed(name: str, dest: Path) -> Path:
    """The installed distribution `name` packed back into a wheel in `dest` (its files and dist-info as
    pip laid them out): a build backend for the offline install without network."""
    dist = metadata.distribution(name)
    tag = re.search(r"^Tag: (\S+)$", dist.read_text("WHEEL"), re.M).group(1)
    path = dest / f"{dist.metadata['Name']}-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f in dist.files:
            if "__pycache__" not in f.parts and not str(f).startswith(".."):
                z.write(dist.locate_file(f), str(f))
    return path


@pytest.mark.slow  # a venv and an editable install: 30-60 s
def test_the_offline_mode_installs_the_console_scripts_from_the_wheels_dir(tmp_path):
    """A fresh venv that has the requirements (this interpreter's, through a .pth) but no speakerlab: with
    SPEAKERLAB_WHEELS=DIR and no index at all, env.sh installs speakerlab, built by DIR's setuptools, and
    the recipes' console scripts run."""
    try:
        setuptools = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        pytest.skip("this Python has no setuptools to pack into the wheels dir")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel_of_installed("setuptools", wheels)
    if tuple(int(v) for v in setuptools.split(".")[:2]) < (70, 1):
        try:
            wheel_of_installed("wheel", wheels)
        except metadata.PackageNotFoundError:
            pytest.skip(f"setuptools {setuptools} builds editable installs only with the wheel package, not here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site, *own = subprocess.run(
        [python, "-c", "import sys, sysconfig; print(sysconfig.get_path('purelib'), *sys.path, sep='\\n')"],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    # What this interpreter imports from beyond the venv's own path (its stdlib), but the checkout. A .pth
    # line adds a dir, not the .pth files in it, so the suite's own editable speakerlab stays out too.
    deps = [p for p in sys.path if p not in own and Path(p).is_dir() and not (Path(p) / "speakerlab").is_dir()]
    (Path(site) / "deps.pth").write_text("".join(f"{p}\n" for p in deps))
    if subprocess.run([python, "-c", "import speakerlab"], cwd="/", capture_output=True).returncode == 0:
        pytest.skip("this interpreter's site-packages hold a speakerlab: the venv would not lack it")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "CONDA_PREFIX")}
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
        SPEAKERLAB_WHEELS=str(wheels),
        PIP_CONFIG_FILE=os.devnull,  # no index or find-links of this machine's pip configuration
        OMP_NUM_THREADS="1",
    )
    r = subprocess.run(
        ["bash", "-c", f"source {ROOT}/egs/tools/env.sh && command -v speakerlab-train && speakerlab-train --help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "installing speakerlab (editable)" in r.stderr and f"(build backend from {wheels})" in r.stderr
    assert r.stdout.splitlines()[0] == str(venv / "bin" / "speakerlab-train")
    assert "usage: speakerlab-train" in r.stdout
    assert all((venv / "bin" / name).exists() for name in SCRIPTS)
