"""The golden-loss run of each model family (tests/test_learning.py): a tiny model of the family trained 12 optimizer
steps through the training step itself (speakerlab.train.step.train_step on a run of speakerlab.train.build.build_run),
in float64, with the LR warm-up, the margin schedule and weight decay all acting within those steps.

The goldens (tests/data/golden_losses.json) are written by this module, never by a test:

    OMP_NUM_THREADS=1 python -m tests.golden_run            # every family; or name some: ... campplus resnet34
    OMP_NUM_THREADS=1 python -m tests.golden_run --spread   # how far rounding-sized changes move them (no writing)

Rewrite them only for a change that moves the losses on purpose, and say why in its commit.

Float64 throughout the step: the model, the margin head (float64 in, float64 out) and the optimizer state. The
features are made here in float64 and enter through the input pipeline's feature-store path (only the mean
normalisation), so no float32 front-end rounds them: what another CPU's kernels change is then ~1e-16 of each value.
Measured by `OMP_NUM_THREADS=1 python -m tests.golden_run --spread` (2-core AMD EPYC VM, torch 2.13.0), the largest
move of a loss relative to itself, 2 threads against 1 / features x (1 + 1e-13 noise): CAM++ 1.4e-10 / 2.1e-7,
ResNet 7.8e-11 / 3.8e-8, ReDimNet2 2.4e-10 / 2.3e-8, ERes2NetV2 1.5e-12 / 5.5e-10, ECAPA 2.6e-12 / 1.7e-11,
ERes2Net 1.2e-13 / 7.0e-11, DF-ResNet 1.5e-15 / 4.2e-13: tests/test_learning.py's tolerance of 1e-6 lies between
those and the mutations' > 1e-1. The run's thread count is the config's (hardware.threads: 1), not the environment's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import numpy as np
import torch
import yaml

from tests.helpers import ROOT, make_data_dir

GOLDEN = ROOT / "tests" / "data" / "golden_losses.json"
STEPS = 12  # 4 epochs of 3 steps
SPEAKERS, UTTS, BATCH, FRAMES = 4, 6, 8, 32

# One tiny variant per family of the registry, a few thousand to ~100 k weights each.
FAMILIES: Dict[str, dict] = {
    "campplus": dict(
        embedding_size=16,
        growth_rate=8,
        bn_size=2,
        init_channels=16,
        m_channels=4,
        fcm_blocks=[1, 1],
        num_layers=[1, 1, 1],
    ),
    "eres2net_base": dict(embedding_size=16, m_channels=8, num_blocks=[1, 1, 1, 1], base_width=16),
    "eres2netv2": dict(embedding_size=16, m_channels=8, num_blocks=[1, 1, 1, 1], base_width=16),
    "ecapa_tdnn_c512": dict(embedding_size=16, attention_channels=16, se_channels=16),
    "resnet34": dict(embedding_size=16, m_channels=4, num_blocks=[1, 1, 1, 1]),
    "gemini_dfresnet114": dict(embedding_size=16, depths=[1, 1, 1, 1], dims=[4, 4, 8, 16, 32]),
    "redimnet2_b0": dict(embedding_size=16, out_channels=16),
}
# A family's own settings, where the shared ones make its 12 steps chaotic. ReDimNet2 at lr 0.02: its released
# ReLU-before-BatchNorm order leaves bn1 channels with ~1% of their values positive, just above the kink (variance
# below 1e-6 < BatchNorm's eps), where a rounding-sized change can flip which ReLUs pass and BatchNorm magnifies it; the
# loss climbs to 9.6 at step 5 and step 6's backward turned a 2e-6 difference of the gradients into 7e-2. Measured
# (--spread), 1 thread against 2 moved its last loss by 6.9e-4, features x (1 + 1e-13 noise) by 5.7e-1; at lr 0.005
# the latter is 2e-8, like the other families. The warm-up, margin and weight decay act as for the others.
FAMILY_OVERRIDES: Dict[str, List[str]] = {"redimnet2_b0": ["optim.lr=0.005", "optim.min_lr=0.0025"]}
FEAT_DIM = 40  # mel bins: fewer than the recipes' 80 (72 for ReDimNet2) for speed; the arithmetic is the same

# The schedules of the run, each acting within the 12 steps: LR warm-up over the first epoch (steps 0-2), then the
# cosine decay; the margin 0 in epoch 0, rising over epoch 1 (steps 3-5) to 0.2; weight decay on every matrix.
CONFIG = """
loss: {{margin: 0.2, margin_start_epoch: 1, margin_warmup_epochs: 1, scale: 16}}
optim: {{name: sgd, lr: 0.02, min_lr: 0.01, momentum: 0.9, nesterov: true, weight_decay: 0.01, warmup_epochs: 1}}
train: {{epochs: 4, global_batch_size: {batch}, seed: 3, log_every_steps: 1000, save_every_steps: 0}}
hardware: {{device: cpu, precision: fp32, per_device_batch: {batch}, num_workers: 0, pin_memory: false, threads: 1}}
features: {{kind: kaldi_fbank, num_mel_bins: {dims}, mean_norm: true}}
"""


def speaker_features(dims: int, seed: int = 11) -> np.ndarray:
    """`(SPEAKERS, UTTS, FRAMES, dims)` float64 features a model can tell apart after mean normalisation: each
    speaker a spectral envelope of its own, which each frame takes at a level of the utterance's own slow
    loudness contour (a constant envelope alone would be removed by the mean normalisation), plus frame noise."""
    rng = np.random.default_rng(seed)
    f = np.linspace(0.0, 1.0, dims)
    t = np.linspace(0.0, 1.0, FRAMES)[:, None]
    out = np.empty((SPEAKERS, UTTS, FRAMES, dims))
    for s in range(SPEAKERS):
        envelope = np.sin(2 * np.pi * (s + 1) * f) + 0.5 * np.cos(np.pi * (s + 2) * f * f)
        for u in range(UTTS):
            contour = np.sin(2 * np.pi * (t * rng.uniform(2.0, 4.0) + rng.uniform(0, 1)))
            out[s, u] = contour * envelope + 0.5 * rng.standard_normal((FRAMES, dims))
    return out


def feature_batches(dims: int, steps: int, perturb: float = 0.0) -> Iterator[dict]:
    """`steps` feature-store batches (speakerlab.train.inputs.pipeline: `feats (B, T, F)` float64, `label`, `index`),
    each utterance once per epoch in an order drawn from a fixed generator; `perturb` > 0: every value moved by
    that much of itself, at random (the spread measurement)."""
    feats = speaker_features(dims).reshape(SPEAKERS * UTTS, FRAMES, dims)
    feats = feats * (1.0 + perturb * np.random.default_rng(1).standard_normal(feats.shape))
    labels = np.repeat(np.arange(SPEAKERS), UTTS)
    rng = np.random.default_rng(5)
    order: List[int] = []
    while len(order) < steps * BATCH:
        order += rng.permutation(len(labels))[: len(labels) // BATCH * BATCH].tolist()
    for k in range(steps):
        rows = np.array(order[k * BATCH : (k + 1) * BATCH])
        yield {
            "feats": torch.from_numpy(feats[rows]),
            "label": torch.from_numpy(labels[rows]),
            "index": torch.from_numpy(rows),
        }


def golden_losses(name: str, workdir: Path, overrides: Sequence[str] = (), perturb: float = 0.0) -> List[float]:
    """The `STEPS` training losses of family `name`'s tiny model in float64 (`overrides`: dotted config overrides,
    e.g. a mutation's; `perturb`: see feature_batches)."""
    from speakerlab.train.build import build_run, load_train_config
    from speakerlab.train.step import train_step

    dims = FEAT_DIM
    utts = {f"s{s}-{u}": f"s{s}" for s in range(SPEAKERS) for u in range(UTTS)}
    train = make_data_dir(workdir / "train", utts, seconds=0.3)  # the run's speakers and epoch length only
    cfg = workdir / "golden.yaml"
    model = {"model": {"name": name, "args": {**FAMILIES[name], "feat_dim": dims}}}
    model["data"] = {"train": str(train), "crop_seconds": 0.3}
    cfg.write_text(yaml.safe_dump(model) + CONFIG.format(batch=BATCH, dims=dims))
    config, init = load_train_config([str(cfg)], [*FAMILY_OVERRIDES.get(name, []), *overrides], None)
    run = build_run(config, workdir / "exp", init)
    try:
        assert run.steps_per_epoch * config.train.epochs == STEPS, run.steps_per_epoch
        run.raw.double()  # parameters stay the optimizer's objects; their values become float64
        seen: List[float] = []  # the loss of each forward in full float64 (the step reports it rounded to float32)
        run.raw.register_forward_hook(lambda module, args, out: seen.append(out[0].item()))
        batches = feature_batches(dims, STEPS, perturb)
        for _ in range(STEPS):
            train_step(run, batches)
        return seen
    finally:
        run.monitor.close()


def spread(name: str, workdir: Path) -> str:
    """How far the losses move under rounding-sized changes: features perturbed by 1e-13 of themselves (1,000x
    float64's rounding), and 2 threads instead of 1 (other reduction orders, as another CPU's kernels make)."""
    # The thread count goes through the config: build_run sets torch's from hardware.threads (auto: OMP_NUM_THREADS
    # or the CPU affinity), so a torch.set_num_threads before it would be overridden.
    base = np.array(golden_losses(name, workdir / "base", ["hardware.threads=1"]))
    moved = np.array(golden_losses(name, workdir / "perturbed", ["hardware.threads=1"], perturb=1e-13))
    threads = np.array(golden_losses(name, workdir / "threads", ["hardware.threads=2"]))

    def worst(run):
        return float(np.max(np.abs(run - base) / np.maximum(np.abs(base), 1e-3)))

    return f"{name}: features x (1 + 1e-13 noise) {worst(moved):.1e}, 2 threads {worst(threads):.1e}"


def main(argv: Sequence[str]) -> int:
    """`[--spread] [family ...]`: write the goldens of the families (all by default), or print their spread."""
    import tempfile

    args = list(argv)
    measure = "--spread" in args
    names = [a for a in args if a != "--spread"] or list(FAMILIES)
    stored = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    families = stored.get("families", {})
    for name in names:
        with tempfile.TemporaryDirectory() as d:
            if measure:
                print(spread(name, Path(d)), flush=True)
                continue
            families[name] = golden_losses(name, Path(d))
        print(name, " ".join(f"{v:.6f}" for v in families[name]))
    if not measure:
        GOLDEN.write_text(
            json.dumps({"steps": STEPS, "torch": torch.__version__, "families": families}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
