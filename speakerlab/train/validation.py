"""Validation EER during training, on the held-out trial list of `data.val`."""

from __future__ import annotations

from pathlib import Path

import torch

from speakerlab.features.spec import FeatureSpec
from speakerlab.inference.embedder import Embedder
from speakerlab.inference.extract import embed_data_dir
from speakerlab.inference.units import fitting_store
from speakerlab.scoring.score import evaluate


def validation_eer(model: torch.nn.Module, spec: FeatureSpec, val_dir: str, device: torch.device) -> float:
    """EER (fraction) of `model` with the inference front-end `spec` on `<val_dir>/trials`, through the
    same path as extraction (from `<val_dir>/feats.scp` when that store holds the same Kaldi fbank); the model
    is put back in the mode it was in."""
    was_training = model.training
    model.eval()
    embedder = Embedder(model, spec, device, "validation")
    try:
        ids, emb = embed_data_dir(embedder, val_dir, store=fitting_store(embedder, val_dir))
    finally:
        model.train(was_training)
    return evaluate(ids, emb, Path(val_dir) / "trials")[2]
