"""Validation EER during training, on the held-out trial list of `data.val`, and the model selection kept on it
(train.keep_best, train.patience: speakerlab.train.state.selection)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from speakerlab.dataio.tables.corpora import train_corpora
from speakerlab.frontends import FeatureSpec, feature_spec
from speakerlab.inference.embedder import Embedder, NonFiniteEmbedding
from speakerlab.inference.extract import embed_data_dir
from speakerlab.inference.units import fitting_store
from speakerlab.scoring.scorer import evaluate


def validation_eer(
    model: torch.nn.Module,
    spec: FeatureSpec,
    val_dir: str,
    device: torch.device,
    parts: Optional[Path] = None,
    info=None,
) -> Optional[float]:
    """EER (fraction) of `model` with the inference front-end `spec` on `<val_dir>/trials`, through the
    extraction lifecycle (speakerlab.inference.extract; from `<val_dir>/feats.scp` when that store holds the same
    Kaldi fbank), the model put back in the mode it was in. With `info` (a DistInfo of several ranks: every rank
    calls this) each rank embeds its shards of the utterances, in `<parts>.parts` (a folder the ranks share: the
    exp dir's; one process: a temporary folder when None), and rank 0 merges and scores them: the EER on rank 0,
    None on the others."""
    rank, world = (info.rank, info.world_size) if info is not None and info.enabled else (0, 1)
    was_training = model.training
    model.eval()
    embedder = Embedder(model, spec, device, "validation")
    try:
        store = fitting_store(embedder, val_dir)
        ids, emb = embed_data_dir(embedder, val_dir, out=parts, store=store, rank=rank, world_size=world)
    finally:
        model.train(was_training)
    return None if emb is None else evaluate(ids, emb, Path(val_dir) / "trials")[2]


def same_model(model: torch.nn.Module, info) -> None:
    """Rank 0's buffers (BatchNorm statistics: each rank's last forward updated its own) on every rank, so that
    the ranks validate one model; the parameters are the same already (DDP)."""
    if info.enabled:
        for buffer in model.buffers():
            torch.distributed.broadcast(buffer, src=0)


def parts_path(run, name: str) -> Path:
    """Where the ranks' validation embeddings of corpus `name` meet at this step (removed once merged)."""
    return run.exp_dir / f".validation_{name}_step{run.state.step}"


def validate_corpora(run) -> None:
    """Every rank, when validation is due (every train.val_every epochs and at the last): the EER of each corpus of
    data.train that names a `val` data dir (each rank embeds its part, rank 0 scores), logged and written as the
    scalar `val/<name>/eer`. `run`: the speakerlab.train.build.Run (not imported: build is above this module)."""
    cfg, epoch = run.cfg, run.state.epoch
    if not (epoch % cfg.train.val_every == 0 or epoch == cfg.train.epochs):
        return
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    for _, corpus in train_corpora(cfg.data):
        if not corpus.val:
            continue
        same_model(run.raw.model, run.info)
        try:
            eer = validation_eer(run.raw.model, spec, corpus.val, run.device, parts_path(run, corpus.name), run.info)
        except NonFiniteEmbedding as e:  # the checkpoint is written: report, and let training go on
            run.monitor.log(f"epoch {epoch}: no validation EER for {corpus.name}: {e}")
            continue
        if eer is not None:
            run.monitor.scalars({f"{corpus.name}/eer": eer * 100}, run.state.step, prefix="val")
            run.monitor.log(f"epoch {epoch}: validation EER {corpus.name} ({corpus.val}) {eer * 100:.2f}%")


@dataclass
class Selection:
    """Model selection so far, kept in every checkpoint's resume state so that a resumed run decides as an
    uninterrupted one. Epoch 0 is the model the run started from (train.init's), measured before the first step.

    Rule: an epoch's model is the new best when its validation EER is lower than the best so far (ties keep the
    earlier model, the start first); `since_best` counts validations in a row that were not; the run stops early
    once that reaches train.patience (> 0)."""

    best_eer: Optional[float] = None
    best_epoch: int = -1  # -1: nothing measured yet
    start_eer: Optional[float] = None  # epoch 0's, when the start was measured
    last_eer: Optional[float] = None
    last_epoch: int = -1
    since_best: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> "Selection":
        return cls(**raw)

    def update(self, eer: float, epoch: int) -> bool:
        """Record the validation EER of `epoch`'s model; True when it is the new best."""
        self.last_eer, self.last_epoch = eer, epoch
        if epoch == 0:
            self.start_eer = eer
        if self.best_eer is None or eer < self.best_eer:
            self.best_eer, self.best_epoch, self.since_best = eer, epoch, 0
            return True
        self.since_best += 1
        return False

    def stopped(self, patience: int) -> bool:
        return patience > 0 and self.since_best >= patience


def shared(eer: Optional[float], enabled: bool, device: torch.device) -> Optional[float]:
    """Rank 0's validation EER on every rank (None: not measured), so every rank decides alike."""
    if not enabled:
        return eer
    t = torch.tensor([math.nan if eer is None else eer], dtype=torch.float64, device=device)
    torch.distributed.broadcast(t, src=0)
    value = float(t.item())
    return None if math.isnan(value) else value
