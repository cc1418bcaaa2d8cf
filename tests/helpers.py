"""Small builders shared by the tests: wav files, Kaldi data dirs, the tiny training and fine-tuning configs and
their losses. Test files import these, never each other."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from speakerlab.models import build_model, builder_defaults
from speakerlab.models.redimnet2 import RELEASES, ReDimNet2


def write_wav(path: Path, samples: np.ndarray, sample_rate: int = 16000, subtype: str = "PCM_16") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), samples, sample_rate, subtype=subtype)
    return path


def make_data_dir(
    root: Path, utts: Dict[str, str], seconds: float = 0.5, seed: int = 0, trials: Optional[str] = None
) -> Path:
    """A data dir with one random wav per utterance: `utts` maps utt -> speaker."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    scp, u2s = [], []
    for utt, spk in sorted(utts.items()):
        wav = write_wav(root / "wav" / f"{utt}.wav", 0.1 * rng.standard_normal(int(seconds * 16000)))
        scp.append(f"{utt} {wav}\n")
        u2s.append(f"{utt} {spk}\n")
    (root / "wav.scp").write_text("".join(scp))
    (root / "utt2spk").write_text("".join(u2s))
    if trials is not None:
        (root / "trials").write_text(trials)
    return root


def console_scripts() -> Dict[str, str]:
    """pyproject.toml's [project.scripts]: command -> "module:function" (tomllib is Python >= 3.11; on 3.10 without
    the tomli package the calling test is skipped)."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def free_port() -> int:
    """A TCP port free on this host now: torchrun's master or rendezvous port, so that tests that start process
    groups at the same time (pytest-xdist workers) never meet on one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_no_traceback(*outputs: str) -> None:
    """Multi-process runs: no process may print a traceback, not even one that does not change the exit
    code (a forked loader worker's, say)."""
    for text in outputs:
        assert "Traceback" not in text, text[-3000:]


ROOT = Path(__file__).resolve().parent.parent
# The last stage number of every recipe (egs/tools/common.sh), for the tests of stage-number errors.
LAST_STAGE = int(re.search(r"^LAST_STAGE=(\d+)", (ROOT / "egs/tools/common.sh").read_text(), re.M).group(1))
# The 16-D tiny CAM++ of the checkpoint, extraction and embedding tests (tests/conftest.py's `ckpt`).
TINY_CAMPPLUS = {
    "embedding_size": 16,
    "growth_rate": 8,
    "bn_size": 2,
    "init_channels": 16,
    "m_channels": 8,
    "num_layers": [1, 1, 1],
}
TINY_MODEL = """
model:
  name: campplus
  args: {embedding_size: 32, growth_rate: 8, bn_size: 2, init_channels: 16, m_channels: 8,
         num_layers: [1, 1, 1]}
"""


def threads() -> str:
    """Threads of a subprocess a test starts (a recipe, a training run): the worker's share of the cores that
    tests/conftest.py puts in OMP_NUM_THREADS under pytest-xdist, else 2. More threads than cores between the
    workers and their subprocesses make OpenMP threads wait for each other."""
    return os.environ.get("OMP_NUM_THREADS") or "2"


TINY_CAMPPLUS = {"embedding_size": 16, "growth_rate": 8, "bn_size": 2, "init_channels": 16, "m_channels": 8}
TINY_CAMPPLUS["num_layers"] = [1, 1, 1]


def damaged_copy(src: Path, dst: Path, fill: bytes = b"\xff") -> Path:
    """`src` with 32 bytes in the middle of its largest record (a tensor's bytes) overwritten by `fill`, the zip
    structure left readable. (The middle of the file may fall in the padding between records, which no reader
    looks at.)"""
    import zipfile

    data = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        record = max(z.infolist(), key=lambda i: i.compress_size)
    offset = record.header_offset
    start = offset + 30 + int.from_bytes(data[offset + 26 : offset + 28], "little")
    start += int.from_bytes(data[offset + 28 : offset + 30], "little")  # past the local header's name and extra
    mid = start + record.compress_size // 2
    data[mid : mid + 32] = fill * 32
    dst.write_bytes(bytes(data))
    return dst


def save_tiny_checkpoint(path: Path, seed: int = 0, **fields) -> Path:
    """A checkpoint of a random CAM++ of ~15 k parameters (TINY_CAMPPLUS, 80-bin fbank, mean norm), no classifier;
    `fields`: other Checkpoint fields (step, epoch, ...)."""
    from speakerlab.checkpoint import Checkpoint, save_checkpoint
    from speakerlab.frontends import FbankConfig, FeatureSpec
    from speakerlab.models import build_model

    torch.manual_seed(seed)
    model = build_model("campplus", **TINY_CAMPPLUS).state_dict()
    ckpt = Checkpoint(
        model_name="campplus", model_args=TINY_CAMPPLUS, model=model, features=FeatureSpec(FbankConfig()), **fields
    )
    save_checkpoint(path, ckpt)
    return path


def tiny_config(tmp_path, val=True, extra=""):
    """The tiny training run of most engine tests: CAM++ of ~20 k parameters, 4 speakers x 4 utterances of
    random noise, 2 epochs of 2 steps (global batch 8 = 2 x 4), fp32 on the CPU. Returns (config, train dir)."""
    utts = {f"s{s}-{u}": f"s{s}" for s in range(4) for u in range(4)}
    train = make_data_dir(tmp_path / "train", utts, seconds=0.6)
    trials = "".join(f"s{a}-0 s{b}-1 {'target' if a == b else 'nontarget'}\n" for a in range(4) for b in range(4))
    valdir = make_data_dir(
        tmp_path / "val", {f"s{s}-{u}": f"s{s}" for s in range(4) for u in range(2)}, seconds=0.7, seed=1, trials=trials
    )
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        TINY_MODEL
        + f"""
data: {{train: {train}, val: {valdir if val else "null"}, crop_seconds: 0.5}}
loss: {{margin: 0.2, margin_start_epoch: 0, margin_warmup_epochs: 1}}
optim: {{lr: 0.05, warmup_epochs: 0.5}}
train: {{epochs: 2, global_batch_size: 8, log_every_steps: 1, save_every_steps: 1, max_consecutive_skips: 2}}
hardware: {{device: cpu, precision: fp32, per_device_batch: 4, num_workers: 0, pin_memory: false}}
{extra}"""
    )
    return cfg, train


def losses(exp):
    """step -> training loss, as the run logged it in <exp>/metrics.jsonl."""
    return {
        r["step"]: r["loss"] for r in map(json.loads, (exp / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    }


def same_weights(a: Path, b: Path) -> bool:
    """Whether checkpoints `a` and `b` are at one step with bit-equal model weights."""
    from speakerlab.checkpoint import load_checkpoint

    wa, wb = load_checkpoint(a), load_checkpoint(b)
    return wa.step == wb.step and all(torch.equal(wa.model[k], wb.model[k]) for k in wa.model)


def voice_data_dir(root: Path, speakers: int = 4, utts: int = 4, seconds: float = 0.8, seed: int = 0) -> Path:
    """A data dir a model can learn from in a few steps: speaker s is a harmonic voice of its own pitch
    (110 Hz x 1.3^s) and spectral tilt; each utterance varies the pitch by a few percent, the phases and
    the level, with noise 20 dB down. `utts` utterances per speaker, utt ids `v<s>-<u>`."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    t = np.arange(n) / 16000
    utt2spk = {}
    for s in range(speakers):
        for u in range(utts):
            f0 = 110.0 * 1.3**s * (1 + 0.03 * rng.standard_normal())
            harmonics = np.arange(1, int(7000 / f0) + 1)
            amp = harmonics ** (-0.5 - 0.3 * s)
            x = (
                amp[:, None] * np.sin(2 * np.pi * f0 * harmonics[:, None] * t + rng.uniform(0, 6.3, (len(amp), 1)))
            ).sum(0)
            x = x / np.abs(x).max() * rng.uniform(0.2, 0.5)
            x = x + 0.1 * x.std() * rng.standard_normal(n)
            write_wav(root / "wav" / f"v{s}-{u}.wav", x)
            utt2spk[f"v{s}-{u}"] = f"v{s}"
    (root / "wav.scp").write_text("".join(f"{u} {root / 'wav' / (u + '.wav')}\n" for u in sorted(utt2spk)))
    (root / "utt2spk").write_text("".join(f"{u} {utt2spk[u]}\n" for u in sorted(utt2spk)))
    return root


# One model per family runs in the fast lane (`-m "not slow"`): a 1-D TDNN, ECAPA, a 2-D ResNet and ReDimNet2;
# every registered model runs in the full suite.
FAST_MODELS = ("campplus", "ecapa_tdnn_c512", "resnet34", "redimnet2_b0")


def registry_params(names, fast=FAST_MODELS) -> list:
    """`names` as pytest params, the ones outside `fast` marked slow."""
    return [pytest.param(n, marks=() if n in fast else pytest.mark.slow) for n in names]


# Tiny random encoders of each self-supervised family (speakerlab.models.ssl): a few thousand weights,
# the published architectures otherwise (convolutional feature encoder of 7 layers, 20 ms frames).
_WAVE_ENCODER = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(16,) * 7,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)
TINY_ENCODERS = {
    "wavlm": dict(_WAVE_ENCODER, model_type="wavlm", num_buckets=32, max_bucket_distance=80),
    "wav2vec2": dict(_WAVE_ENCODER, model_type="wav2vec2"),
    "hubert": dict(_WAVE_ENCODER, model_type="hubert"),
    "wav2vec2-bert": dict(
        model_type="wav2vec2-bert",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        output_hidden_size=32,
        conv_depthwise_kernel_size=3,
        left_max_position_embeddings=8,
        right_max_position_embeddings=2,
    ),
}


def save_tiny_encoder(directory: Path, model_type: str, seed: int = 0) -> Path:
    """A tiny random encoder of `model_type` written by transformers' `save_pretrained` (config.json and
    model.safetensors), as a downloaded model directory would hold it."""
    import torch
    import transformers

    settings = dict(TINY_ENCODERS[model_type])
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(config).save_pretrained(str(directory))
    return directory


def fit_watched(run, pre, post, max_steps=None) -> None:
    """speakerlab.train.loop.fit on a built run (its monitor closed after), with `pre(optimizer, args, kwargs)` and
    `post(...)` called before and after every optimizer update."""
    from speakerlab.train.loop import fit

    run.optimizer.register_step_pre_hook(pre)
    run.optimizer.register_step_post_hook(post)
    try:
        fit(run, None, max_steps, False)
    finally:
        run.monitor.close()


class FlagsSeen(torch.overrides.TorchFunctionMode):
    """Records the TF32 switches in force at each matmul / convolution called inside the mode."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("matmul", "__matmul__", "mm", "bmm", "conv1d", "conv2d"):
            self.seen.append((name, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return func(*args, **(kwargs or {}))


# A fine-tuning run of the session's tiny model (tests/conftest.py tiny_model) on new speakers (tests/test_init.py,
# tests/test_selection.py).
FINETUNE_RUN = {
    "loss": {"margin": 0.2, "margin_start_epoch": 0, "margin_warmup_epochs": 1},
    "optim": {"lr": 0.05, "warmup_epochs": 0.5},
    "train": {"epochs": 2, "global_batch_size": 8, "log_every_steps": 1, "save_every_steps": 1},
    "hardware": {"device": "cpu", "precision": "fp32", "per_device_batch": 4, "num_workers": 0, "pin_memory": False},
}


def new_data(tmp_path, speakers=("s2", "s3", "n0", "n1")):
    """Another speaker set (two of them, s2 and s3, also pretrained ones)."""
    return make_data_dir(tmp_path / "new", {f"{s}-{u}": s for s in speakers for u in range(4)}, seconds=0.6, seed=7)


def write_config(tmp_path, train_dir, **sections) -> str:
    """A fine-tuning config without a model section (train.init brings it) plus `sections` merged in."""
    raw = json.loads(json.dumps(FINETUNE_RUN))
    raw["data"] = {"train": str(train_dir), "crop_seconds": 0.5}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = tmp_path / "finetune.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


# The fast lane exports ResNet34 at full size. The deep models export a shallow copy of themselves: the same class
# and blocks (each stage keeps its strided first block and at least one repeat), fewer repeats. What the export
# proves (every op translates, one file serves any length) is the blocks', not their count; full depth only makes
# it slower. CPU seconds to export and check, full vs this copy (then with 3 blocks in stage 3), one thread on a loaded
# 2-core machine: CAM++ 53 vs 12, Gemini DF-ResNet183 34 vs 7, ResNet221 41 vs 12. Two blocks in every stage hold the
# same set of module types as the full models (compared when the third block of stage 3 went; not re-checked here:
# building ResNet293 at full size costs seconds). At full size each is built, scripted and run in test_models.py.
DEEP = {"num_blocks": (2, 2, 2, 2)}
EXPORT_ARGS = {
    "campplus": {"num_layers": (2, 2, 2)},
    "eres2net_base": DEEP,
    "eres2net_large": DEEP,
    "eres2netv2": DEEP,
    "gemini_dfresnet114": {"depths": (2, 2, 2, 2)},
    "gemini_dfresnet183": {"depths": (2, 2, 2, 2)},
    "resnet221": DEEP,
    "resnet293": DEEP,
}


def export_copy(name: str) -> torch.nn.Module:
    """The model `name` as exported here: itself, or the shallow copy above. ReDimNet2's release sizes fix their
    stages, so their copy is the release's class and stages with one block each (b6 full: ~220 s loaded)."""
    if name.startswith("redimnet2_"):
        release = dict(RELEASES[name.split("_")[1]])
        release["stages"] = tuple((spec[0], 1, *spec[2:]) for spec in release["stages"])
        return ReDimNet2(**{**builder_defaults(name), **release})
    return build_model(name, **EXPORT_ARGS.get(name, {}))


def relative_errors(sess, embedder, lengths: np.ndarray, rng) -> tuple:
    """Random waves of `lengths` samples through a waveform file's ONNX session, each alone (batch 1) and all as
    one zero-padded batch with their lengths, against the torch path's embeddings of the same waves
    (`Embedder.embed_waves`, whole utterances: what extraction writes): the largest |onnx - torch| of each, over
    max(1, the largest |torch| value). Compared here on purpose, not by the export's own check
    (speakerlab.inference.deploy.export.waveform_errors), so that a fault in that check cannot pass its test."""
    waves = [(0.1 * rng.standard_normal(int(n))).astype(np.float32) for n in lengths]
    with torch.no_grad():
        want = embedder.embed_waves(waves, max_batch=1)
    sizes = np.asarray([w.size for w in waves], dtype=np.int64)
    rows = np.zeros((len(waves), int(sizes.max())), dtype=np.float32)
    for row, w in zip(rows, waves):
        row[: w.size] = w
    one_by_one = np.stack(
        [sess.run(None, {"wave": w[None, :], "lengths": sizes[k : k + 1]})[0][0] for k, w in enumerate(waves)]
    )
    together = sess.run(None, {"wave": rows, "lengths": sizes})[0]
    assert one_by_one.shape == together.shape == want.shape, (one_by_one.shape, together.shape, want.shape)
    unit = max(1.0, float(np.max(np.abs(want))))
    return float(np.max(np.abs(one_by_one - want))) / unit, float(np.max(np.abs(together - want))) / unit


def torch_free_env(tmp_path: Path) -> dict:
    """An environment whose Python cannot import torch: a meta-path blocker in a sitecustomize on PYTHONPATH.
    With SPEAKERLAB_TEST_MODULES=FILE set, each process appends the speakerlab modules it imported to FILE."""
    site = tmp_path / "no_torch"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import atexit, importlib.abc, os, sys\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is not installed here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "def record(path=os.environ.get('SPEAKERLAB_TEST_MODULES')):\n"
        "    if path:\n"
        "        with open(path, 'a') as f:\n"
        "            f.writelines(m + '\\n' for m in sys.modules if m.split('.')[0] == 'speakerlab')\n"
        "atexit.register(record)\n"
    )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
