"""Where a run's weights start: a pretrained model (`train.init`), or from scratch.

    train.init: exp/pretrain             # a speakerlab exp dir (its newest intact checkpoint), or a checkpoint file
    train.init: b2-vox2-ptn.pt           # a ReDimNet2 release: {"model_config": ..., "state_dict": ...}
    train.init: campplus_cn_common.bin   # a 3D-Speaker state dict ...
    train.init_3dspeaker: campplus       # ... of this registered model

`resolve_model(cfg)` runs when the config is loaded, before anything is built: the model section comes from
the source. `model.name` and each `model.args` key may be left out of the config; one that is given must
agree, else a ConfigError names it. The features the source was trained on must be the config's (a 3D-Speaker
model's are `THREEDSPEAKER_FEATURES`). The resolved section is what the run records (config.yaml, checkpoints).

`initialise(run)`, for a run without a checkpoint of its own, loads the embedding model's weights (strictly).
The classifier is the source's when that is a speakerlab checkpoint of the same speakers and head
(large-margin fine-tuning, recipe stage 7); otherwise it is new, for the run's speakers, and with
`train.init_match_speakers` the rows of speakers the source also had (same id) start from the source's. The
initialised model goes to `<exp>/pretrained.pt` (no classifier): recipes embed with it to show the EER before
fine-tuning. Keeping the pretrained trunk fixed while the new classifier settles: `train.freeze` (a `trunk` rule,
speakerlab.train.freeze).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch

from speakerlab.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_from_raw,
    load_given,
    load_raw,
    save_checkpoint,
)
from speakerlab.config import Config, ConfigError
from speakerlab.features.spec import FeatureSpec, feature_spec
from speakerlab.inference.embedder import THREEDSPEAKER_FEATURES
from speakerlab.models import build_model, list_models, model_args_problems
from speakerlab.models.compat import unwrap_state_dict
from speakerlab.models.redimnet2 import RELEASES, redimnet2_kwargs
from speakerlab.models.registry import builder_defaults


@dataclass
class InitSource:
    """A pretrained model as read from `train.init`: `kind` is speakerlab, redimnet2 or 3dspeaker."""

    path: Path
    kind: str
    model_name: str
    model_args: Dict[str, Any]
    weights: Dict[str, torch.Tensor]
    features: Optional[FeatureSpec]  # None: not trained on a speakerlab fbank (ReDimNet2's own front-end)
    speakers: List[str] = field(default_factory=list)
    classifier: Optional[Dict[str, torch.Tensor]] = None
    loss: str = ""


def _init_error(message: str) -> ConfigError:
    return ConfigError(f"config key 'train.init': {message}")


def read_source(init: str, threedspeaker: Optional[str] = None) -> InitSource:
    """The pretrained model of `train.init` (and `train.init_3dspeaker`); ConfigError when it cannot be one."""
    path = Path(init)
    try:
        if path.is_dir():
            found, ckpt = load_given(path)
            raw = None
        else:
            raw = load_raw(path)
            found, ckpt = path, None
            if isinstance(raw, dict) and "model_name" in raw and "model" in raw:
                ckpt = checkpoint_from_raw(raw, path)
    except CheckpointError as e:
        raise _init_error(str(e)) from None
    if ckpt is not None:
        if threedspeaker:
            raise ConfigError(
                f"config key 'train.init_3dspeaker' ({threedspeaker}): {found} is a speakerlab checkpoint, "
                "not a 3D-Speaker state dict; leave train.init_3dspeaker out"
            )
        return InitSource(
            path=found,
            kind="speakerlab",
            model_name=ckpt.model_name,
            model_args=ckpt.model_args,
            weights=ckpt.model,
            features=ckpt.features,
            speakers=ckpt.speakers,
            classifier=ckpt.classifier,
            loss=(ckpt.config.get("loss") or {}).get("name", "aam"),
        )
    if isinstance(raw, Mapping) and "model_config" in raw and "state_dict" in raw:
        return _redimnet2(path, raw)
    if threedspeaker:
        return _threedspeaker(path, raw, threedspeaker)
    raise _init_error(
        f"{path} is neither a speakerlab checkpoint nor a ReDimNet2 release ({{model_config, state_dict}}); for a "
        "3D-Speaker state dict set train.init_3dspeaker to its model (recipes: --3dspeaker NAME --weights FILE)"
    )


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively: a YAML list and a builder's tuple default compare equal."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _redimnet2(path: Path, raw: Mapping) -> InitSource:
    """A release's model_config -> the registered size (b0-b6) of the same stages, and its arguments."""
    try:
        kwargs = redimnet2_kwargs(raw["model_config"])
    except ValueError as e:
        raise _init_error(f"{path}: {e}") from None
    want = (kwargs["channels"], _plain(kwargs["stages"]))
    size = next((s for s, r in RELEASES.items() if (r["channels"], _plain(r["stages"])) == want), None)
    if size is None:
        raise _init_error(f"{path}: its ReDimNet2 stages (C={kwargs['channels']}) are none of the sizes b0-b6")
    for key, only in (("group_divisor", 1), ("global_context_att", True), ("emb_bn", False)):
        if kwargs[key] != only:
            raise _init_error(f"{path}: ReDimNet2 {key}={kwargs[key]!r}; the registered sizes take only {only!r}")
    args = {k: kwargs[k] for k in ("feat_dim", "embedding_size", "out_channels", "return_2d_output", "agg_gnorm")}
    weights = {k: v for k, v in raw["state_dict"].items() if not k.startswith("spec.")}  # the front-end's buffers
    return InitSource(
        path=path, kind="redimnet2", model_name=f"redimnet2_{size}", model_args=args, weights=weights, features=None
    )


def _threedspeaker(path: Path, raw: Any, name: str) -> InitSource:
    """A 3D-Speaker state dict: the embedding size read from its last matrix (every zoo model ends in the
    embedding projection); the other arguments are implied by the model name or given in model.args."""
    if name not in list_models():
        raise ConfigError(f"config key 'train.init_3dspeaker': unknown model {name!r}; registered: {list_models()}")
    if not isinstance(raw, Mapping):
        raise _init_error(f"{path} holds a {type(raw).__name__}, not a state dict")
    state = dict(unwrap_state_dict(raw))
    mats = [v for v in state.values() if isinstance(v, torch.Tensor) and v.ndim >= 2]
    args = {"embedding_size": int(mats[-1].shape[0])} if mats and "embedding_size" in builder_defaults(name) else {}
    return InitSource(
        path=path, kind="3dspeaker", model_name=name, model_args=args, weights=state, features=THREEDSPEAKER_FEATURES
    )


def resolve_model(cfg: Config) -> InitSource:
    """Fill `cfg.model` from `train.init` (see the module docstring); returns the source read."""
    src = read_source(cfg.train.init, cfg.train.init_3dspeaker)
    model = cfg.model

    def conflict(key: str, ours: Any, theirs: Any) -> ConfigError:
        return ConfigError(
            f"config key {key}: {ours!r} in the config, {theirs!r} in {src.path} (train.init takes the model "
            f"from there: leave {key} out of the config, or make them agree)"
        )

    if model.name and model.name != src.model_name:
        raise conflict("model.name", model.name, src.model_name)
    if src.model_args.get("lora") and "lora" in model.args and not model.args["lora"]:
        src = _merge_lora(src)  # the joint stage after a LoRA stage: the adapters become encoder weights
    # A speakerlab or ReDimNet2 source was built with its arguments and the builder's defaults; a 3D-Speaker
    # state dict tells only its embedding size (the rest is checked against its shapes below).
    theirs = dict(src.model_args)
    if src.kind != "3dspeaker":
        theirs = {**builder_defaults(src.model_name), **theirs}
    ours = dict(model.args)
    if "pretrained" in theirs and theirs["pretrained"] is None:
        # An SSL checkpoint stores its encoder's config, not the directory it was first read from: the weights
        # come from the checkpoint, the config's directory is not read.
        ours.pop("pretrained", None)
    for key, value in ours.items():
        if key in theirs and _plain(value) != _plain(theirs[key]):
            raise conflict(f"model.args.{key}", value, _plain(theirs[key]))
    model.name, model.args = src.model_name, {**src.model_args, **ours}
    if model_args_problems(model.name, model.args):
        return src  # the caller names the key
    _check_features(cfg, src)
    _check_fits(src, model.name, model.args)
    if cfg.train.init_match_speakers and src.classifier is None:
        raise ConfigError(
            f"config key 'train.init_match_speakers': {src.path} has no classifier (only speakerlab training "
            "checkpoints have one)"
        )
    return src


def _merge_lora(src: InitSource) -> InitSource:
    """A source trained with LoRA adapters -> the same model without them, the adapters merged into the
    encoder weights (model.args.lora: null in the config that starts from it)."""
    net = build_model(src.model_name, **src.model_args)
    net.load_state_dict(src.weights)
    net.merge_lora()
    args = {k: v for k, v in src.model_args.items() if k != "lora"}
    return dataclasses.replace(src, model_args=args, weights=net.state_dict())


def _check_features(cfg: Config, src: InitSource) -> None:
    have = feature_spec(cfg.features, cfg.data.sample_rate)
    feat_dim = {**builder_defaults(cfg.model.name), **cfg.model.args}.get("feat_dim", have.feat_dim)
    pairs = [("features.num_mel_bins", have.feat_dim, feat_dim, "model.args.feat_dim")]
    if src.features is not None and (have.kind != "kaldi_fbank" or src.features.kind != "kaldi_fbank"):
        if have != src.features:  # other front-end kinds: the whole spec must agree
            raise ConfigError(
                f"config key features: {have} in the config, {src.features} in {src.path} (the features the "
                "model was trained on)"
            )
    elif src.features is not None:
        trained = "the features the model was trained on"
        a, b = have.fbank, src.features.fbank
        pairs += [
            (f"features.{k}", getattr(a, k), getattr(b, k), trained)
            for k in ("num_mel_bins", "frame_length_ms", "frame_shift_ms", "window_type")
        ]
        pairs += [("data.sample_rate", a.sample_rate, b.sample_rate, "the model's sample rate")]
        pairs += [("features.mean_norm", have.mean_norm, src.features.mean_norm, trained)]
    for key, ours, theirs, what in pairs:
        if ours != theirs:
            raise ConfigError(f"config key {key}: {ours!r} in the config, {theirs!r} in {src.path} ({what})")


def _check_fits(src: InitSource, name: str, args: Dict[str, Any]) -> None:
    """Every key of the model's state dict in the source, with its shape, and no other (on the meta device:
    no memory, no time)."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_model(name, **args).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in src.weights.items() if isinstance(v, torch.Tensor)}
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [f"{k}: {got[k]} in the file, {s} in the model" for k, s in expected.items() if got.get(k, s) != s]
    if problems:
        shown = "; ".join(problems[:4]) + (f"; ... ({len(problems)} problems)" if len(problems) > 4 else "")
        hint = " (set model.args to the release's, e.g. model.args.embedding_size)" if src.kind == "3dspeaker" else ""
        raise _init_error(f"the weights of {src.path} do not fit model {name} with args {args}{hint}: {shown}")


def initialise(run) -> None:
    """A fresh run's starting weights from `train.init` (see the module docstring). `run`: the
    speakerlab.train.build.Run (not imported: build imports this module to resolve the config)."""
    cfg = run.cfg
    src = read_source(cfg.train.init, cfg.train.init_3dspeaker)
    if src.model_args.get("lora") and not cfg.model.args.get("lora"):
        src = _merge_lora(src)
        run.monitor.log(f"{src.path}: LoRA adapters merged into the encoder weights")
    run.raw.model.load_state_dict(src.weights)
    clf = run.raw.classifier
    if src.classifier is not None and src.speakers == run.speakers and src.loss == cfg.loss.name:
        clf.load_state_dict(src.classifier)
        what = f"classifier kept ({len(run.speakers)} speakers, as in the source)"
    else:
        what = f"new classifier for {len(run.speakers)} speakers"
        if cfg.train.init_match_speakers:
            old = {s: i for i, s in enumerate(src.speakers)}
            rows = [(i, old[s]) for i, s in enumerate(run.speakers) if s in old]
            if rows:
                new_idx, old_idx = torch.tensor(rows).T
                with torch.no_grad():
                    clf.weight[new_idx.to(clf.weight.device)] = src.classifier["weight"][old_idx].to(clf.weight)
            what += f", {len(rows)} of them (same speaker id) starting from the source's rows"
    run.monitor.log(f"initialised from {src.path} ({src.kind} {src.model_name}); {what}")
    if src.features is None:
        run.monitor.log(
            f"note: {src.path} was trained on its own log-mel front-end (speakerlab.features.redimnet); fine-tuning "
            "adapts it to this run's fbank (features.*)"
        )
    if run.info.is_main:
        spec = feature_spec(cfg.features, cfg.data.sample_rate)
        ckpt = Checkpoint(
            model_name=cfg.model.name,
            model_args=dict(cfg.model.args),
            model=run.raw.model.state_dict(),
            features=spec,
            config=cfg.to_dict(),
        )
        save_checkpoint(run.exp_dir / "pretrained.pt", ckpt)
