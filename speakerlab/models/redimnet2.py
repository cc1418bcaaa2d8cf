"""ReDimNet2 (PalabraAI, 2025), sizes B0-B6, in the layout of the official releases.

    log-mel (B, T, F) -> (B, 1, F, T) -> 3x3 conv + channel LayerNorm, flattened to (B, C*F, T)
        -> 6 stages; each mixes all earlier 1-D maps, views the mix as 2-D (c, f), downsamples
           it (strided grouped conv), runs residual blocks, flattens it back to 1-D, adds a
           time-context block (depthwise convs + self-attention) and repeats frames to full rate
        -> final mix of all 7 maps -> optional 1x1 conv head -> (B, D_out, T)
        -> attentive statistics pooling (B, 2 * D_out) -> BatchNorm -> linear (B, embedding_size)

Module and parameter names follow the released checkpoints (`backbone.stage0.3.conv_block...`,
`pool.linear1`, `bn`, `linear`), so their `state_dict` loads with `strict=True`; the release's
front-end buffers (`spec.*`) are not part of this model: the front-end lives in
speakerlab/features/redimnet.py (`ReDimNetMel`), and the model takes its features time-major.
A release file is read by speakerlab/sources.py (`read_source`), which maps its `model_config` to a registered size.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from speakerlab.models.pooling import ASTP
from speakerlab.models.redimnet2_blocks import ReDimNet2Backbone, StageSpec
from speakerlab.models.registry import register_variant

# Settings of the VoxCeleb2 releases (`b<n>-vox2-{ptn,lm}.pt`): channels C, output head width and
# stages. B3 and B6 are written out in the official recipes; the others come from the released
# checkpoints (see `config_provenance` in tests/data/redimnet2/*.json).
# fmt: off
RELEASES = {
    "b0": dict(channels=12, out_channels=64, stages=(
        ((1, 1), 2, 2, ((3, 3),), 36),
        ((2, 1), 3, 1, ((3, 3),), 36),
        ((1, 2), 4, 1, ((3, 3),), 36),
        ((2, 1), 5, 1, ((3, 3),), 36),
        ((1, 2), 4, 1, ((3, 3),), 18),
        ((2, 1), 3, 1, ((3, 3),), 18),
    )),
    "b1": dict(channels=16, out_channels=None, stages=(
        ((1, 1), 2, 2, ((3, 3),), 32),
        ((2, 1), 3, 1, ((3, 3),), 32),
        ((1, 2), 4, 1, ((3, 3),), 32),
        ((2, 1), 5, 1, ((3, 3),), 32),
        ((1, 2), 4, 1, ((3, 3),), 16),
        ((2, 1), 3, 1, ((3, 3),), 16),
    )),
    "b2": dict(channels=20, out_channels=None, stages=(
        ((1, 1), 2, 2, ((3, 5),), 40),
        ((2, 1), 3, 1, ((3, 5),), 30),
        ((1, 2), 4, 1, ((3, 5),), 30),
        ((3, 1), 5, 1, ((3, 5),), 20),
        ((1, 2), 4, 1, ((3, 7),), 20),
        ((2, 1), 3, 1, ((3, 7),), 10),
    )),
    "b3": dict(channels=24, out_channels=None, stages=(
        ((1, 1), 2, 4, ((3, 3),), 24),
        ((2, 1), 3, 3, ((3, 3),), 24),
        ((1, 2), 4, 2, ((3, 3),), 24),
        ((2, 1), 5, 1, ((3, 3),), 24),
        ((1, 2), 4, 1, ((3, 3),), 24),
        ((2, 1), 3, 1, ((3, 3),), 24),
    )),
    "b4": dict(channels=32, out_channels=None, stages=(
        ((1, 1), 2, 4, ((3, 3),), 24),
        ((2, 1), 3, 3, ((3, 3),), 24),
        ((1, 2), 4, 2, ((3, 3),), 24),
        ((2, 1), 5, 1, ((3, 3),), 24),
        ((1, 2), 4, 1, ((3, 3),), 24),
        ((2, 1), 3, 1, ((3, 3),), 24),
    )),
    "b5": dict(channels=48, out_channels=256, stages=(
        ((1, 1), 2, 4, ((3, 3),), 48),
        ((2, 1), 3, 3, ((3, 3),), 48),
        ((1, 2), 4, 2, ((3, 3),), 48),
        ((2, 1), 5, 1, ((3, 3),), 48),
        ((1, 2), 4, 1, ((3, 3),), 32),
        ((2, 1), 3, 1, ((3, 3),), 32),
    )),
    "b6": dict(channels=64, out_channels=224, stages=(
        ((1, 1), 3, 3, ((3, 3),), 64),
        ((2, 1), 4, 2, ((3, 3),), 64),
        ((1, 2), 5, 2, ((3, 3),), 48),
        ((2, 1), 5, 1, ((3, 3),), 48),
        ((1, 2), 4, 0.75, ((3, 3),), 32),
        ((2, 1), 3, 0.5, ((3, 3),), 24),
    )),
}
# fmt: on


class ReDimNet2(nn.Module):
    """ReDimNet2 speaker embedding extractor: log-mel `(B, T, feat_dim) -> (B, embedding_size)`.

    Args:
        feat_dim: mel bins of the input (72 for the releases and `ReDimNetMel`). When it is not
            a multiple of the stages' total frequency stride, the input is zero-padded to the
            next multiple (e.g. 80 -> 84 for B2), a choice of ours for training at other widths.
        embedding_size: output dimension.
        channels: C, the stem width; every 1-D map has C * F channels.
        stages: per stage `((freq_stride, time_stride), num_blocks, expansion, kernel_sizes,
            att_reduction)` as in the release's `stages_setup` (see `StageSpec`).
        out_channels: width of the 1x1 conv head after the last mix, None for no head.
        return_2d_output: view the last mix as 2-D (c, f) before the head, flattened channel-major
            for pooling; else keep the 1-D (frequency-major) map.
        group_divisor: channels per group of the residual blocks' 3x3 convs.
        agg_gnorm: GroupNorm (C groups) after the stem and after each stage (the cnc2 releases).
        global_context_att: the pooling's attention also sees utterance mean and std.
        emb_bn: BatchNorm after the linear layer (`bn2`).
    """

    def __init__(
        self,
        feat_dim: int = 72,
        embedding_size: int = 192,
        channels: int = 24,
        stages: Sequence[StageSpec] = RELEASES["b3"]["stages"],
        out_channels: Optional[int] = None,
        return_2d_output: bool = True,
        group_divisor: int = 1,
        agg_gnorm: bool = False,
        global_context_att: bool = True,
        emb_bn: bool = False,
    ):
        super().__init__()
        self.feat_dim = feat_dim
        self.embedding_size = embedding_size
        freq_stride = math.prod(spec[0][0] for spec in stages)
        self.num_bins = -(-feat_dim // freq_stride) * freq_stride
        self.backbone = ReDimNet2Backbone(
            self.num_bins, channels, stages, out_channels, return_2d_output, group_divisor, agg_gnorm
        )
        dim = self.backbone.out_dim
        self.pool = ASTP(dim, 128, global_context_att)
        self.bn = nn.BatchNorm1d(2 * dim)
        self.linear = nn.Linear(2 * dim, embedding_size)
        self.bn2 = nn.BatchNorm1d(embedding_size) if emb_bn else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, T, feat_dim)` log-mel -> `(B, embedding_size)`; T >= 2 * time_stride (8) frames."""
        x = x.transpose(1, 2)
        if self.num_bins != self.feat_dim:
            x = F.pad(x, (0, 0, 0, self.num_bins - self.feat_dim))
        out = self.backbone(x.unsqueeze(1))
        out = self.bn(self.pool(out))
        return self.bn2(self.linear(out))


# Each VoxCeleb2 release size, registered as redimnet2_<size> (M params at the defaults): the release's
# settings are fixed, its head width (`out_channels`, None: no head) is an argument.
_MPARAMS = {"b0": 1.12, "b1": 2.16, "b2": 3.68, "b3": 4.18, "b4": 6.66, "b5": 8.96, "b6": 12.39}
for _size, _mparams in _MPARAMS.items():
    _release = dict(RELEASES[_size])
    _head = _release.pop("out_channels", None)
    register_variant(
        f"redimnet2_{_size}",
        ReDimNet2,
        dict(feat_dim=72, embedding_size=192, out_channels=_head, return_2d_output=True, agg_gnorm=False),
        f"ReDimNet2-{_size.upper()} ({_mparams} M params): `(B, T, 72) -> (B, 192)`.",
        _release,
        features=dict(kind="redimnet_mel", num_mel_bins=72),
    )


# Release `model_config` keys (ReDimNet2Wrap's arguments) -> our constructor's, with the official
# constructor's default where a config leaves one out (note: `return_2d_output` defaults to False
# there, while every release sets it True).
_CONFIG_KEYS = {
    "F": ("feat_dim", 72),
    "C": ("channels", 24),
    "stages_setup": ("stages", RELEASES["b3"]["stages"]),
    "out_channels": ("out_channels", None),
    "return_2d_output": ("return_2d_output", False),
    "group_divisor": ("group_divisor", 1),
    "agg_gnorm": ("agg_gnorm", False),
    "embed_dim": ("embedding_size", 192),
    "global_context_att": ("global_context_att", True),
    "emb_bn": ("emb_bn", False),
}
# Settings only these values of which are implemented (the released ones), official defaults first.
_FIXED = {
    "causal": ("none",),
    "spec_in_channels": (1,),
    "block_1d_type": ("conv+att",),
    "block_2d_type": ("basic_resnet",),
    "compress_tconvs": (True,),
    "use_freq_pos_enc": (False,),
    "fm_weigthing_type": ("NC",),
    "dual_agg": (False,),
    "pooling_func": ("ASTP",),
    "pad_right_samples": (None,),
    "before_pool_offset": (None,),
    "return_all_outputs": (False,),
}
# Front-end settings (see speakerlab/features/redimnet.py) and arguments the official model ignores.
_NOT_MODEL = {"feat_type", "hop_length", "spec_params", "num_classes", "feat_agg_dropout", "head_activation"}


def redimnet2_kwargs(model_config: Mapping[str, Any]) -> dict:
    """`ReDimNet2` arguments for a release's `model_config`; a ValueError names any unsupported setting."""
    unknown = sorted(set(model_config) - set(_CONFIG_KEYS) - set(_FIXED) - _NOT_MODEL)
    if unknown:
        raise ValueError(f"ReDimNet2 model_config has unknown setting(s) {unknown}")
    for key, allowed in _FIXED.items():
        if model_config.get(key, allowed[0]) not in allowed:
            raise ValueError(f"ReDimNet2 model_config {key}={model_config[key]!r} is not supported (only {allowed})")
    feat_type = model_config.get("feat_type", "pt")
    if feat_type not in ("tf", "tf_mel"):
        warnings.warn(
            f"ReDimNet2 model_config feat_type={feat_type!r}: speakerlab's ReDimNetMel reproduces the "
            "'tf' front-end only; features for this checkpoint must come from elsewhere",
            stacklevel=3,
        )
    return {ours: model_config.get(theirs, default) for theirs, (ours, default) in _CONFIG_KEYS.items()}
