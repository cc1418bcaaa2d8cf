"""Experiment configuration: YAML (safe_load) -> typed, validated settings.

A config file has the sections below; every key is optional except `data.train` and `model.name`.
Unknown keys and wrong types are errors that name the dotted key. Dotted overrides from the command
line (`train.epochs=2`, `model.args.embedding_size=192`) are parsed as YAML scalars and validated
the same way. Runtime values (world size, per-device batch, accumulation) are never written back
here: they are passed around as arguments and logged.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Union

import yaml

from speakerlab.augment_settings import AugmentSettings
from speakerlab.frontends import FRONT_ENDS, FeatureSettings, feature_spec
from speakerlab.hardware_settings import HardwareSettings
from speakerlab.objectives import DinoSettings, check_dino
from speakerlab.outputs import output_file
from speakerlab.settings import (
    ConfigError,
    auto_or_bool,
    build_settings,
    merge_mappings,
    parse_overrides,
    read_yaml,
    set_dotted,
    setting,
)

# Training objectives that learn without speaker labels (loss.name); the others classify the speakers of utt2spk.
SELF_SUPERVISED = ("dino",)


def needs_labels(cfg: "Config") -> bool:
    """Whether the run's objective trains on the speakers of utt2spk (config data.labels, loss.name)."""
    return cfg.loss.name not in SELF_SUPERVISED


@dataclass
class TrainCorpus:
    """One corpus of data.train given as a list (speakerlab.train.inputs.loader reads them)."""

    name: str = ""  # speaker-id namespace: its speakers are `name/spk` (two corpora's id00012 stay two speakers)
    dir: str = ""  # Kaldi data dir with wav.scp, utt2spk
    weight: float = setting(1.0, gt=0)  # passes over the corpus per epoch: each epoch draws round(weight x N)
    # of its N utterances (weight <= 1: a random subset without repeats; 2: every utterance twice), anew each epoch
    val: Optional[str] = None  # data dir with trials scored for this corpus every train.val_every epochs


@dataclass
class DataSettings:
    # Kaldi data dir with wav.scp, utt2spk (required); or several corpora: a list of {name, dir, weight, val}
    # records (TrainCorpus), or the path of a YAML file holding that list (a manifest)
    train: Union[str, List[TrainCorpus]] = ""
    val: Optional[str] = None  # data dir with trials, scored every train.val_every epochs
    sample_rate: int = setting(16000, ge=1000, le=384000)
    crop_seconds: float = setting(2.0, gt=0)  # random training crop; shorter utterances are repeated
    check_audio: bool = False  # re-read every header at start even with utt2num_samples
    feats: Union[bool, str] = setting(False, check=auto_or_bool)  # train from <train>/feats.scp
    # (speakerlab.features.store); no augmentation or speed perturbation then. auto: the store when the front end
    # is one it holds (Kaldi fbank, also when train.init brings it) and nothing augments; else the audio
    on_bad_audio: str = setting("skip", choices=("skip", "stop"))  # a crop that fails to read mid-training:
    # skip: the row leaves its batch, counted and named in the log; stop: the run ends (checkpoints intact)
    max_bad_audio: int = setting(100, ge=0)  # skip: stop anyway past this many failed reads (a lost mount,
    # not a few broken files)
    shards: Optional[str] = None  # stream tar shards of data.train from this dir (speakerlab-shards);
    # data.train's lists must be those the shards were written from; its audio is not read
    shuffle_buffer: int = setting(1000, ge=1)  # data.shards: samples each loader worker shuffles among
    labels: Union[bool, str] = setting("auto", check=auto_or_bool)  # the speakers of utt2spk: auto, read when the
    # objective needs them (loss.name aam, sphereface2) and ignored by a self-supervised one (dino), whose data dirs
    # may have no utt2spk; false: ignored (a labelled corpus trained on as unlabelled); true: required


@dataclass
class ModelSettings:
    name: str = ""  # a registered builder, see speakerlab.models.list_models() (required)
    args: Dict[str, Any] = setting({})  # its keyword arguments, checked against the builder's signature


@dataclass
class LossSettings:
    # classifier head: additive angular margin | SphereFace2; or dino, self-distillation without speaker labels
    # (its settings: the dino section)
    name: str = setting("aam", choices=("aam", "sphereface2", *SELF_SUPERVISED))
    scale: float = setting(32.0, gt=0)  # cosine logits are multiplied by this
    margin: float = setting(0.2, ge=0, lt=1.5708)  # final margin: angular (aam, radians) or cosine (sphereface2)
    margin_start_epoch: float = setting(0.0, ge=0)  # margin is 0 before this epoch ...
    margin_warmup_epochs: float = setting(0.0, ge=0)  # ... then rises linearly to `margin` over this many
    sphereface2_lambda: float = setting(0.7, gt=0, lt=1)  # sphereface2: weight of the positive term
    sphereface2_t: int = setting(3, ge=1)  # sphereface2: exponent of the similarity adjustment
    subcenters: int = setting(1, ge=1)  # aam: directions per speaker, its cosine the nearest's (sub-center ArcFace)
    inter_topk: int = setting(0, ge=0)  # aam: the k hardest non-target speakers get an extra margin (inter-top-k)
    inter_topk_margin: float = setting(0.06, ge=0, lt=1.5708)  # ... of this at the final margin (rising with it)
    # Large speaker sets (speakerlab.train.losses.sharded): each rank holds 1/W of the classifier rows (same results);
    # sample_rate < 1: Partial FC, each step's softmax over the batch's speakers and this share of the others
    shard_classes: bool = False
    sample_rate: float = setting(1.0, gt=0, le=1)


@dataclass
class OptimSettings:
    name: str = setting("sgd", choices=("sgd", "adam", "adamw"))  # sgd: the published recipes
    lr: float = setting(0.1, gt=0)  # peak LR for the global batch of train.global_batch_size
    min_lr: float = setting(1e-4, ge=0)  # end of the cosine decay (<= lr)
    momentum: float = setting(0.9, ge=0, lt=1)  # sgd only
    nesterov: bool = True  # sgd only
    weight_decay: float = setting(1e-4, ge=0)
    warmup_epochs: float = setting(1.0, ge=0)
    backbone_lr_scale: float = setting(1.0, gt=0)  # the embedding model's LR is this x the classifier's (fine-tuning
    # a pretrained trunk: < 1); an SSL encoder's is further x encoder_lr_scale (below)
    # Models on a self-supervised encoder (speakerlab.models.ssl) only: the encoder's LR is lr x encoder_lr_scale,
    # and its layer i of L (1-based; 0: everything before the layers) gets another layer_decay ** (L - i).
    encoder_lr_scale: float = setting(1.0, ge=0)
    layer_decay: float = setting(1.0, gt=0, le=1)


# The parts a freeze rule may name (speakerlab.train.optim.freeze finds their parameters).
FREEZE_PARTS = ("trunk", "encoder")


def _parts(v) -> Optional[str]:
    if not v or len(set(v)) != len(v) or any(m not in FREEZE_PARTS for m in v):
        return f"must list distinct parts among {', '.join(FREEZE_PARTS)}, got {v}"
    return None


def _until_epoch(v) -> Optional[str]:
    if v == "end" or (isinstance(v, int) and v >= 0):
        return None
    return f"must be an epoch count >= 0 or end (the whole run), got {v!r}"


@dataclass
class FreezeRule:
    """One rule of train.freeze: `modules` take no gradient from step 0 until exactly one bound."""

    modules: List[str] = setting([], check=_parts)
    until_epoch: Optional[Union[int, str]] = setting(None, check=_until_epoch)  # the first this many epochs;
    # end: the whole run
    until_step: Optional[int] = setting(None, ge=0)  # the first this many optimizer steps


def _encoder_rule(steps: int) -> Dict[str, Any]:
    """The freeze rule of the retired train.freeze_encoder_steps (-1: the whole run)."""
    return {"modules": ["encoder"], **({"until_epoch": "end"} if steps < 0 else {"until_step": steps})}


@dataclass
class TrainSettings:
    epochs: int = setting(10, ge=1)
    global_batch_size: int = setting(256, ge=1)  # fixed across hardware: per-device x world x accumulation
    seed: int = setting(42, ge=0)
    max_grad_norm: float = setting(5.0, ge=0)  # 0 disables clipping
    max_consecutive_skips: int = setting(10, ge=1)  # non-finite steps in a row before training stops
    save_every_steps: int = setting(200, ge=0)  # mid-epoch checkpoint interval (optimizer steps); 0: epoch ends
    keep_checkpoints: int = setting(5, ge=1)  # epoch checkpoints kept (for averaging the last N)
    log_every_steps: int = setting(10, ge=1)  # also when the guard's verdicts and stop signals are read
    val_every: int = setting(1, ge=1)  # epochs between validation EERs (needs data.val)
    keep_best: bool = False  # with data.val, model selection: the validation EER of train.init's model before the
    # first step and after each validated epoch; the lowest so far is checkpoints/best.pt, the run's result
    patience: int = setting(0, ge=0)  # with keep_best: stop early after this many validations in a row without a
    # lower EER than the best so far (0: never); a stopped run stays stopped when re-run
    init: Optional[str] = None  # start from a pretrained model (speakerlab.train.state.init): a checkpoint or exp dir,
    # a ReDimNet2 release file, or a 3D-Speaker state dict (with init_3dspeaker); ignored once the run has its own
    # checkpoint. model.name / model.args may then be left out: they are taken from it
    init_3dspeaker: Optional[str] = None  # train.init is a 3D-Speaker state dict of this registered model (campplus)
    init_match_speakers: bool = False  # new speaker set: start the classifier rows of speakers the init checkpoint
    # also had (same id) from its classifier
    # Parts of the network that take no gradient from the start until a bound (speakerlab.train.optim.freeze): a part
    # is frozen while any rule naming it holds. trunk, the whole embedding model (with train.init: the new
    # classifier settles before the pretrained trunk moves; BatchNorm statistics kept, dropout off); encoder, a
    # self-supervised model's encoder (its back-end and the classifier train). E.g.
    #   freeze: [{modules: [trunk], until_epoch: 1}, {modules: [encoder], until_step: 2000}]
    freeze: List[FreezeRule] = setting([])

    # Keys this section no longer takes -> (the new key, old value -> new value) (speakerlab.settings).
    RENAMED: ClassVar[Dict[str, Tuple[str, Callable[[Any], Any]]]] = {
        "freeze_epochs": ("freeze", lambda n: [{"modules": ["trunk"], "until_epoch": n}] if n else []),
        "freeze_encoder_steps": ("freeze", lambda n: [_encoder_rule(n)] if n else []),
    }


@dataclass
class Config:
    data: DataSettings = field(default_factory=DataSettings)
    augment: AugmentSettings = field(default_factory=AugmentSettings)
    features: FeatureSettings = field(default_factory=FeatureSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    loss: LossSettings = field(default_factory=LossSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    hardware: HardwareSettings = field(default_factory=HardwareSettings)
    dino: DinoSettings = field(default_factory=DinoSettings)  # loss.name dino (speakerlab.objectives)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _validate(cfg: Config) -> None:
    """Rules that tie several fields together (single-field rules sit next to their field)."""
    if not cfg.model.name and not cfg.train.init:
        raise ConfigError("config key 'model.name' is required (or train.init, a pretrained model to take it from)")
    for key, value, needs in (
        ("train.init_3dspeaker", cfg.train.init_3dspeaker, "the 3D-Speaker state dict"),
        ("train.init_match_speakers", cfg.train.init_match_speakers, "the checkpoint whose classifier rows to copy"),
    ):
        if value and not cfg.train.init:
            raise ConfigError(f"config key '{key}' ({value}) needs train.init ({needs})")
    _validate_freeze(cfg)
    _validate_labels(cfg)
    if cfg.loss.name != "aam" and (cfg.loss.subcenters > 1 or cfg.loss.inter_topk):
        raise ConfigError("config key 'loss.subcenters' / 'loss.inter_topk': sub-centers and inter-top-k are aam's")
    if not cfg.data.train:
        raise ConfigError("config key 'data.train' is required")
    if cfg.optim.min_lr > cfg.optim.lr:
        raise ConfigError(f"config key 'optim.min_lr' ({cfg.optim.min_lr:g}) must be <= optim.lr ({cfg.optim.lr:g})")
    if cfg.optim.name == "sgd" and cfg.optim.nesterov and cfg.optim.momentum == 0:
        raise ConfigError("config key 'optim.nesterov': Nesterov momentum needs optim.momentum > 0; set it false")
    if cfg.data.feats is True and audio_augmented(cfg):
        raise ConfigError(
            "config key 'data.feats': stored features cannot be augmented; unset augment.lists and set "
            "augment.speed_prob, augment.channel_prob and augment.short_prob to 0"
        )
    if cfg.data.shards and cfg.data.feats is True:
        raise ConfigError(
            "config key 'data.shards': tar shards hold audio, stored features are read from data.train; "
            "set one of data.shards and data.feats"
        )
    check_features(cfg)
    if cfg.augment.speed_prob > 0 and all(f == 1.0 for f in cfg.augment.speed_factors):
        raise ConfigError(
            f"config key 'augment.speed_factors' needs a factor other than 1 when "
            f"augment.speed_prob > 0, got {cfg.augment.speed_factors}"
        )


def _validate_labels(cfg: Config) -> None:
    """data.labels against the objective: a labelled objective cannot ignore the labels, a self-supervised one
    never reads them."""
    if cfg.data.labels is False and needs_labels(cfg):
        raise ConfigError(
            f"config key 'data.labels' (false): loss.name {cfg.loss.name} classifies speakers and needs their labels; "
            f"to learn without them set loss.name to {' or '.join(SELF_SUPERVISED)}"
        )
    if cfg.data.labels is True and not needs_labels(cfg):
        raise ConfigError(
            f"config key 'data.labels' (true): loss.name {cfg.loss.name} learns without speaker labels and reads no "
            "utt2spk; set data.labels to auto or false, or a labelled loss.name (aam, sphereface2)"
        )
    if needs_labels(cfg):
        return
    check_dino(cfg.dino, cfg.data.crop_seconds)
    if cfg.data.feats is True:
        raise ConfigError(
            "config key 'data.feats': loss.name dino cuts its crops from the audio, not from stored "
            "features; unset data.feats"
        )


def _validate_freeze(cfg: Config) -> None:
    """Each train.freeze rule: exactly one bound, within train.epochs; a frozen trunk needs the pretrained
    model to keep fixed. (A bound in steps beyond the run, or an encoder the model lacks, is known when the run
    is built: speakerlab.train.optim.freeze.)"""
    for i, rule in enumerate(cfg.train.freeze):
        key = f"train.freeze[{i}]"
        if not rule.modules:
            raise ConfigError(f"config key '{key}.modules' is required: parts among {', '.join(FREEZE_PARTS)}")
        if (rule.until_epoch is None) == (rule.until_step is None):
            both = "not both" if rule.until_epoch is not None else "one is required"
            raise ConfigError(f"config key '{key}.until_epoch' or '{key}.until_step': give one bound ({both})")
        if isinstance(rule.until_epoch, int) and rule.until_epoch > cfg.train.epochs:
            raise ConfigError(
                f"config key '{key}.until_epoch' ({rule.until_epoch}) must be <= train.epochs ({cfg.train.epochs}); "
                "the whole run: end"
            )
        if "trunk" in rule.modules and not cfg.train.init:
            raise ConfigError(
                f"config key '{key}.modules' ({', '.join(rule.modules)}): trunk needs train.init (the pretrained "
                "model to keep fixed)"
            )


def audio_augmented(cfg: Config) -> bool:
    """Whether training changes the audio (noise lists, speed, channels, short crops): the store cannot serve it."""
    a = cfg.augment
    return bool(a.lists) or a.speed_prob > 0 or a.channel_prob > 0 or a.short_prob > 0


def check_features(cfg: Config) -> None:
    """The front-end's rules (its kind's, speakerlab.frontends) and what the feature store can hold; data.feats
    auto becomes true or false here. With train.init and no features.kind, the kind is the pretrained model's:
    speakerlab.train.state.init checks the section once it has filled it."""
    if cfg.train.init and cfg.features.kind is None:
        return
    kind = feature_spec(cfg.features, cfg.data.sample_rate).kind
    if cfg.data.feats == "auto":
        cfg.data.feats = (
            FRONT_ENDS[kind].storable and not audio_augmented(cfg) and not cfg.data.shards and needs_labels(cfg)
        )
    if cfg.data.feats and not FRONT_ENDS[kind].storable:
        raise ConfigError(
            f"config key 'data.feats': the feature store holds Kaldi fbank, the front-end is {kind} (computed from "
            "the audio); set data.feats to false"
        )


def load_config(
    path: Optional[Union[str, Path, List]] = None,
    overrides: Optional[List[str]] = None,
    hardware: Optional[Union[str, Path]] = None,
    raw: Optional[Dict[str, Any]] = None,
) -> Config:
    """Load a YAML config, apply a hardware profile and dotted overrides, and validate.

    `path` may be a list: later files are overlays deep-merged onto earlier ones (e.g. a base
    recipe config, then conf/finetune_lm.yaml).

    `hardware` is a profile name under conf/hardware/ or a YAML path; its keys fill the `hardware`
    section (the experiment file's own `hardware` keys, then overrides, win over the profile).
    Errors name the key and, for YAML problems, the file and line.
    """
    paths = [] if path is None else ([path] if isinstance(path, (str, Path)) else list(path))
    if raw is None:
        raw = {}
        for p in paths:
            raw = merge_mappings(raw, _read_sections(Path(p)))
    raw = copy.deepcopy(raw)
    if hardware:
        profile = _read_sections(resolve_hardware(hardware))
        merged = dict(profile)
        merged.update(raw.get("hardware") or {})
        raw["hardware"] = merged
    where = f" in {', '.join(map(str, paths))}" if paths else ""
    if hardware:
        where += f" (hardware profile {hardware})"
    try:  # the files alone first, so that a bad value is blamed on the file or on the override
        build_settings(Config, raw)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None
    items = overrides or []
    for key, value in parse_overrides(items):
        set_dotted(raw, key, value)
    try:
        cfg = build_settings(Config, raw)
    except ConfigError as e:
        raise ConfigError(f"{e} in the command-line overrides {' '.join(items)}") from None
    try:
        _validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}{' with overrides ' + ' '.join(items) if items else ''}") from None
    return cfg


def save_config(cfg: Config, path: Union[str, Path]) -> None:
    """`cfg` as YAML at `path` (speakerlab.outputs.output_file: whole, a device written through)."""
    with output_file(path) as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)


def resolve_hardware(name_or_path: Union[str, Path]) -> Path:
    """A hardware profile: a YAML path, or a name among the shipped profiles (`conf/hardware/NAME.yaml`, which
    the package also carries as `speakerlab/hardware/`, so an installed package resolves the names too)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    shipped = Path(str(resources.files("speakerlab") / "hardware"))
    profile = shipped / f"{name_or_path}.yaml"
    if not profile.exists():
        known = sorted(q.stem for q in shipped.glob("*.yaml"))
        raise ConfigError(f"unknown hardware profile {str(name_or_path)!r}; known: {', '.join(known)}")
    return profile


def _read_sections(path: Path) -> Dict[str, Any]:
    data = read_yaml(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    return data
