"""Train the segmentation model on RTTM-labelled recordings:
``speakerlab-segmentation-train --data data/conv --out exp/segmentation [--config seg.yaml] [--set key=value]``.

`--data` is a folder with wav.scp and rttm (what speakerlab-synth-conversations writes, or a real set's lists:
VoxConverse, AMI). Each step draws `batch_size` windows of `window` seconds at random places of random
recordings; their frame labels come from the RTTM (speakerlab.diarization.segmentation.frame_labels: the
three speakers who talk most in a window). Written under OUT: segmentation.pt (the weights and the model's
shape) and segmentation.onnx (what speakerlab-diarize --segmentation reads, torch-free).

Every `save_every` steps, and when a stop signal comes (speakerlab.stopping: a scheduler's SIGTERM or SIGUSR1, Ctrl-C),
OUT/checkpoint.pt holds the run's state (weights, optimizer, the window and dropout generators, the step); a signal
then ends the command with 75 (130 for Ctrl-C). The same command resumes from it to the weights of a run never
stopped; a checkpoint of other settings or other data is said and set aside (the run starts again). It is removed
once segmentation.pt and segmentation.onnx are written.

`val_data` (a folder like `--data`, of other speakers) is scored every `val_every` steps on fixed windows (the
first `val_windows` non-overlapping ones, in recording order): the loss and the frame error (the share of frames
whose powerset class is wrong under the best order of the reference's local speakers), for choosing a config.
The learning rate rises linearly over `warmup` steps, then stays (`schedule: constant`) or follows a half cosine
to zero at the last step (`cosine`).
"""

from __future__ import annotations

import hashlib
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np

from speakerlab import stopping
from speakerlab.commands import CommandParser, require_packages, run_command
from speakerlab.dataio.audio import AudioError, audio_info, read_pcm16, read_segment
from speakerlab.dataio.tables.lists import ListError, read_wav_scp
from speakerlab.dataio.tables.rttm import read_rttm
from speakerlab.outputs import OutputError, check_folder_output, output_file
from speakerlab.settings import ConfigError, build_settings, parse_overrides, read_yaml, set_dotted, setting
from speakerlab.stopping import say


@dataclass
class SegmentationTrainSettings:
    """The training config (YAML keys, all optional): window length (s), steps, batch, Adam's learning rate, the
    seed, the model's sizes (speakerlab.diarization.segmentation.SegmentationShape) and the device (fp32 on both;
    the windows are drawn on the CPU)."""

    window: float = setting(3.0, ge=0.5, le=30.0)
    steps: int = setting(500, ge=1)
    batch_size: int = setting(16, ge=1)
    lr: float = setting(1e-3, gt=0.0, le=1.0)
    seed: int = setting(0, ge=0)
    log_every: int = setting(50, ge=1)
    filters: int = setting(40, ge=1)
    channels: int = setting(64, ge=1)
    hidden: int = setting(64, ge=1)
    layers: int = setting(1, ge=1, le=4)
    frontend: str = setting("learnt", choices=("learnt", "fbank"))
    dropout: float = setting(0.0, ge=0.0, lt=1.0)
    schedule: str = setting("constant", choices=("constant", "cosine"))
    warmup: int = setting(0, ge=0)
    val_data: str = ""
    val_every: int = setting(100, ge=1)
    save_every: int = setting(500, ge=1)  # steps between two OUT/checkpoint.pt (a crash loses at most these)
    val_windows: int = setting(256, ge=1)
    device: str = setting("cpu", choices=("cpu", "cuda"))

    def shape(self):
        from speakerlab.diarization.segmentation import SegmentationShape

        return SegmentationShape(self.filters, self.channels, self.hidden, self.layers, self.frontend, self.dropout)

    def lr_factor(self, step: int) -> float:
        """The learning rate of step `step` (0-based) over `lr` (module docstring)."""
        import math

        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.schedule == "constant":
            return 1.0
        done = (step - self.warmup) / max(1, self.steps - self.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * done))


class Recordings:
    """The turns of a data folder, and random labelled windows of its recordings. 16-bit PCM recordings (what the
    corpora and speakerlab-synth-conversations write) are held as their int16 samples, 110 MB per hour of 16 kHz
    audio (float32 took twice that); a window of one is those samples over 32768, exactly soundfile's float32
    reading. A recording in another encoding (float, 24-bit) is not held: each window is read from its file when
    drawn (soundfile seeks)."""

    def __init__(self, folder: str):
        root = Path(folder)
        scp, turns = read_wav_scp(root / "wav.scp"), read_rttm(root / "rttm")
        missing = sorted(set(scp) - set(turns))
        if missing:
            raise ListError(f"{root / 'rttm'}: no turns for recording '{missing[0]}' of {root / 'wav.scp'}")
        self.paths = {reco: path for reco, (_, path) in sorted(scp.items())}
        self.lengths, self.pcm = {}, {}
        for reco, path in self.paths.items():
            line = f" ({root / 'wav.scp'} line {scp[reco][0]})"
            if not Path(path).is_file():
                raise ListError(f"no such file: {path}{line}")
            try:
                pcm = read_pcm16(path)  # rate and channels checked, as audio_info checks them for the others
                if pcm is None:
                    self.lengths[reco] = audio_info(path)
                else:
                    self.pcm[reco], self.lengths[reco] = pcm, len(pcm)
            except AudioError as e:
                raise AudioError(f"{e}{line}") from None
        self.turns = {reco: [(t.start, t.end, t.speaker) for t in turns[reco]] for reco in self.paths}
        self.names = list(self.paths)

    def digest(self) -> str:
        """What the windows are drawn from (names, lengths, turns): a checkpoint resumes on the same only."""
        text = repr([(reco, self.lengths[reco], self.turns[reco]) for reco in self.names])
        return hashlib.sha256(text.encode()).hexdigest()

    def read(self, reco: str, start: int, num_samples: int) -> np.ndarray:
        """Samples [start, start + num_samples) of `reco`, fewer where it ends sooner: float32, as read_audio's."""
        if reco in self.pcm:
            return self.pcm[reco][start : start + num_samples].astype(np.float32) / np.float32(32768)
        return read_segment(self.paths[reco], start, min(num_samples, self.lengths[reco] - start))

    def batch(self, rng: np.random.Generator, size: int, seconds: float):
        """`size` windows -> waves (B, S) float32 and labels (B, T, K) float32 (a recording shorter than the
        window is padded with silence, labelled as such)."""
        from speakerlab.diarization.segmentation import SAMPLE_RATE, SegmentationModel, frame_labels

        n = int(round(seconds * SAMPLE_RATE))
        frames = SegmentationModel.num_frames(n)
        waves = np.zeros((size, n), np.float32)
        labels = []
        for b in range(size):
            reco = self.names[int(rng.integers(len(self.names)))]
            start = int(rng.integers(max(self.lengths[reco] - n, 0) + 1))
            piece = self.read(reco, start, n)
            waves[b, : len(piece)] = piece
            labels.append(frame_labels(self.turns[reco], frames, offset=start / SAMPLE_RATE))
        return waves, np.stack(labels)

    def fixed(self, count: int, seconds: float):
        """The first `count` whole non-overlapping windows of `seconds`, recording by recording -> waves (B, S)
        float32 and labels (B, T, K) float32: the same windows on every call (validation)."""
        from speakerlab.diarization.segmentation import SAMPLE_RATE, SegmentationModel, frame_labels

        n = int(round(seconds * SAMPLE_RATE))
        frames = SegmentationModel.num_frames(n)
        waves, labels = [], []
        for reco in self.names:
            for start in range(0, self.lengths[reco] - n + 1, n):
                if len(waves) == count:
                    break
                waves.append(self.read(reco, start, n))
                labels.append(frame_labels(self.turns[reco], frames, offset=start / SAMPLE_RATE))
        if not waves:
            raise ListError(f"validation: no recording is {seconds} s long")
        return np.stack(waves).astype(np.float32), np.stack(labels)


def frame_error(logits, reference) -> float:
    """Logits (B, T, C) and reference (B, T, K) 0/1 -> the share of frames (three-speaker ones left out) whose
    best class differs from the reference's, per window under the order of its speakers with the fewest."""
    import itertools

    import torch

    from speakerlab.diarization.segmentation import to_powerset

    best = logits.argmax(-1)
    wrong = []
    for order in itertools.permutations(range(reference.shape[-1])):
        target = to_powerset(reference[..., list(order)])
        wrong.append(((best != target) & (target >= 0)).sum(1))
    return float(torch.stack(wrong).min(0).values.sum() / (to_powerset(reference) >= 0).sum().clamp(min=1))


def validate(model, waves, labels, device) -> tuple:
    """(loss, frame error) of `model` on fixed windows, in batches of 32, in eval mode (then back to training)."""
    import torch

    from speakerlab.diarization.segmentation import powerset_loss

    model.eval()
    with torch.no_grad():
        parts = [model(torch.from_numpy(waves[i : i + 32]).to(device)).cpu() for i in range(0, len(waves), 32)]
    logits = torch.cat(parts)
    model.train()
    ref = torch.from_numpy(labels)
    return float(powerset_loss(logits, ref)), frame_error(logits, ref)


class Stopped(Exception):
    """A stop signal ended the run after its checkpoint; `code` is the exit code (speakerlab.stopping.exit_code)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def save_state(path: Path, step: int, model, opt, rng: np.random.Generator, running: List[float], key: dict) -> None:
    """The run after `step` steps -> `path` (atomic: a crash while writing keeps the last one)."""
    import torch

    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "windows": rng.bit_generator.state,
    }
    state.update(torch_rng=torch.get_rng_state(), running=running, key=key)
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    with output_file(path, "wb") as f:
        torch.save(state, f)


def resume_state(path: Path, key: dict, model, opt, sched, rng: np.random.Generator, device) -> tuple:
    """(steps done, running losses) from `path` when it is a checkpoint of this run (`key`: the settings and the
    data), the model, optimizer, schedule and generators set to it; (0, []) when there is none or it is another
    run's, which is said."""
    import torch

    if not path.is_file():
        return 0, []
    state = torch.load(path, map_location=device, weights_only=True)
    if state["key"] != key:
        old, new = state["key"], key
        what = [
            f"{k} {old['settings'].get(k)} -> {v}" for k, v in new["settings"].items() if old["settings"].get(k) != v
        ]
        what += ["the data"] if old["data"] != new["data"] else []
        say(f"segmentation-train: {path} is of another run ({', '.join(what)}): starting again")
        return 0, []
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.last_epoch = state["step"]  # the schedule is a function of the step: the optimizer holds its current lr
    rng.bit_generator.state = state["windows"]
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    say(f"segmentation-train: resumed from {path} at step {state['step']}")
    return state["step"], state["running"]


def train(data: str, out: str, settings: SegmentationTrainSettings) -> None:
    """Train on `data` with `settings`; write OUT/segmentation.pt and OUT/segmentation.onnx (OUT/checkpoint.pt on the
    way: module docstring)."""
    import torch

    from speakerlab.diarization.segmentation import SegmentationModel, export_onnx, powerset_loss

    # export_onnx needs onnx after the last step: say so before the first
    require_packages("writing segmentation.onnx", ("onnx",), "pip install onnx (requirements-diarization.txt has it)")
    folder = check_folder_output(out)
    recordings = Recordings(data)
    held = Recordings(settings.val_data).fixed(settings.val_windows, settings.window) if settings.val_data else None
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    shape = settings.shape()
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda, but torch sees no CUDA device (device: cpu trains on the CPU)")
    device = torch.device(settings.device)
    model = SegmentationModel(shape).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, settings.lr_factor)
    # What a checkpoint must share to be resumed: every setting but how often the run logs, validates and saves.
    ignored = ("log_every", "val_every", "save_every")
    key = {"settings": {k: v for k, v in asdict(settings).items() if k not in ignored}, "data": recordings.digest()}
    ckpt = folder / "checkpoint.pt"
    done, running = resume_state(ckpt, key, model, opt, sched, rng, device)
    say(f"segmentation-train: {len(recordings.names)} recordings, fp32 on {device}, {shape}")
    began = time.time()
    folder.mkdir(parents=True, exist_ok=True)
    handlers = stopping.install(f"the run stops after this step and writes {ckpt}, which the same command resumes from")
    try:
        for step in range(done + 1, settings.steps + 1):
            waves, labels = recordings.batch(rng, settings.batch_size, settings.window)
            loss = powerset_loss(model(torch.from_numpy(waves).to(device)), torch.from_numpy(labels).to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            running.append(float(loss.detach()))
            if step % settings.log_every == 0 or step == settings.steps:
                mean = sum(running) / len(running)
                say(f"step {step} loss {mean:.4f} ({time.time() - began:.0f} s)")
                running = []
            if held is not None and (step % settings.val_every == 0 or step == settings.steps):
                val_loss, val_error = validate(model, *held, device)
                say(f"step {step} validation loss {val_loss:.4f} frame error {val_error:.4f}")
            if step == settings.steps:
                break  # a signal now changes nothing: the model is written next
            signum = stopping.chosen(stopping.requested())
            if signum or step % settings.save_every == 0:
                save_state(ckpt, step, model, opt, rng, running, key)
            if signum:
                code = stopping.exit_code(signum)
                name = signal.Signals(signum).name
                raise Stopped(f"stopped by {name} at step {step}: {ckpt} written; exit code {code}, the same "
                              "command resumes from it", code)  # fmt: skip
    finally:
        stopping.restore(handlers)
    model = model.cpu()
    with output_file(folder / "segmentation.pt", "wb") as f:
        torch.save({"shape": asdict(shape), "state": model.state_dict(), "settings": asdict(settings)}, f)
    export_onnx(model, folder / "segmentation.onnx")
    ckpt.unlink(missing_ok=True)
    say(f"segmentation-train: wrote {folder / 'segmentation.pt'} and {folder / 'segmentation.onnx'}")


def read_settings(config: Optional[str], overrides: List[str]) -> SegmentationTrainSettings:
    """The YAML `config` (or nothing) with `key=value` overrides -> typed settings; errors name the key."""
    raw = (read_yaml(Path(config), "config") or {}) if config else {}
    for key, value in parse_overrides(overrides):
        set_dotted(raw, key, value)
    return build_settings(SegmentationTrainSettings, raw)


def main(argv: Optional[List[str]] = None) -> int:
    p = CommandParser(prog="speakerlab-segmentation-train", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder with wav.scp and rttm")
    p.add_argument("--out", required=True, help="output folder (segmentation.pt, segmentation.onnx)")
    p.add_argument("--config", help="YAML of SegmentationTrainSettings keys (window, steps, batch_size, lr, ...)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    args = p.parse_args(argv)
    try:
        return run_command(
            lambda: train(args.data, args.out, read_settings(args.config, args.set)),
            (ConfigError, ListError, AudioError, OutputError, ImportError),
        )
    except Stopped as e:
        say(f"segmentation-train: {e}")
        return e.code


if __name__ == "__main__":
    sys.exit(main())
