"""Every command of pyproject.toml's [project.scripts] that writes a file, run with that output on a character device
of the test's own (the null device's numbers, made by mknod in tmp_path; a FIFO with a reader where mknod is not
allowed): afterwards the path is still that device (never renamed over, never removed), and the command either wrote
through it (exit 0) or refused it (exit 2) in one `error:` line naming it, without a traceback. Running as root (most
containers and CI), a rename onto /dev/null would replace the machine's null device with a plain file.

A console script with no entry in CASES and none in WRITES_NO_FILE fails the test: a new command must say here how
its outputs behave."""

from __future__ import annotations

import importlib
import os
import shutil
import stat
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Tuple

import numpy as np
import pytest

from tests.helpers import console_scripts, make_data_dir, write_wav

THROUGH, REFUSED = "written through", "refused"


class Inputs(NamedTuple):
    """What the commands read: a 3-speaker data dir with trials, its embeddings, a random tiny CAM++ checkpoint, an
    exp dir with two epoch checkpoints, a 4 s recording, an RTTM and the tiny training config."""

    data: Path
    emb: Path
    ckpt: Path
    exp: Path
    wav: Path
    rttm: Path
    config: Path

    @property
    def trials(self) -> Path:
        return self.data / "trials"


Argv = Callable[[Inputs, str], List[str]]


def _corpus(option: str) -> List[Tuple[str, str, Argv]]:
    """A corpus command's steps with the device as their output folder (`option`: prepare's)."""
    return [
        ("download --download-dir", REFUSED, lambda i, d: ["download", "--download-dir", d]),
        ("extract --raw-dir", REFUSED, lambda i, d: ["extract", "--raw-dir", d]),
        (f"prepare {option}", REFUSED, lambda i, d: ["prepare", option, d]),
    ]


def _scored(i: Inputs) -> List[str]:
    return ["--embeddings", str(i.emb), "--trials", str(i.trials)]


def _model(i: Inputs) -> List[str]:
    return ["--checkpoint", str(i.ckpt), "--device", "cpu"]


# command -> [(which output, what must happen, argv builder(inputs, device path))]
CASES: Dict[str, List[Tuple[str, str, Argv]]] = {
    "speakerlab-voxceleb": _corpus("--data"),
    "speakerlab-cnceleb": _corpus("--data"),
    "speakerlab-voxblink2": _corpus("--data"),
    "speakerlab-3dspeaker": _corpus("--data"),
    "speakerlab-musan-rirs": _corpus("--out"),
    "speakerlab-voxconverse": _corpus("--data"),
    "speakerlab-ami": [
        (
            "prepare --data",
            REFUSED,
            lambda i, d: ["prepare", "--ami-root", str(i.data), "--setup", str(i.data), "--data", d],
        )
    ],
    "speakerlab-folder": [("--data", REFUSED, lambda i, d: ["--root", str(i.data / "wav"), "--data", d])],
    "speakerlab-synth": [("--out", REFUSED, lambda i, d: ["--out", d])],
    "speakerlab-synth-tree": [("--out", REFUSED, lambda i, d: ["--corpus", str(i.data), "--out", d])],
    "speakerlab-synth-conversations": [("--out", REFUSED, lambda i, d: ["--data", str(i.data), "--out", d])],
    "speakerlab-segmentation-train": [("--out", REFUSED, lambda i, d: ["--data", str(i.data), "--out", d])],
    "speakerlab-prepare": [("--data", REFUSED, lambda i, d: ["--data", d])],
    "speakerlab-shards": [("--out", REFUSED, lambda i, d: ["--data", str(i.data), "--out", d])],
    "speakerlab-noise-bank": [("--out", REFUSED, lambda i, d: ["--lists", str(i.data), "--out", d])],
    "speakerlab-feature-store": [("--data", REFUSED, lambda i, d: ["--data", d])],
    "speakerlab-train": [("--exp-dir", REFUSED, lambda i, d: ["--config", str(i.config), "--exp-dir", d])],
    "speakerlab-average": [("--out", THROUGH, lambda i, d: ["--exp-dir", str(i.exp), "--out", d])],
    "speakerlab-pseudo-label": [
        (
            "--out",
            REFUSED,
            lambda i, d: ["--embeddings", str(i.emb), "--data", str(i.data), "--out", d, "--clusters", "2"],
        )
    ],
    "speakerlab-extract": [
        ("--out", THROUGH, lambda i, d: [*_model(i), "--data", str(i.data), "--out", d, "--num-workers", "0"]),
        ("--out --kaldi", THROUGH, lambda i, d: [*_model(i), "--data", str(i.data), "--out", d, "--kaldi"]),
    ],
    "speakerlab-export": [
        ("--out (onnx)", REFUSED, lambda i, d: [*_model(i), "--format", "onnx", "--out", d]),
        ("--out (torchscript)", REFUSED, lambda i, d: [*_model(i), "--format", "torchscript", "--out", d]),
    ],
    "speakerlab-baseline": [("--out (a prefix)", THROUGH, lambda i, d: ["--data", str(i.data), "--out", d])],
    "speakerlab-embed": [
        ("OUT .npz", THROUGH, lambda i, d: [*_model(i), str(i.data / "wav.scp"), d]),
        ("OUT .ark", THROUGH, lambda i, d: [*_model(i), str(i.data / "wav.scp"), d]),
    ],
    "speakerlab-stress": [
        ("--out", THROUGH, lambda i, d: [*_model(i), "--data", str(i.data), "--conditions", "clean", "--out", d]),
        ("--json", THROUGH, lambda i, d: [*_model(i), "--data", str(i.data), "--conditions", "clean", "--json", d]),
    ],
    "speakerlab-enrol": [("gallery", REFUSED, lambda i, d: ["add", d, "spk", str(i.wav), *_model(i)])],
    "speakerlab-plda": [("--out", REFUSED, lambda i, d: [*_model(i), "--data", str(i.data), "--out", d])],
    "speakerlab-score": [
        ("--out (a prefix)", THROUGH, lambda i, d: [*_scored(i), "--out", d]),
        ("--out (a folder)", REFUSED, lambda i, d: [*_scored(i), str(i.trials), "--names", "a", "b", "--out", d]),
        ("--table", THROUGH, lambda i, d: [*_scored(i), "--out", f"{d}-scores", "--table", d]),
    ],
    "speakerlab-calibrate": [
        ("--out", THROUGH, lambda i, d: ["--trials", str(i.trials), "--embeddings", str(i.emb), "--out", d])
    ],
    "speakerlab-diarize": [
        (
            "--rttm",
            THROUGH,
            lambda i, d: [*_model(i), "--vad", "energy", "--num-speakers", "2", "--rttm", d, str(i.wav)],
        ),
        (
            "--json",
            THROUGH,
            lambda i, d: [*_model(i), "--vad", "energy", "--num-speakers", "2", "--json", d, str(i.wav)],
        ),
    ],
    "speakerlab-der": [("--out", THROUGH, lambda i, d: ["--ref", str(i.rttm), "--hyp", str(i.rttm), "--out", d])],
}

# The device's name where a command takes its output's format from it (the default: `out`).
DEVICE_NAMES = {("speakerlab-embed", "OUT .npz"): "out.npz", ("speakerlab-embed", "OUT .ark"): "out.ark"}

# Commands that write no file (what they say goes to stdout / stderr): why, per command.
WRITES_NO_FILE = {
    "speakerlab-which": "prints what a model file is",
    "speakerlab-verify": "prints the score and the decision",
    "speakerlab-identify": "prints a name per file",
    "speakerlab-scaled": "prints overrides",
    "speakerlab-cluster": "prints shell assignments",
}


def test_every_command_is_listed():
    scripts = console_scripts()
    missing = sorted(set(scripts) - set(CASES) - set(WRITES_NO_FILE))
    assert not missing, f"add these commands to CASES (or WRITES_NO_FILE) of {__file__}: {missing}"
    assert not sorted((set(CASES) | set(WRITES_NO_FILE)) - set(scripts)), "entries of commands that are gone"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, ckpt, tiny_corpus) -> Inputs:
    from speakerlab.dataio.tables.embeddings import write_embeddings

    root = tmp_path_factory.mktemp("device_inputs")
    utts = {f"s{s}-{u}": f"s{s}" for s in range(3) for u in range(3)}
    trials = "".join(
        f"s{a}-0 s{b}-{u} {'target' if a == b else 'nontarget'}\n" for a in range(3) for b in range(3) for u in (1, 2)
    )
    data = make_data_dir(root / "data", utts, seconds=0.5, trials=trials)
    rng = np.random.default_rng(0)
    # Embeddings a calibration can be fitted on: each speaker's around a direction of its own.
    centres = rng.standard_normal((3, 16))
    emb = np.stack([centres[int(u[1])] + 0.7 * rng.standard_normal(16) for u in sorted(utts)]).astype(np.float32)
    write_embeddings(root / "emb.npz", sorted(utts), emb, model_id="device-test")
    exp = root / "exp" / "checkpoints"
    exp.mkdir(parents=True)
    for n in (1, 2):
        shutil.copy(ckpt, exp / f"epoch_{n:03d}.pt")
    t = np.arange(64000) / 16000  # 4 s: two "talkers" of their own pitch, 2 s each
    wav = write_wav(root / "talk.wav", 0.3 * np.sin(2 * np.pi * np.where(t < 2, 140, 310) * t))
    rttm = root / "ref.rttm"
    rttm.write_text(
        "SPEAKER talk 1 0.000 2.000 <NA> <NA> a <NA> <NA>\nSPEAKER talk 1 2.000 2.000 <NA> <NA> b <NA> <NA>\n"
    )
    return Inputs(data, root / "emb.npz", ckpt, exp.parent, wav, rttm, tiny_corpus[0])


class Device(NamedTuple):
    path: Path
    is_kind: Callable[[int], bool]
    done: Callable[[], None]


def _device(path: Path) -> Device:
    """A character device at `path` (1, 3: what /dev/null is); a FIFO drained by a thread where mknod is not allowed
    (`done` then releases a reader that nothing opened the FIFO for)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return Device(path, stat.S_ISCHR, lambda: None)
    except PermissionError:
        pass
    os.mkfifo(path)

    def drain():
        with open(path, "rb") as f:
            while f.read(1 << 16):
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def done():
        while reader.is_alive():  # nothing wrote: open it once for writing so that the reader sees its end
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            reader.join(0.05)

    return Device(path, stat.S_ISFIFO, done)


def _run(command: str, argv: List[str]) -> int:
    module, name = console_scripts()[command].split(":")
    main = getattr(importlib.import_module(module), name)
    saved = sys.argv
    sys.argv = [command, *argv]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    finally:
        sys.argv = saved
    return int(code or 0)


@pytest.mark.parametrize(
    "command, which, expect, argv",
    [pytest.param(c, w, e, a, id=f"{c} {w}") for c, cases in CASES.items() for w, e, a in cases],
)
def test_an_output_on_a_device_stays_a_device(command, which, expect, argv, inputs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a command writes by default lands here
    dev = _device(tmp_path / DEVICE_NAMES.get((command, which), "out"))
    try:
        code = _run(command, argv(inputs, str(dev.path)))
    finally:
        dev.done()
    out, err = capsys.readouterr()
    assert dev.is_kind(os.stat(dev.path).st_mode), f"{command} {which}: {dev.path} is no longer a device"
    assert "Traceback" not in out + err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith(("error:", f"{command}: error:"))]  # 2nd: argparse
    if expect == THROUGH:
        assert code == 0 and not errors, f"{command} {which}: exit {code}\n{err[-2000:]}"
    else:
        assert code == 2 and len(errors) == 1 and str(dev.path) in errors[0], f"{command} {which}: exit {code}\n{err}"
