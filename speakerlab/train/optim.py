"""Which weights train, at which share of the LR, and when: the optimizer's parameter groups and the encoder
freeze of models on a self-supervised encoder, decided here only (speakerlab/train/build.py builds the optimizer from
`parameter_groups`; the training step sets each group's LR to the schedule's x its `lr_scale` and applies
`set_encoder_frozen` at every step).

    group of a parameter        lr_scale
    classifier                  1
    embedding model, back-end   optim.backbone_lr_scale (fine-tuning a pretrained model: < 1)
    encoder depth d of L        optim.backbone_lr_scale x optim.encoder_lr_scale x optim.layer_decay ** (L - d)

Norms and biases (1-D) get no weight decay: decaying BatchNorm / LayerNorm scales toward 0 only fights the
normalisation. Encoder weights that never train (the base weights under LoRA) are left out.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch.nn as nn

from speakerlab.config import ConfigError, OptimSettings, TrainSettings
from speakerlab.models import SSLModel


def has_encoder(model: nn.Module) -> bool:
    """A model on a self-supervised encoder: the SSLModel contract (speakerlab.models.ssl.base)."""
    return isinstance(model, SSLModel)


def check_encoder_settings(model: nn.Module, o: OptimSettings, t: TrainSettings, name: str) -> None:
    """The encoder settings are an error for a model without an encoder (they would do nothing)."""
    if has_encoder(model):
        return
    for key, value, default in (
        ("optim.encoder_lr_scale", o.encoder_lr_scale, 1.0),
        ("optim.layer_decay", o.layer_decay, 1.0),
        ("train.freeze_encoder_steps", t.freeze_encoder_steps, 0),
    ):
        if value != default:
            raise ConfigError(f"config key '{key}': model {name} has no self-supervised encoder; remove the key")


def parameter_groups(model: nn.Module, classifier: nn.Module, o: OptimSettings) -> List[Dict]:
    """Optimizer groups `{params, weight_decay, lr_scale}` of the embedding model and the classifier."""
    scales: Dict[int, float] = {}
    if has_encoder(model):
        trainable = {id(p) for p in model.encoder_parameters()}
        layers = model.encoder_layers
        for name, p in model.named_parameters():
            depth = model.encoder_depth(name)
            if depth is not None and id(p) in trainable:
                scales[id(p)] = o.encoder_lr_scale * o.layer_decay ** (layers - depth)
            elif depth is not None:
                scales[id(p)] = -1.0  # never trains
    backbone = {id(p) for p in model.parameters()}
    groups: Dict[Tuple[bool, float], List[nn.Parameter]] = {}
    for p in [*model.parameters(), *classifier.parameters()]:
        scale = scales.get(id(p), 1.0)
        if scale < 0 or (id(p) not in scales and not p.requires_grad):
            continue
        if id(p) in backbone:
            scale *= o.backbone_lr_scale
        groups.setdefault((p.ndim > 1, scale), []).append(p)
    return [
        {"params": params, "weight_decay": o.weight_decay if decay else 0.0, "lr_scale": scale}
        for (decay, scale), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], -kv[0][1]))
    ]


def encoder_frozen_at(step: int, freeze_steps: int) -> bool:
    """Whether the encoder is frozen at optimizer step `step` (train.freeze_encoder_steps; -1: always)."""
    return freeze_steps < 0 or step < freeze_steps


def set_encoder_frozen(model: nn.Module, frozen: bool) -> bool:
    """Freeze or release the model's encoder; True when that changed its state (DDP must be wrapped again)."""
    if not has_encoder(model) or model.encoder_frozen == frozen:
        return False
    model.set_encoder_frozen(frozen)
    return True
