"""Validation EER during training, on the held-out trial list of `data.val`."""

from __future__ import annotations

from pathlib import Path

import torch

from speakerlab.dataio.corpora import train_corpora
from speakerlab.features.spec import FeatureSpec
from speakerlab.frontends import feature_spec
from speakerlab.inference.embedder import Embedder, NonFiniteEmbedding
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


def validate_corpora(run) -> None:
    """Rank 0, when validation is due (every train.val_every epochs and at the last): the EER of each corpus of
    data.train that names a `val` data dir, logged and written as the scalar `val/<name>/eer`. `run`: the
    speakerlab.train.build.Run (not imported: build is above this module)."""
    cfg, epoch = run.cfg, run.state.epoch
    if not run.info.is_main or not (epoch % cfg.train.val_every == 0 or epoch == cfg.train.epochs):
        return
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    for _, corpus in train_corpora(cfg.data):
        if not corpus.val:
            continue
        try:
            eer = validation_eer(run.raw.model, spec, corpus.val, run.device)
        except NonFiniteEmbedding as e:  # the checkpoint is written: report, and let training go on
            run.monitor.log(f"epoch {epoch}: no validation EER for {corpus.name}: {e}")
            continue
        run.monitor.scalars({f"{corpus.name}/eer": eer * 100}, run.state.step, prefix="val")
        run.monitor.log(f"epoch {epoch}: validation EER {corpus.name} ({corpus.val}) {eer * 100:.2f}%")
