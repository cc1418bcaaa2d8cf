"""Speaker models on a self-supervised encoder: model input -> `SSLEncoder` (every hidden layer) -> a back-end
over the layers -> `(B, embedding_size)`. Registered builders (each takes `pretrained: DIR` or `encoder:
{model_type, ...}`, and `lora`, `gradient_checkpointing`, `layerdrop`):

    ssl_mhfa         MHFA back-end (WavLM Base+ in the published recipe)
    ssl_ecapa_tdnn   ECAPA-TDNN over the layer sum (WavLM Large)
    ssl_mfa          layer-wise adapters + attentive statistics pooling (w2v-BERT 2.0, with LoRA)

The model input is the front-end kind of the encoder family (`input_kind`): `waveform` (WavLM, wav2vec 2.0,
HuBERT: `(B, samples)`) or `w2vbert_fbank` (`(B, T, 160)`, speakerlab.features.w2vbert).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

import torch
import torch.nn as nn

from speakerlab.models.registry import register_ssl
from speakerlab.models.ssl.backends import MFA, MHFA, ECAPABackend
from speakerlab.models.ssl.base import SSLModel
from speakerlab.models.ssl.encoders import SSLEncoder


class SSLSpeakerModel(SSLModel):
    """`encoder` (an SSLEncoder) then `backend` (hidden states -> embeddings); the SSLModel contract. `args`: the
    builder's arguments, kept so that `standalone_args` can rebuild the model without the pretrained directory."""

    def __init__(self, encoder: SSLEncoder, backend: nn.Module, builder_args: Mapping[str, Any]):
        super().__init__()
        self.encoder, self.backend = encoder, backend
        self._args = dict(builder_args)

    @property
    def input_kind(self) -> str:
        return self.encoder.input_kind

    @property
    def do_normalize(self) -> Optional[bool]:
        return self.encoder.do_normalize

    @property
    def encoder_layers(self) -> int:
        return self.encoder.num_layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend(self.encoder(x))

    def standalone_args(self) -> Dict[str, Any]:
        # The encoder's config instead of its directory, and the LoRA settings (None once merged).
        return {**self._args, "pretrained": None, "encoder": self.encoder.config_dict(), "lora": self.encoder.lora}

    def encoder_depth(self, name: str) -> Optional[int]:
        return self.encoder.depth(name[len("encoder.") :]) if name.startswith("encoder.") else None

    def encoder_parameters(self) -> List[nn.Parameter]:
        return self.encoder.trainable()

    @property
    def encoder_frozen(self) -> bool:
        return self.encoder.frozen

    def set_encoder_frozen(self, frozen: bool) -> None:
        self.encoder.set_frozen(frozen)

    def merge_lora(self) -> None:
        self.encoder.merge_lora()


def _model(args: Dict[str, Any], make_backend) -> SSLSpeakerModel:
    encoder = SSLEncoder(
        args["pretrained"], args["encoder"], args["lora"], args["gradient_checkpointing"], args["layerdrop"]
    )
    return SSLSpeakerModel(encoder, make_backend(encoder.num_layers + 1, encoder.hidden_size), args)


@register_ssl
def ssl_mhfa(
    pretrained: Optional[str] = None,
    encoder: Optional[Dict[str, Any]] = None,
    heads: int = 64,
    compression_dim: int = 128,
    embedding_size: int = 256,
    lora: Optional[Dict[str, Any]] = None,
    gradient_checkpointing: bool = False,
    layerdrop: float = 0.0,
) -> SSLSpeakerModel:
    """SSL encoder + MHFA: model input -> `(B, embedding_size)`."""
    return _model(dict(locals()), lambda n, d: MHFA(n, d, heads, compression_dim, embedding_size))


@register_ssl
def ssl_ecapa_tdnn(
    pretrained: Optional[str] = None,
    encoder: Optional[Dict[str, Any]] = None,
    channels: int = 512,
    embedding_size: int = 192,
    lora: Optional[Dict[str, Any]] = None,
    gradient_checkpointing: bool = False,
    layerdrop: float = 0.0,
) -> SSLSpeakerModel:
    """SSL encoder + ECAPA-TDNN (`channels` wide) over the layer sum: model input -> `(B, embedding_size)`."""
    return _model(dict(locals()), lambda n, d: ECAPABackend(n, d, channels, embedding_size))


@register_ssl
def ssl_mfa(
    pretrained: Optional[str] = None,
    encoder: Optional[Dict[str, Any]] = None,
    adapter_dim: int = 128,
    embedding_size: int = 256,
    lora: Optional[Dict[str, Any]] = None,
    gradient_checkpointing: bool = False,
    layerdrop: float = 0.0,
) -> SSLSpeakerModel:
    """SSL encoder + layer-wise adapters and attentive statistics pooling: model input -> `(B, embedding_size)`."""
    return _model(dict(locals()), lambda n, d: MFA(n, d, adapter_dim, embedding_size))
