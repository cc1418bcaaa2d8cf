"""Speaker-embedding models, one file per family, registered by builder name.

from speakerlab.models import build_model, list_models
model = build_model("campplus", feat_dim=80, embedding_size=192)   # (B, T, 80) -> (B, 192)
"""

# Importing a family module registers its builders.
from speakerlab.models import campplus, dfresnet, ecapa_tdnn, eres2net, eres2netv2, redimnet2, resnet, ssl  # noqa: F401
from speakerlab.models.registry import (
    build_model,
    builder_defaults,
    list_models,
    list_ssl_models,
    load_model,
    model_args_problems,
    model_features,
    register,
    weight_problems,
)
from speakerlab.models.ssl import SSLModel

__all__ = [
    "SSLModel",
    "build_model",
    "builder_defaults",
    "list_models",
    "list_ssl_models",
    "load_model",
    "model_args_problems",
    "model_features",
    "register",
    "weight_problems",
]
