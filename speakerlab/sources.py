"""Pretrained sources: the one reader of every file an embedding model comes from, for inference, export and
fine-tuning (`train.init`) alike, so that a source embeds and fine-tunes with the same model, sizes and front-end.

    src = read_source("exp/campplus")             # ours: an exp dir (its newest intact checkpoint) or a file
    src = read_source("b6-vox2-lm.pt")            # a ReDimNet2 release: {"model_config", "state_dict"}
    src = read_source("campplus_cn_common.bin", threedspeaker="campplus")    # a 3D-Speaker state dict
    model = src.build()                           # eval mode: model input (src.features' front-end) -> (B, D)
    src = src.merged()                            # an SSL checkpoint's LoRA adapters folded into its encoder

Each gives one `Source`: its kind, the registered model name and arguments, the weights, the front-end it was
trained with (a FeatureSpec) and, for our training checkpoints, the speakers and classifier. A 3D-Speaker state
dict carries no settings: its embedding size is read from its last matrix (every zoo model ends in the
embedding projection), its features are those the zoo was published with (`THREEDSPEAKER_FEATURES`). A
ReDimNet2 release maps to the registered size (b0-b6) of the same stages, with its own log-mel front-end.

Why a layer of its own (speakerlab/sources.py, between checkpoint and inference): it needs our checkpoint
files, the model registry and the front-end registry, and `models` may import nothing of ours; inference and
train both read through it, and neither may be below the other's reader. Every failure is a SourceError (a
ValueError) naming the file; no file is ever read with `weights_only=False`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import torch
import torch.nn as nn

from speakerlab.checkpoint import Checkpoint, CheckpointError, checkpoint_from_raw, load_given, load_raw
from speakerlab.features.redimnet import release_mel_config
from speakerlab.frontends import FEATURE_KINDS, FbankConfig, FeatureSpec
from speakerlab.models import SSLModel, build_model, builder_defaults, list_models, load_model, weight_problems
from speakerlab.models.compat import unwrap_state_dict
from speakerlab.models.redimnet2 import RELEASES, redimnet2_kwargs

# The features every published 3D-Speaker model was trained with: 16 kHz, 80-bin Kaldi fbank, 25/10 ms povey
# frames, no dither, per-utterance mean normalisation.
THREEDSPEAKER_FEATURES = FeatureSpec(FbankConfig(sample_rate=16000, num_mel_bins=80, dither=0.0), mean_norm=True)
KINDS = {
    "speakerlab": "a speakerlab checkpoint",
    "redimnet2": "a ReDimNet2 release",
    "3dspeaker": "a 3D-Speaker state dict",
}
_LAYOUTS = {"speakerlab": " (no model_name/model)", "redimnet2": " (a dict with model_config and state_dict)"}


class SourceError(ValueError):
    """A pretrained source that cannot be read or used; the message names the file. `about` is "name" when the
    3D-Speaker model name given with it is at fault, else "file"."""

    def __init__(self, message: str, about: str = "file"):
        super().__init__(message)
        self.about = about


@dataclass(kw_only=True)
class Source:
    """A pretrained model as read from its file: `kind` is one of KINDS."""

    kind: str
    path: Path
    model_name: str
    model_args: Dict[str, Any]
    weights: Dict[str, torch.Tensor]
    features: FeatureSpec
    speakers: List[str] = field(default_factory=list)
    classifier: Optional[Dict[str, torch.Tensor]] = None
    loss: str = ""  # the classifier's head (our checkpoints)
    lora_merged: bool = False  # `merged` folded this source's LoRA adapters into its encoder
    digest: str = ""  # our checkpoints: the file's content digest, which names these weights (embeddings record it)

    def describe(self) -> str:
        return f"{self.kind} {self.model_name} from {self.path}"

    def pinned_args(self) -> Dict[str, Any]:
        """The model arguments this source fixes: every one (the builder's defaults filled in) for ours and a
        release; a 3D-Speaker state dict only its embedding size (the others must fit its shapes)."""
        if self.kind == "3dspeaker":
            return dict(self.model_args)
        return {**builder_defaults(self.model_name), **self.model_args}

    def fit_problem(self, name: str, args: Dict[str, Any]) -> Optional[str]:
        """What keeps these weights from loading into model `name(**args)` (None when they load); the model is
        built on the meta device: no memory, no time."""
        with torch.device("meta"):
            return weight_problems(build_model(name, **args), self.weights)

    def build(self) -> nn.Module:
        """The model with these weights, in eval mode: model input -> `(B, D)`. A front-end that cannot feed it (a
        3D-Speaker state dict of a model that takes other features, a checkpoint whose stored front-end is not its
        model's) is a SourceError naming the file, not a shape error at the first embedding."""
        try:
            model = load_model(self.model_name, self.model_args, self.weights)
        except ValueError as e:
            raise SourceError(f"{self.path}: {e}") from None
        problem = input_problem(model, self.features)
        if problem:
            zoo = " (3D-Speaker state dicts are read with the zoo's 80-bin fbank)" if self.kind == "3dspeaker" else ""
            raise SourceError(
                f"{self.path}: its front-end ({self.features.describe()}) cannot feed model {self.model_name}{zoo}: "
                f"{problem}"
            )
        return model

    def merged(self) -> "Source":
        """This source without LoRA: its adapters folded into the encoder weights (`model_args.lora` dropped);
        the source itself when it has none. What a run that drops LoRA (model.args.lora: null) starts from."""
        if not self.model_args.get("lora"):
            return self
        net = build_model(self.model_name, **self.model_args)
        if not isinstance(net, SSLModel):
            raise SourceError(f"{self.path}: model {self.model_name} has LoRA settings but no encoder to merge into")
        net.load_state_dict(self.weights)
        net.merge_lora()
        args = {k: v for k, v in self.model_args.items() if k != "lora"}
        return dataclasses.replace(self, model_args=args, weights=net.state_dict(), lora_merged=True)


def read_source(
    path: Union[str, Path],
    threedspeaker: Optional[str] = None,
    kind: Optional[str] = None,
    warn: Callable[[str], None] = lambda m: None,
) -> Source:
    """The pretrained model of `path`: our checkpoint file or exp dir (its newest intact checkpoint; a corrupt
    newer one is passed over and reported through `warn`), a ReDimNet2 release, or, with `threedspeaker` (a
    registered model name), a 3D-Speaker state dict. `kind`, when given, is the one the caller asks for (a
    command-line flag): another is an error."""
    path = Path(path)
    if threedspeaker is not None and threedspeaker not in list_models():
        raise SourceError(f"unknown model {threedspeaker!r}; registered: {', '.join(list_models())}", "name")
    try:
        if path.is_dir():
            found, ckpt = load_given(path, warn)
            src = _ours(found, ckpt)
        else:
            raw = load_raw(path)
            ours = isinstance(raw, dict) and "model_name" in raw and "model" in raw
            src = _ours(path, checkpoint_from_raw(raw, path)) if ours else None
    except CheckpointError as e:
        raise SourceError(str(e)) from None
    if src is None and isinstance(raw, Mapping) and "model_config" in raw and "state_dict" in raw:
        src = _redimnet2(path, raw)
    if src is None and threedspeaker:
        src = _threedspeaker(path, raw, threedspeaker)
    if src is None:
        asked = [kind] if kind else ["speakerlab", "redimnet2"]
        what = "not " + " nor ".join(KINDS[k] + _LAYOUTS.get(k, "") for k in asked)
        hint = (
            "; a 3D-Speaker state dict needs the name of its registered model (--3dspeaker NAME --weights FILE; "
            "train.init_3dspeaker: NAME)"
        )
        raise SourceError(f"{path}: {what}{hint if kind in (None, 'speakerlab') else ''}")
    if threedspeaker and src.kind != "3dspeaker":
        raise SourceError(
            f"{src.path} is {KINDS[src.kind]}, not a 3D-Speaker state dict: give it without a model name", "name"
        )
    if kind is not None and src.kind != kind:
        raise SourceError(f"{src.path}: not {KINDS[kind]} but {KINDS[src.kind]}")
    return src


def _ours(path: Path, ckpt: Checkpoint) -> Source:
    return Source(
        kind="speakerlab",
        path=path,
        model_name=ckpt.model_name,
        model_args=ckpt.model_args,
        weights=ckpt.model,
        features=ckpt.features,
        speakers=ckpt.speakers,
        classifier=ckpt.classifier,
        loss=(ckpt.config.get("loss") or {}).get("name", "aam"),
        digest=ckpt.digest,
    )


def plain(value: Any) -> Any:
    """Tuples as lists, recursively: a YAML or JSON list and a builder's tuple compare equal."""
    return [plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _redimnet2(path: Path, raw: Mapping) -> Source:
    """A release's model_config -> the registered size (b0-b6) of the same stages, its arguments and its log-mel."""
    try:
        kwargs = redimnet2_kwargs(raw["model_config"])
        features = FeatureSpec(release_mel_config(raw["model_config"]), mean_norm=True)
    except ValueError as e:
        raise SourceError(f"{path}: {e}") from None
    want = (kwargs["channels"], plain(kwargs["stages"]))
    size = next((s for s, r in RELEASES.items() if (r["channels"], plain(r["stages"])) == want), None)
    if size is None:
        raise SourceError(f"{path}: its ReDimNet2 stages (C={kwargs['channels']}) are none of the sizes b0-b6")
    for key, only in (("group_divisor", 1), ("global_context_att", True), ("emb_bn", False)):
        if kwargs[key] != only:
            raise SourceError(f"{path}: ReDimNet2 {key}={kwargs[key]!r}; the registered sizes take only {only!r}")
    args = {k: kwargs[k] for k in ("feat_dim", "embedding_size", "out_channels", "return_2d_output", "agg_gnorm")}
    weights = {k: v for k, v in raw["state_dict"].items() if not k.startswith("spec.")}  # the front-end's buffers
    return Source(
        kind="redimnet2", path=path, model_name=f"redimnet2_{size}", model_args=args, weights=weights, features=features
    )


def _threedspeaker(path: Path, raw: Any, name: str) -> Source:
    if not isinstance(raw, Mapping):
        raise SourceError(f"{path} holds a {type(raw).__name__}, not a state dict")
    state = dict(unwrap_state_dict(raw))
    mats = [v for v in state.values() if isinstance(v, torch.Tensor) and v.ndim >= 2]
    args = {"embedding_size": int(mats[-1].shape[0])} if mats and "embedding_size" in builder_defaults(name) else {}
    return Source(
        kind="3dspeaker", path=path, model_name=name, model_args=args, weights=state, features=THREEDSPEAKER_FEATURES
    )


def input_problem(model: nn.Module, spec: FeatureSpec) -> Optional[str]:
    """What is wrong with feeding `model` the front-end `spec` (None when it fits), naming the config key: a model
    on a self-supervised encoder takes its encoder's kind (and, for waves, its do_normalize); the others features."""
    if isinstance(model, SSLModel):
        if model.input_kind != spec.kind:
            return f"'features.kind': the model takes {model.input_kind}, not {spec.kind}"
        if spec.kind == "waveform" and model.do_normalize not in (None, spec.mean_norm):
            return (
                f"'features.mean_norm': the encoder's preprocessor_config.json has do_normalize {model.do_normalize}; "
                f"set {str(model.do_normalize).lower()}"
            )
        return None
    if spec.kind not in FEATURE_KINDS:
        return f"'features.kind': the model takes {' or '.join(FEATURE_KINDS)}, not {spec.kind}"
    bins = getattr(model, "feat_dim", None)
    if isinstance(bins, int) and bins != spec.feat_dim:  # else a shape error deep inside the model's first forward
        return (
            f"'features.num_mel_bins': the front end gives {spec.feat_dim} bins and the model takes {bins} "
            "(model.args.feat_dim)"
        )
    return None
