"""Where a run's weights start: a pretrained model (`train.init`), or from scratch.

    train.init: exp/pretrain             # a speakerlab exp dir (its newest intact checkpoint), or a checkpoint file
    train.init: b2-vox2-ptn.pt           # a ReDimNet2 release: {"model_config": ..., "state_dict": ...}
    train.init: campplus_cn_common.bin   # a 3D-Speaker state dict ...
    train.init_3dspeaker: campplus       # ... of this registered model

`resolve_config(cfg)` runs when the config is loaded, before anything is built, and reads the source (through
speakerlab.sources, the reader inference uses too) once: the `model` and `features` sections come from it, so a
source fine-tunes with the model, sizes and front-end it embeds with. `model.name`, each `model.args` key and
each `features` key may be left out of the config; one that is given must agree, else a ConfigError names it.
The resolved sections are what the run records (config.yaml, checkpoints). A LoRA source fine-tuned with
`model.args.lora: null` is merged there, once. The Source goes on to `initialise`: the file is not read again.

`initialise(run)`, for a run without a checkpoint of its own, loads the embedding model's weights (strictly).
The classifier is the source's when that is a speakerlab checkpoint of the same speakers and head
(large-margin fine-tuning, recipe stage 7); otherwise it is new, for the run's speakers, and with
`train.init_match_speakers` the rows of speakers the source also had (same id: the checkpoint's speaker list,
namespaced `name/spk` for runs on several corpora, speakerlab.dataio.tables.corpora) start from the source's; the
others, speakers the source never saw, keep the fresh head's random rows (xavier-uniform, as in a run from
scratch), so a pre-training on VoxBlink2 + VoxCeleb2 fine-tuned on VoxCeleb2 alone (or its large-margin stage on a
subset of the speakers) starts every known speaker where the pre-training left it. Sub-centers and shards:
speakerlab.train.losses.sharded_state.start_rows. The initialised model goes to `<exp>/pretrained.pt` (no classifier):
recipes embed with it to show the EER before fine-tuning. Keeping the pretrained trunk fixed while the new
classifier settles: `train.freeze` (a `trunk` rule, speakerlab.train.optim.freeze).
"""

from __future__ import annotations

from typing import Any, Optional

from speakerlab.checkpoint import Checkpoint, save_checkpoint
from speakerlab.config import SELF_SUPERVISED, Config, ConfigError, check_features, needs_labels
from speakerlab.frontends import feature_spec, section_keys
from speakerlab.models import model_args_problems
from speakerlab.sources import Source, SourceError, plain, read_source
from speakerlab.train.losses.sharded_state import start_rows


def resolve_config(cfg: Config) -> Optional[Source]:
    """Complete `cfg` in place: the model and features sections from `train.init` when it is set (see the module
    docstring), every features key written out (the kind's defaults); returns the source read, or None."""
    src = _resolve_init(cfg) if cfg.train.init else None
    for key, value in section_keys(feature_spec(cfg.features, cfg.data.sample_rate)).items():
        setattr(cfg.features, key, value)
    return src


def _conflict(src: Source, key: str, ours: Any, theirs: Any, why: str = "") -> ConfigError:
    why = why or f"train.init takes it from there: leave {key} out of the config, or make them agree"
    return ConfigError(f"config key {key}: {ours!r} in the config, {theirs!r} in {src.path} ({why})")


def _resolve_init(cfg: Config) -> Source:
    try:
        src = read_source(cfg.train.init, cfg.train.init_3dspeaker)
    except SourceError as e:
        raise ConfigError(f"config key 'train.{'init_3dspeaker' if e.about == 'name' else 'init'}': {e}") from None
    model = cfg.model
    if model.name and model.name != src.model_name:
        raise _conflict(src, "model.name", model.name, src.model_name)
    if "lora" in model.args and not model.args["lora"]:
        src = src.merged()  # the joint stage after a LoRA stage: the adapters become encoder weights
    theirs, ours = src.pinned_args(), dict(model.args)
    if "pretrained" in theirs and theirs["pretrained"] is None:
        # An SSL checkpoint stores its encoder's config, not the directory it was first read from: the weights
        # come from the checkpoint, the config's directory is not read.
        ours.pop("pretrained", None)
    for key, value in ours.items():
        if key in theirs and plain(value) != plain(theirs[key]):
            raise _conflict(src, f"model.args.{key}", value, plain(theirs[key]))
    model.name, model.args = src.model_name, {**src.model_args, **ours}
    _take_features(cfg, src)
    if model_args_problems(model.name, model.args):
        return src  # the caller names the key
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    feat_dim = {**src.pinned_args(), **model.args}.get("feat_dim", spec.feat_dim)
    if feat_dim != spec.feat_dim:
        raise _conflict(src, "model.args.feat_dim", feat_dim, spec.feat_dim, f"the width of its {spec.kind} features")
    problem = src.fit_problem(model.name, model.args)
    if problem:
        hint = " (set model.args to the release's, e.g. model.args.embedding_size)" if src.kind == "3dspeaker" else ""
        raise ConfigError(
            f"config key 'train.init': the weights of {src.path} do not fit model {model.name} with args "
            f"{model.args}{hint}: {problem}"
        )
    if cfg.train.init_match_speakers and src.classifier is None:
        raise ConfigError(
            f"config key 'train.init_match_speakers': {src.path} has no classifier (only speakerlab training "
            "checkpoints have one)"
        )
    if cfg.train.init_match_speakers and src.loss in SELF_SUPERVISED:
        raise ConfigError(
            f"config key 'train.init_match_speakers': {src.path} was trained without speaker labels (loss.name "
            f"{src.loss}): it has no speaker rows to start from; leave train.init_match_speakers out"
        )
    return src


def _take_features(cfg: Config, src: Source) -> None:
    """The features section from the source's front-end: a key the config gives must agree."""
    if cfg.data.sample_rate != src.features.sample_rate:
        raise _conflict(
            src, "data.sample_rate", cfg.data.sample_rate, src.features.sample_rate, "the model's sample rate"
        )
    try:
        theirs = section_keys(src.features)
    except ValueError as e:
        raise ConfigError(f"config key 'train.init': {src.path}: its front-end cannot be configured: {e}") from None
    for key, value in theirs.items():
        ours = getattr(cfg.features, key)
        if ours is not None and plain(ours) != plain(value):
            raise _conflict(src, f"features.{key}", ours, value)
        setattr(cfg.features, key, value)
    check_features(cfg)  # the kind's rules over the whole section, and what the feature store can hold


def initialise(run) -> None:
    """A fresh run's starting weights from `run.init`, the source `resolve_config` read (see the module
    docstring); the run lets go of it afterwards. `run`: the speakerlab.train.build.Run (not imported: build
    imports this module to resolve the config)."""
    cfg, src = run.cfg, run.init
    if src is None:
        raise RuntimeError("train.init is set but the run holds no source: load the config with load_train_config")
    run.init = None  # its weights are in the model now: no second copy for the whole run
    if src.lora_merged:
        run.monitor.log(f"{src.path}: LoRA adapters merged into the encoder weights")
    run.raw.model.load_state_dict(src.weights)
    clf = run.raw.classifier
    rows = len(run.speakers) * getattr(clf, "subcenters", 1)
    same_head = src.loss == cfg.loss.name and src.classifier is not None and src.classifier.get("weight") is not None
    same_head = same_head and src.classifier["weight"].shape[0] == rows
    if not needs_labels(cfg):  # DINO: its teacher starts as this model at the first step
        what = "new DINO head and teacher"
    elif same_head and src.speakers == run.speakers:
        clf.load_state_dict(src.classifier)  # a sharded head takes its own rows
        what = f"classifier kept ({len(run.speakers)} speakers, as in the source)"
    else:
        what = f"new classifier for {len(run.speakers)} speakers"
        if cfg.train.init_match_speakers:
            old = {s: i for i, s in enumerate(src.speakers)}
            pairs = [(i, old[s]) for i, s in enumerate(run.speakers) if s in old]
            start_rows(clf, src.classifier, len(src.speakers), pairs)
            what += (
                f", {len(pairs)} of them (same speaker id) starting from the source's rows, "
                f"{len(run.speakers) - len(pairs)} new ones from a fresh head's random rows"
            )
    spec = feature_spec(cfg.features, cfg.data.sample_rate)
    run.monitor.log(f"initialised from {src.path} ({src.kind} {src.model_name}); {what}; front-end {spec.describe()}")
    if run.info.is_main:
        ckpt = Checkpoint(
            model_name=cfg.model.name,
            model_args=dict(cfg.model.args),
            model=run.raw.model.state_dict(),
            features=spec,
            config=cfg.to_dict(),
        )
        save_checkpoint(run.exp_dir / "pretrained.pt", ckpt)
