"""The contract of a speaker model on a self-supervised encoder: what the rest of speakerlab may ask of it, and
the only way it asks (`isinstance(model, SSLModel)`, never by probing attributes).

    asked by                          for
    speakerlab.sources.input_problem  input_kind, do_normalize: the front-end the encoder takes
    speakerlab.train.optim.groups, .freeze   encoder_layers, encoder_depth, encoder_parameters: layer-wise LR;
                                      encoder_frozen, set_encoder_frozen: an `encoder` rule of train.freeze
    speakerlab.train.state.resume           standalone_args: a checkpoint that rebuilds without the encoder's directory
    speakerlab.sources                merge_lora: a LoRA checkpoint fine-tuned without LoRA
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Any, Dict, List, Optional

import torch.nn as nn


class SSLModel(nn.Module, metaclass=ABCMeta):
    """A speaker model whose input goes through a self-supervised encoder: model input -> `(B, embedding_size)`."""

    @property
    @abstractmethod
    def input_kind(self) -> str:
        """The front-end kind this model takes (speakerlab.frontends): waveform or w2vbert_fbank."""

    @property
    @abstractmethod
    def do_normalize(self) -> Optional[bool]:
        """Whether the pretrained encoder takes waves of zero mean and unit variance (None: not known)."""

    @property
    @abstractmethod
    def encoder_layers(self) -> int:
        """L, the encoder's transformer layers."""

    @abstractmethod
    def encoder_depth(self, name: str) -> Optional[int]:
        """For the parameter `name` of this model: its encoder depth (0: before the layers, 1 .. L), or None for a
        parameter outside the encoder."""

    @abstractmethod
    def encoder_parameters(self) -> List[nn.Parameter]:
        """The encoder parameters training may update (LoRA's only, with LoRA)."""

    @property
    @abstractmethod
    def encoder_frozen(self) -> bool:
        """Whether the encoder takes no gradient now."""

    @abstractmethod
    def set_encoder_frozen(self, frozen: bool) -> None:
        """Freeze or release the encoder."""

    @abstractmethod
    def standalone_args(self) -> Dict[str, Any]:
        """Builder arguments that rebuild this architecture from a checkpoint alone (no pretrained directory)."""

    @abstractmethod
    def merge_lora(self) -> None:
        """Fold LoRA adapters into the encoder weights: the state dict of the same model without LoRA."""
