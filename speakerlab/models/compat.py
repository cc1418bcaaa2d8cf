"""Load 3D-Speaker model-zoo checkpoints into speakerlab models.

Our module and parameter names are the published ones, so a released state dict loads as is;
this module only unwraps the common containers around it.
"""

from __future__ import annotations

import os
from typing import Mapping, Union

import torch
import torch.nn as nn

from speakerlab.models.registry import build_model

# Keys under which training scripts commonly nest the model's state dict.
_WRAPPER_KEYS = ("state_dict", "model", "embedding_model")


def unwrap_state_dict(state: Mapping) -> Mapping:
    """Plain `{name: tensor}` dict from a checkpoint that may nest it or carry DDP's `module.` prefix."""
    for key in _WRAPPER_KEYS:
        if key in state and isinstance(state[key], Mapping):
            state = state[key]
            break
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def load_3dspeaker(name: str, state_dict_or_path: Union[str, os.PathLike, Mapping], **kwargs) -> nn.Module:
    """Build `build_model(name, **kwargs)` and load a 3D-Speaker checkpoint into it, strictly.

    `state_dict_or_path`: a state dict, or the path of a released `*.bin` / `*.ckpt` (loaded on
    the CPU with `weights_only=True`). Every checkpoint key must be used and none may be missing.
    Returns the model in eval mode, mapping `(B, T, feat_dim)` fbank to `(B, embedding_size)`.
    """
    model = build_model(name, **kwargs)
    state = state_dict_or_path
    if isinstance(state, (str, os.PathLike)):
        state = torch.load(state, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise TypeError(f"expected a state dict or a path, got {type(state).__name__}")
    state = unwrap_state_dict(state)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:  # said in one line: load_state_dict would list every key, hundreds of them
        parts = [f"Missing key(s): {len(missing)} of {len(expected)}" + (f" (e.g. '{missing[0]}')" if missing else "")]
        parts.append(f"unexpected key(s): {len(unexpected)}" + (f" (e.g. '{unexpected[0]}')" if unexpected else ""))
        raise RuntimeError(f"the state dict does not fit {name}: {'; '.join(parts)}")
    model.load_state_dict(state, strict=True)
    return model.eval()
