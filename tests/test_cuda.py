"""GPU paths that the CPU suite cannot reach. Every test here needs CUDA and is skipped without it; on
the GPU machine run `bash tests/run.sh tests/test_cuda.py` (or the whole suite)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from speakerlab.dataio.waveform.speed import Resampler, resample_ratio
from speakerlab.features.fbank import Fbank
from speakerlab.frontends import FbankConfig
from speakerlab.models import build_model
from speakerlab.train.hardware.precision import resolve_precision
from speakerlab.train.losses.margin import AAMSoftmax
from speakerlab.train.optim.stability import NonFiniteGuard
from tests.helpers import free_port

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ROOT = Path(__file__).resolve().parent.parent


def test_autocast_and_scaler_take_the_device_type_from_a_device_string():
    """'cuda:0' is what users pass; torch.autocast wants 'cuda'."""
    for name in ("bf16", "fp16"):
        precision = resolve_precision(name, "cuda:0")
        model = build_model("campplus").cuda()
        with precision.autocast():
            out = model(torch.randn(2, 200, 80, device="cuda"))
        assert out.dtype in (torch.bfloat16, torch.float16) and torch.isfinite(out.float()).all()
        assert precision.grad_scaler().is_enabled() == (name == "fp16")


def test_fp16_grad_scaler_scale_and_the_guard_on_an_overflow():
    precision = resolve_precision("fp16", torch.device("cuda", 0))
    model = build_model("campplus").cuda()
    head = AAMSoftmax(512, 10).cuda()
    opt = torch.optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1)
    scaler = precision.grad_scaler()
    start = scaler.get_scale()
    logs = []
    guard = NonFiniteGuard(3, logs.append)
    with precision.autocast():
        emb = model(torch.randn(4, 200, 80, device="cuda"))
    loss, _ = head(emb, torch.tensor([0, 1, 2, 3], device="cuda"))
    scaler.scale(loss * 1e30).backward()  # overflows fp16 gradients at any scale
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0).item()
    bad = not (math.isfinite(loss.item()) and math.isfinite(norm))
    ok = guard.check(0, bad, loss, norm, lambda: [], fp16_overflow=lambda: scaler.get_scale() >= 1.0)
    scaler.step(opt)
    scaler.update()
    assert not ok and not math.isfinite(norm) and scaler.get_scale() < start
    assert guard.total == 0 and "fp16 gradient overflow" in logs[0]  # the scaler's business, not counted


def test_device_fbank_and_resampling_equal_the_cpu_ones_with_tf32_on():
    """hardware.tf32 on (the default) must not reach the features: TF32 would leave ~1e-3 in log-mel."""
    resolve_precision("bf16", "cuda", tf32=True)
    wave = torch.randn(3, 48000, generator=torch.Generator().manual_seed(0)) * 0.1
    cpu = Fbank(FbankConfig())(wave)
    gpu = Fbank(FbankConfig()).cuda()(wave.cuda()).cpu()
    # Measured on the CPU (this wave, against float64): float32 alone is up to 3.3e-4 off in the quietest log-mel
    # bins, 3.5e-6 on average; TF32 in the mel product (emulated) 1.4e-4 on average, over half the values off by
    # more than 1e-4. The mean tells them apart, the maximum bounds the quiet bins (the first H100 run: 2.5e-4).
    diff = (gpu - cpu).abs()
    assert diff.mean() < 2e-5 and diff.max() < 1e-3, (diff.mean().item(), diff.max().item())
    resampler = Resampler(*resample_ratio(0.9))
    torch.testing.assert_close(resampler.cuda()(wave.cuda()).cpu(), resampler.cpu()(wave), rtol=0, atol=1e-5)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # the run's setting is back


def test_tf32_is_set_explicitly_from_the_setting():
    resolve_precision("fp32", "cuda", tf32=False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    resolve_precision("fp32", "cuda", tf32=True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


@pytest.mark.slow
def test_training_on_the_card_with_bf16_and_the_auto_batch(tmp_path):
    from tests.helpers import tiny_config

    cfg, _ = tiny_config(tmp_path, val=True)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "speakerlab.train",
            "--config",
            str(cfg),
            "--exp-dir",
            str(tmp_path / "e"),
            "hardware.device=cuda",
            "hardware.precision=bf16",
            "hardware.per_device_batch=auto",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "e" / "train.log").read_text()
    assert "precision bf16 on cuda" in log and "training done" in log


@pytest.mark.slow
def test_compile_auto_checks_the_compiled_gradients_on_the_card_and_trains(tmp_path):
    """hardware.compile=auto with the tiny CAM++ in bf16: the first-batch check runs on the card, finds the compiled
    gradients the eager ones (they were 14-45 % off on an H100 with torch 2.11 before CAM++ stopped asking inductor
    for the gradients of a ceil-mode pool and an index_select: models/campplus.py), and the run finishes compiled."""
    from tests.helpers import tiny_config

    cfg, _ = tiny_config(tmp_path, val=False)
    cmd = [sys.executable, "-m", "speakerlab.train", "--config", str(cfg), "--exp-dir", str(tmp_path / "c")]
    cmd += ["hardware.device=cuda", "hardware.precision=bf16", "hardware.compile=auto"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "c" / "train.log").read_text()
    assert "speed switches: compile mode default" in log and "training done" in log
    verdicts = [line for line in log.splitlines() if "compiled model's gradients on the first batch" in line]
    assert len(verdicts) == 1, log[-3000:]
    print(verdicts[0])  # the card's verdict, for bench/gpu_session.sh's log
    assert "gradients on the first batch are the eager model's" in verdicts[0]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL DDP needs two GPUs (one process per device)")
def test_nccl_two_processes(tmp_path):
    from tests.helpers import tiny_config

    cfg, _ = tiny_config(tmp_path, val=False)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "-m",
            "speakerlab.train",
            "--config",
            str(cfg),
            "--exp-dir",
            str(tmp_path / "d"),
            "hardware.device=cuda",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 device(s)" in (tmp_path / "d" / "train.log").read_text()


# On an H100 (torch 2.11.0+cu130, 2026-11-26) compiled CAM++'s gradients were 14-45 % off eager's, as on the CPU:
# inductor's gradients of the ceil-mode pool and the index_select CAM++ used then (bench/RESULTS.md; models/campplus.py
# now computes both otherwise). Not yet run on a card since.
@pytest.mark.slow
@pytest.mark.parametrize("name, frames", [("campplus", 317), ("eres2net_base", 48)])
def test_a_compiled_training_step_equals_the_eager_one_on_the_card(name, frames):
    """Triton's compiled step against eager, in fp32 with TF32 off (bf16 would hide differences)."""
    from tests.compiled_step import compare_compiled_step

    resolve_precision("fp32", "cuda", tf32=False)
    compare_compiled_step(name, torch.device("cuda", 0), frames=frames)


def test_nccl_process_group_of_world_size_one():
    """The NCCL backend initialises and reduces on this card (a multi-GPU run's first collective)."""
    code = (
        "import torch, torch.distributed as dist\n"
        "torch.cuda.set_device(0)\n"
        "dist.init_process_group('nccl', init_method='tcp://127.0.0.1:29563', rank=0, world_size=1)\n"
        "t = torch.ones(3, device='cuda'); dist.all_reduce(t); dist.barrier()\n"
        "assert t.tolist() == [1.0, 1.0, 1.0]; dist.destroy_process_group(); print('nccl ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "nccl ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.slow
def test_fp16_training_logs_the_loss_scale(tmp_path):
    import json

    from tests.helpers import tiny_config

    cfg, _ = tiny_config(tmp_path, val=False)
    cmd = [sys.executable, "-m", "speakerlab.train", "--config", str(cfg), "--exp-dir", str(tmp_path / "f")]
    cmd += ["hardware.device=cuda", "hardware.precision=fp16", "hardware.per_device_batch=4"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "f" / "metrics.jsonl").read_text().splitlines()]
    scales = [row["loss_scale"] for row in rows if "loss_scale" in row]
    assert scales and all(s > 1.0 for s in scales)  # GradScaler's scale, not the 1.0 of bf16/fp32
    assert "precision fp16 on cuda" in (tmp_path / "f" / "train.log").read_text()


@pytest.mark.slow
def test_dino_trains_on_the_card_in_bf16(tmp_path):
    """Self-distillation (tests/test_dino.py's tiny run: multi-crop cut inside the net from the waves, KoLeo, RDINO's
    terms, the contrastive term) on the card in bf16: it finishes and every collapse scalar is finite at every step.
    No card ran it before this test (the supervised path's first card run crashed at its first step)."""
    import json

    from tests.test_dino import dino_config

    cfg, _ = dino_config(tmp_path)
    cmd = [sys.executable, "-m", "speakerlab.train", "--config", str(cfg), "--exp-dir", str(tmp_path / "d")]
    cmd += ["hardware.device=cuda", "hardware.precision=bf16"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "d" / "train.log").read_text()
    assert "precision bf16 on cuda" in log and "training done: 2 epochs, 4 steps, 0 skipped" in log
    rows = [json.loads(line) for line in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    scalars = ("loss", "teacher_entropy", "teacher_kl", "embedding_spread", "center_norm", "contrastive_loss")
    steps = [row for row in rows if "teacher_entropy" in row]
    assert len(steps) == 4 and all(math.isfinite(row[k]) for row in steps for k in scalars), steps


@pytest.mark.slow
def test_segmentation_trains_on_the_card_and_its_onnx_file_gives_its_weights_scores(tmp_path):
    """`speakerlab-segmentation-train --set device=cuda` (tests/test_segmentation.py's tiny run): it trains on the
    card, then writes CPU weights and an ONNX file (the exporter's example input is on the CPU) that give the same
    frame scores."""
    from tests.test_segmentation import assert_onnx_file_gives_the_saved_weights_scores, write_conversations

    write_conversations(tmp_path / "data")
    sets = ["steps=3", "batch_size=2", "window=1.0", "filters=8", "channels=8", "hidden=8", "device=cuda"]
    code = "import sys; from speakerlab.diarization.segmentation_train import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", code, "--data", str(tmp_path / "data"), "--out", str(tmp_path / "exp")]
    cmd += [x for s in sets for x in ("--set", s)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fp32 on cuda" in r.stderr
    saved = assert_onnx_file_gives_the_saved_weights_scores(tmp_path / "exp")
    assert {t.device.type for t in saved["state"].values()} == {"cpu"}  # loads on a machine without a card


@pytest.mark.slow
@pytest.mark.parametrize("family", ["wavlm", "wav2vec2-bert"])
def test_an_ssl_front_end_trains_on_the_card_in_bf16_and_embeds_there(family, tmp_path):
    """tests/test_ssl_train.py's tiny encoders (WavLM; w2v-BERT with its fbank front end and a LoRA through peft) on
    the card in bf16: the loss falls, and the checkpoint embeds on the card as on the CPU (cosine >= 0.999: TF32
    convolutions, cuDNN's default, are the difference). No card ran an SSL front end before this test."""
    import numpy as np

    from speakerlab.dataio.tables.embeddings import read_embeddings
    from speakerlab.inference.cli import run_embed
    from speakerlab.train.loop import main as train_main
    from tests.helpers import losses
    from tests.test_ssl_train import direct_embeddings, ssl_config

    cfg, train, overrides = ssl_config(tmp_path, family)
    exp = tmp_path / "exp"
    card = ["hardware.device=cuda", "hardware.precision=bf16"]
    assert train_main(["--config", str(cfg), "--exp-dir", str(exp), *overrides, *card]) == 0
    assert "precision bf16 on cuda" in (exp / "train.log").read_text()
    loss = [v for _, v in sorted(losses(exp).items())]
    assert len(loss) == 12 and all(map(math.isfinite, loss)) and np.mean(loss[-3:]) < np.mean(loss[:3]), loss
    ckpt = exp / "checkpoints" / "epoch_006.pt"
    direct = direct_embeddings(ckpt, train)  # on the CPU
    assert (
        run_embed([str(train / "wav.scp"), str(tmp_path / "e.npz"), "--checkpoint", str(ckpt), "--device", "cuda"]) == 0
    )
    ids, emb = read_embeddings(tmp_path / "e.npz")
    for i, utt in enumerate(ids):
        cosine = emb[i] @ direct[utt] / (np.linalg.norm(emb[i]) * np.linalg.norm(direct[utt]))
        assert cosine >= 0.999, (utt, cosine)
