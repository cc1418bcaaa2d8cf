"""3D-Speaker model-zoo checkpoints: our module and parameter names are the published ones, so a released state
dict loads into the registered model as it is (speakerlab.sources reads the file); this module only unwraps the
common containers around it.
"""

from __future__ import annotations

from typing import Mapping

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
