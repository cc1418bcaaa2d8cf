"""Data pipeline cost per 3 s training sample with speed perturbation + reverberation + noise.

    nice .venv/bin/python bench/data_pipeline.py [--samples 64] [--batch 128] [--repeats 3]

(a) per-sample CPU pipeline in the style of other recipes, all in the loader worker: read the float
    crop (crop x factor) and the noise crop and the RIR file from disk, scipy.signal.resample_poly,
    scipy.signal.fftconvolve with the RIR (direct-path aligned, power kept), mixing at the SNR, Kaldi
    fbank + mean normalisation of the one sample.
(b) ours: the loader worker reads the int16 crop and draws (speakerlab.dataio.loaders.batches.CropDataset +
    collate, noise and RIR audio sliced from the memory-mapped bank); the batched arithmetic
    (speakerlab.train.inputs.pipeline.InputPipeline: speed, RIR convolution, mixing, fbank) runs on the training
    device, here timed on this machine's CPU with a batch of `--batch`.
Worker-side figures run with one torch thread, as in a DataLoader worker. Every figure is the best
of `--repeats` (the machine is shared: the best run is the least disturbed one). The inputs (speech,
noise, RIRs) are synthetic files written to a temporary folder. With CUDA present it also trains
CAM++ for a few steps at full speed and reports the fraction of step time spent waiting for data.
(c) the channel augmentation of `augment.channel_prob`, each kind on every crop, on top of (b)'s worker item; then
    the augment section of `--channel-config` (default conf/mini/augment_channel.yaml: its channel_prob, channel_mix,
    short_prob), the cost per sample a training run with that overlay pays in the workers.
The load average is printed before and after (a shared machine's figures mean little without it).
The last line reads `worker CPU ms/sample: per-sample pipeline A, ours B, ratio B/A = R`.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from speakerlab.augment_settings import CHANNEL_KINDS, AugmentSettings  # noqa: E402
from speakerlab.dataio.loaders.batches import CropDataset, collate  # noqa: E402
from speakerlab.dataio.waveform.augment import Augmenter, add_at_snr, reverberate  # noqa: E402
from speakerlab.dataio.waveform.degrade import ChannelAugment  # noqa: E402
from speakerlab.dataio.waveform.noise_bank import NoiseBank, build_bank  # noqa: E402
from speakerlab.dataio.waveform.speed import input_length, resample_ratio  # noqa: E402
from speakerlab.features.fbank import Fbank, mean_normalize  # noqa: E402
from speakerlab.features.spec import KaldiFeatures  # noqa: E402
from speakerlab.frontends import FbankConfig  # noqa: E402
from speakerlab.settings import build_settings  # noqa: E402
from speakerlab.train.inputs.pipeline import InputPipeline  # noqa: E402

SR, CROP = 16000, 3 * 16000
ROOT = Path(__file__).resolve().parent.parent
FACTORS = (0.9, 1.1)  # every sample is sped up (the worst case of speed_prob 1)


def write_inputs(root: Path, num_utts: int):
    """Speech (8 s each), MUSAN-like noise (20 s) and 1 s RIRs as PCM_16 files, with their lists."""
    rng = np.random.default_rng(0)
    t = np.arange(8 * SR) / SR
    utts = []
    for i in range(num_utts):
        # a crude voiced signal: a few harmonics of a wandering F0, amplitude-modulated, plus noise
        f0 = 120 + 40 * np.sin(2 * np.pi * 0.3 * t + i)
        phase = 2 * np.pi * np.cumsum(f0) / SR
        x = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2
        x = 0.1 * x + 0.005 * rng.standard_normal(t.size)
        path = root / "speech" / f"u{i}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, x, SR, subtype="PCM_16")
        utts.append(str(path))
    lists = root / "musan_rirs"
    lists.mkdir()
    noise, rirs = [], []
    for i in range(8):
        path = root / "noise" / f"n{i}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, 0.1 * rng.standard_normal(20 * SR), SR, subtype="PCM_16")
        noise.append(f"n{i} {path}\n")
    for i in range(16):
        h = np.zeros(SR)
        d = 20 + 10 * i
        h[d] = 1.0
        h[d + 1 :] = 0.3 * rng.standard_normal(SR - d - 1) * np.exp(-np.arange(SR - d - 1) / (0.08 * SR))
        path = root / "rirs" / f"r{i}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, 0.9 * h / np.abs(h).max(), SR, subtype="PCM_16")
        rirs.append(f"r{i} {path}\n")
    (lists / "noise.scp").write_text("".join(noise))
    (lists / "rirs.scp").write_text("".join(rirs))
    return utts, lists


class PerSample:
    """(a): one sample at a time, every step in the worker, every file read from disk per sample."""

    def __init__(self, utts, bank: NoiseBank, lists: Path):
        self.utts = utts
        self.noise = [line.split()[1] for line in (lists / "noise.scp").read_text().splitlines()]
        self.rirs = [line.split()[1] for line in (lists / "rirs.scp").read_text().splitlines()]
        self.noise_len = [sf.info(p).frames for p in self.noise]
        self.fbank = Fbank()

    def __call__(self, index: int, seed: int) -> torch.Tensor:
        from scipy.signal import resample_poly

        rng = np.random.default_rng(seed)
        factor = FACTORS[int(rng.integers(len(FACTORS)))]
        need = input_length(CROP, factor)
        path = self.utts[index % len(self.utts)]
        start = int(rng.integers(0, sf.info(path).frames - need + 1))
        x, _ = sf.read(path, start=start, frames=need, dtype="float32")
        x = resample_poly(x.astype(np.float64), *resample_ratio(factor))[:CROP]
        rir, _ = sf.read(self.rirs[int(rng.integers(len(self.rirs)))], dtype="float32")
        x = reverberate(x, rir)  # scipy.signal.fftconvolve, aligned on the direct path, power kept
        k = int(rng.integers(len(self.noise)))
        offset = int(rng.integers(0, self.noise_len[k] - CROP + 1))
        noise, _ = sf.read(self.noise[k], start=offset, frames=CROP, dtype="float32")
        x = add_at_snr(x, noise.astype(np.float64), float(rng.uniform(0, 15)))
        feats = self.fbank(torch.from_numpy(x.astype(np.float32)).unsqueeze(0))
        return mean_normalize(feats)[0]


def best_of(repeats: int, fn) -> float:
    fn()  # warm-up, untimed: imports, first-call allocations, page cache
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def wait_fraction(utts, aug, args, device: torch.device) -> str:
    """CAM++ training steps fed by the real loader (workers, pinned memory, the input pipeline on `device`):
    the share of step time spent in next(loader). Meant for CUDA; `--wait-on-cpu` runs it on the CPU
    only to check the code path."""
    from speakerlab.models import build_model

    cuda = device.type == "cuda"
    speed = CropDataset(utts, [i % 8 for i in range(len(utts))], [8 * SR] * len(utts), CROP, SR, aug, FACTORS, 1.0)
    sampler = [[(i % len(utts), 1000 * step + i) for i in range(args.batch)] for step in range(args.gpu_steps)]
    loader = torch.utils.data.DataLoader(
        speed,
        batch_sampler=sampler,
        num_workers=args.workers,
        collate_fn=collate,
        pin_memory=cuda,
        prefetch_factor=4 if args.workers else None,
    )
    pipeline = InputPipeline(KaldiFeatures(FbankConfig(), True), CROP, FACTORS).to(device)
    model = build_model("campplus").to(device)
    with torch.no_grad():
        dim = model.eval()(torch.zeros(1, 200, 80, device=device)).shape[-1]
    model.train()
    head = torch.nn.Linear(dim, 8).to(device)
    opt = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.01)
    wait = total = 0.0
    t_ready = t0 = time.perf_counter()
    for step, batch in enumerate(loader):
        fetched = time.perf_counter()
        if step == 3:  # warm-up steps (cuDNN autotuning, worker start) are not counted; the clock starts
            wait, t0 = 0.0, t_ready  # where step 2 ended, so this step's fetch counts in wait and in total
        wait += fetched - t_ready
        feats, labels = pipeline(batch)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(head(model(feats)).float(), labels % 8)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        t_ready = time.perf_counter()
    total = time.perf_counter() - t0
    name = f"GPU {torch.cuda.get_device_name(device)}" if cuda else "CPU (code path check only)"
    return (
        f"{name}: CAM++ batch {args.batch}, {args.workers} workers, "
        f"{args.gpu_steps - 3} steps: data wait {100 * wait / total:.1f}% of step time, "
        f"{1000 * total / (args.gpu_steps - 3):.0f} ms/step"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=64, help="samples timed in the per-sample pipeline")
    ap.add_argument("--batch", type=int, default=128, help="batch of our pipeline (worker and device)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="loader workers (GPU part)")
    ap.add_argument("--gpu-steps", type=int, default=30)
    # One thread by default: on a shared, loaded CPU, 2 intra-op threads made the batch 4x slower
    # (they wait for each other); on an idle machine try --device-threads 0 (torch's default).
    ap.add_argument("--device-threads", type=int, default=1, help="torch threads of the device part (0: default)")
    ap.add_argument("--wait-on-cpu", action="store_true", help="run the data-wait measurement on the CPU (a check)")
    ap.add_argument(
        "--channel-config",
        type=Path,
        default=ROOT / "conf" / "mini" / "augment_channel.yaml",
        help="(c): a config whose augment section's channel settings are timed as a whole",
    )
    args = ap.parse_args(argv)
    args.device_threads = args.device_threads or torch.get_num_threads()
    print(f"$ python {shlex.join(sys.argv)}")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{args.device_threads} torch thread(s) for the device part"
    )
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    section = (yaml.safe_load(args.channel_config.read_text()) or {}).get("augment") or {}
    mixed = build_settings(AugmentSettings, section, "augment")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        utts, lists = write_inputs(root, 16)
        bank = NoiseBank(build_bank(lists, lists / "bank", ["reverb", "noise"], SR, log=lambda m: None))
        aug = Augmenter(bank, prob=1.0, kinds=["reverb", "noise"], reverb_noise_prob=1.0)
        aug.kinds = ("reverb",)  # every crop reverberated, then noise on top: the same work as (a)
        ds = CropDataset(utts, [0] * len(utts), [8 * SR] * len(utts), CROP, SR, aug, FACTORS, 1.0)
        peers = PerSample(utts, bank, lists)
        items = [(i % len(utts), 7919 * i) for i in range(args.batch)]

        threads = args.device_threads
        torch.set_num_threads(1)  # as in a DataLoader worker
        a = best_of(args.repeats, lambda: [peers(i, s) for i, s in items[: args.samples]]) / args.samples
        b_worker = best_of(args.repeats, lambda: collate([ds[it] for it in items])) / args.batch
        torch.set_num_threads(threads)
        pipeline = InputPipeline(KaldiFeatures(FbankConfig(), True), CROP, FACTORS)
        batch = collate([ds[it] for it in items])
        with torch.no_grad():
            b_device = best_of(args.repeats, lambda: pipeline(batch)) / args.batch
        print(f"(a) per-sample pipeline (worker, 1 thread): {1000 * a:.2f} ms/sample")
        print(
            f"(b) ours, worker (int16 crop + draws + bank slices + collate, 1 thread): {1000 * b_worker:.3f} ms/sample"
        )
        print(
            f"(b) ours, device part on this CPU ({threads} thread(s), batch {args.batch}): "
            f"{1000 * b_device:.2f} ms/sample"
        )
        # (c) the channel augmentation (speakerlab.dataio.waveform.degrade.ChannelAugment), worker side, per coded crop:
        # each kind alone with probability 1, on top of (b)'s worker item.
        for kind in CHANNEL_KINDS:
            coded = CropDataset(utts, [0] * len(utts), [8 * SR] * len(utts), CROP, SR, aug, FACTORS, 1.0)
            coded.channel = ChannelAugment(1.0, {kind: 1.0}, 0.0, [0.5, 1.5], SR)
            c = best_of(args.repeats, lambda d=coded, few=items[: args.samples]: collate([d[i] for i in few]))
            c /= args.samples
            print(
                f"(c) ours + channel {kind} on every crop, worker (1 thread): {1000 * c:.2f} ms/sample "
                f"(+{1000 * (c - b_worker):.2f} over (b); x{c / a:.2f} of (a))"
            )
        coded = CropDataset(utts, [0] * len(utts), [8 * SR] * len(utts), CROP, SR, aug, FACTORS, 1.0)
        coded.channel = ChannelAugment(mixed.channel_prob, mixed.channel_mix, mixed.short_prob, mixed.short_seconds, SR)
        few = [(i % len(utts), 7919 * i) for i in range(4 * args.samples)]  # 4x: the mix draws per crop
        c = best_of(args.repeats, lambda: collate([coded[i] for i in few])) / len(few)
        print(
            f"(c) ours + {args.channel_config.name}'s channel settings ({coded.channel.describe()}), worker "
            f"(1 thread): {1000 * c:.2f} ms/sample (+{1000 * (c - b_worker):.2f} over (b); x{c / a:.2f} of (a))"
        )
        if torch.cuda.is_available() or args.wait_on_cpu:
            print(wait_fraction(utts, aug, args, torch.device("cuda" if torch.cuda.is_available() else "cpu")))
        else:
            print("no CUDA device: the data-wait fraction while training CAM++ is not measured")
        print(
            f"worker CPU ms/sample: per-sample pipeline {1000 * a:.2f}, ours {1000 * b_worker:.3f}, "
            f"ratio B/A = {b_worker / a:.3f}"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
