"""The freeze schedule (speakerlab.train.freeze): which parts of the network take gradients at each step."""

from __future__ import annotations

import json

import pytest

from speakerlab.train.build import build_run, load_train_config
from speakerlab.train.loop import set_schedules
from tests.helpers import TINY_ENCODERS, voice_data_dir


def ssl_run_config(tmp_path) -> str:
    """A tiny random wav2vec 2.0 + MHFA on 4 speakers x 4 utterances: 2 steps an epoch, 3 epochs."""
    train = voice_data_dir(tmp_path / "train", speakers=4, utts=4)
    encoder = json.dumps(TINY_ENCODERS["wav2vec2"])
    path = tmp_path / "ssl.yaml"
    path.write_text(
        f"""
model: {{name: ssl_mhfa, args: {{encoder: {encoder}, heads: 2, compression_dim: 8, embedding_size: 16}}}}
features: {{kind: waveform}}
data: {{train: {train}, crop_seconds: 0.5}}
optim: {{name: adamw, lr: 0.002, min_lr: 0.0001, warmup_epochs: 0}}
train: {{epochs: 3, global_batch_size: 8, log_every_steps: 1, save_every_steps: 1}}
hardware: {{device: cpu, precision: fp32, per_device_batch: 8, num_workers: 0, pin_memory: false}}
"""
    )
    return str(path)


@pytest.mark.xfail(strict=True, reason="the encoder release of freeze_encoder_steps thaws it inside freeze_epochs")
def test_old_keys_release_the_encoder_inside_the_frozen_epochs(tmp_path):
    cfg = load_train_config([ssl_run_config(tmp_path)], [], None)
    cfg.train.freeze_epochs, cfg.train.freeze_encoder_steps = 1, 1  # past validation (which wants train.init)
    run = build_run(cfg, tmp_path / "exp")
    for step in range(run.steps_per_epoch):  # epoch 1: the whole embedding model must be fixed
        run.state.step = step
        set_schedules(run)
        assert not [n for n, p in run.raw.model.named_parameters() if p.requires_grad], step
