"""Which weights train and at which share of the LR: the optimizer's parameter groups, decided here only
(speakerlab.train.build builds the optimizer from `parameter_groups`; the training step sets each group's LR to
the schedule's x its `lr_scale`; when they train is speakerlab.train.optim.freeze's).

    group of a parameter        lr_scale
    classifier                  1
    embedding model, back-end   optim.backbone_lr_scale (fine-tuning a pretrained model: < 1)
    encoder depth d of L        optim.backbone_lr_scale x optim.encoder_lr_scale x optim.layer_decay ** (L - d)

Norms and biases (1-D) get no weight decay: decaying BatchNorm / LayerNorm scales toward 0 only fights the
normalisation. Weights that never train are left out: encoder weights outside `encoder_parameters()` (the base
weights under LoRA) and other weights that do not require grad when the model is built (a model's fixed ones).
The groups are built before the freeze schedule first applies, and encoder weights are taken whether frozen now
or not, so weights frozen at the start are in the optimizer when they are released.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch.nn as nn

from speakerlab.config import ConfigError, OptimSettings
from speakerlab.models import SSLModel


def has_encoder(model: nn.Module) -> bool:
    """A model on a self-supervised encoder: the SSLModel contract (speakerlab.models.ssl.base)."""
    return isinstance(model, SSLModel)


def check_encoder_settings(model: nn.Module, o: OptimSettings, name: str) -> None:
    """The encoder settings are an error for a model without an encoder (they would do nothing; an encoder
    freeze rule: speakerlab.train.optim.freeze.check_freeze)."""
    if has_encoder(model):
        return
    for key, value, default in (
        ("optim.encoder_lr_scale", o.encoder_lr_scale, 1.0),
        ("optim.layer_decay", o.layer_decay, 1.0),
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
