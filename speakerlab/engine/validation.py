"""Validation EER during training, on the held-out trial list of `data.val`."""
from __future__ import annotations

from pathlib import Path

import torch

from speakerlab.config import Config
from speakerlab.extract import embed_data_dir
from speakerlab.score import evaluate


def validation_eer(model: torch.nn.Module, fbank, cfg: Config, device: torch.device) -> float:
    """EER (fraction) of `model` on `<data.val>/trials`; the model is left in train mode."""
    was_training = model.training
    model.eval()
    try:
        ids, emb = embed_data_dir(model, fbank, cfg.data.val, device, cfg.features.mean_norm,
                                  sample_rate=cfg.data.sample_rate)
    finally:
        model.train(was_training)
    return evaluate(ids, emb, Path(cfg.data.val) / "trials")[2]
