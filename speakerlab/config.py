"""Experiment configuration: YAML (safe_load) -> typed, validated settings.

A config file has the sections below; every key is optional except `data.train` and `model.name`.
Unknown keys and wrong types are errors that name the dotted key. Dotted overrides from the command
line (`train.epochs=2`, `model.args.embedding_size=192`) are parsed as YAML scalars and validated
the same way. Runtime values (world size, per-device batch, accumulation) are never written back
here: they are passed around as arguments and logged.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

from speakerlab.augment import DEFAULT_BABBLE_SPEAKERS, DEFAULT_SNR, KINDS as AUGMENT_KINDS


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key (and file)."""


@dataclass
class DataSettings:
    train: str = ""                      # Kaldi data dir with wav.scp, utt2spk
    val: Optional[str] = None            # data dir with trials, scored every `train.val_every` epochs
    sample_rate: int = 16000
    crop_seconds: float = 2.0            # random training crop; shorter utterances are repeated
    check_audio: bool = False            # re-read every header at start even when utt2num_samples exists


@dataclass
class AugmentSettings:
    lists: Optional[str] = None          # folder of noise/music/babble/rirs.scp (musan_rirs prepare); null: off
    prob: float = 0.6                    # chance a training crop gets one augmentation (of `kinds`, uniformly)
    kinds: List[str] = field(default_factory=lambda: list(AUGMENT_KINDS))
    noise_snr: List[float] = field(default_factory=lambda: list(DEFAULT_SNR["noise"]))   # [0, 15] dB, uniform
    music_snr: List[float] = field(default_factory=lambda: list(DEFAULT_SNR["music"]))   # [5, 15] dB
    babble_snr: List[float] = field(default_factory=lambda: list(DEFAULT_SNR["babble"]))  # [13, 20] dB
    babble_speakers: List[int] = field(default_factory=lambda: list(DEFAULT_BABBLE_SPEAKERS))  # [3, 7] files summed
    reverb_noise_prob: float = 0.0       # chance a reverberated crop also gets one additive kind (room + noise)


@dataclass
class FeatureSettings:
    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    window_type: str = "povey"
    dither: float = 0.0                  # training only; extraction always uses 0
    mean_norm: bool = True               # per-utterance mean normalisation


@dataclass
class ModelSettings:
    name: str = ""                       # a registered builder, see speakerlab.models.list_models()
    args: Dict[str, Any] = field(default_factory=dict)


@dataclass
class LossSettings:
    name: str = "aam"                    # aam (additive angular margin softmax) | sphereface2
    scale: float = 32.0                  # cosine logits are multiplied by this
    margin: float = 0.2                  # final additive angular margin (radians)
    margin_start_epoch: float = 0.0      # margin is 0 before this epoch ...
    margin_warmup_epochs: float = 0.0    # ... then rises linearly to `margin` over this many epochs
    sphereface2_lambda: float = 0.7      # sphereface2: weight of the positive term (1 - it: the negatives)
    sphereface2_t: int = 3               # sphereface2: exponent of the similarity adjustment g


@dataclass
class OptimSettings:
    name: str = "sgd"                    # sgd (the published recipes) | adam | adamw (short CPU runs)
    lr: float = 0.1                      # peak LR for the global batch in train.global_batch_size
    min_lr: float = 1e-4
    momentum: float = 0.9                # sgd only
    nesterov: bool = True                # sgd only
    weight_decay: float = 1e-4
    warmup_epochs: float = 1.0


@dataclass
class TrainSettings:
    epochs: int = 10
    global_batch_size: int = 256         # fixed across hardware: per-device batch x world x accumulation
    seed: int = 42
    max_grad_norm: float = 5.0           # 0 disables clipping
    max_consecutive_skips: int = 10      # non-finite steps in a row before training stops
    save_every_steps: int = 200          # mid-epoch checkpoint interval (optimizer steps); 0: epoch ends only
    keep_checkpoints: int = 5            # epoch checkpoints kept (for averaging the last N)
    log_every_steps: int = 10
    val_every: int = 1                   # epochs between validation EERs (needs data.val)
    init_from: Optional[str] = None      # start from this checkpoint's model + classifier weights
                                         # (fine-tuning); ignored once the run has its own checkpoint


@dataclass
class HardwareSettings:
    device: str = "auto"                 # auto | cpu | cuda
    precision: str = "auto"              # auto | bf16 | fp16 | fp32
    tf32: bool = True                    # TF32 matmul/cuDNN on Ampere+ when running fp32 parts
    per_device_batch: Union[int, str] = "auto"   # 16..128 or auto (largest that fits)
    num_workers: int = 2
    pin_memory: bool = True
    prefetch_factor: int = 2
    dist_timeout_s: int = 1800           # process-group / barrier timeout
    memory_margin: float = 0.85          # auto batch: use at most this fraction of device memory


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

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_CHOICES = {
    "hardware.device": ("auto", "cpu", "cuda"),
    "hardware.precision": ("auto", "bf16", "fp16", "fp32"),
    "features.window_type": ("povey", "hamming", "hanning", "rectangular"),
    "optim.name": ("sgd", "adam", "adamw"),
    "loss.name": ("aam", "sphereface2"),
}


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_value(key: str, value: Any, tp) -> Any:
    """Return `value` converted to `tp` or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if origin is Union:
        errors = []
        for option in typing.get_args(tp):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_value(key, value, option)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"config key '{key}': {value!r} is not {_type_name(tp)}")
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}' must be a mapping, got {type(value).__name__}")
        return dict(value)
    if origin in (list, List):
        if not isinstance(value, list):
            raise ConfigError(f"config key '{key}' must be a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        return [_check_value(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)] if args else list(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{key}' must be true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key '{key}' must be a string, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}': unsupported type {tp}")


def _build(cls, raw: Dict[str, Any], prefix: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"config section '{prefix or '<top>'}' must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"unknown config key '{key}' (known in '{prefix or '<top>'}': {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in raw.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value if value is not None else {}, key)
            continue
        value = _check_value(key, value, tp)
        if key in _CHOICES and value not in _CHOICES[key]:
            raise ConfigError(f"config key '{key}' must be one of {_CHOICES[key]}, got {value!r}")
        kwargs[name] = value
    return cls(**kwargs)


def _validate(cfg: Config) -> None:
    if not cfg.model.name:
        raise ConfigError("config key 'model.name' is required")
    if not cfg.data.train:
        raise ConfigError("config key 'data.train' is required")
    pdb = cfg.hardware.per_device_batch
    if isinstance(pdb, str) and pdb != "auto":
        raise ConfigError(f"config key 'hardware.per_device_batch' must be an integer or 'auto', got {pdb!r}")
    if isinstance(pdb, int) and pdb < 1:
        raise ConfigError("config key 'hardware.per_device_batch' must be >= 1")
    for key, value in (("train.global_batch_size", cfg.train.global_batch_size), ("train.epochs", cfg.train.epochs),
                       ("data.sample_rate", cfg.data.sample_rate)):
        if value < 1:
            raise ConfigError(f"config key '{key}' must be >= 1, got {value}")
    if cfg.data.crop_seconds <= 0:
        raise ConfigError("config key 'data.crop_seconds' must be > 0")
    _validate_augment(cfg.augment)


def _validate_augment(a: AugmentSettings) -> None:
    if not 0.0 <= a.prob <= 1.0:
        raise ConfigError(f"config key 'augment.prob' must be in [0, 1], got {a.prob}")
    if not 0.0 <= a.reverb_noise_prob <= 1.0:
        raise ConfigError(f"config key 'augment.reverb_noise_prob' must be in [0, 1], got {a.reverb_noise_prob}")
    bad = [k for k in a.kinds if k not in AUGMENT_KINDS]
    if bad or not a.kinds or len(set(a.kinds)) != len(a.kinds):
        raise ConfigError(f"config key 'augment.kinds' must list distinct kinds among {', '.join(AUGMENT_KINDS)}, "
                          f"got {a.kinds}")
    for name in ("noise_snr", "music_snr", "babble_snr", "babble_speakers"):
        pair = getattr(a, name)
        if len(pair) != 2 or pair[0] > pair[1]:
            raise ConfigError(f"config key 'augment.{name}' must be [lo, hi] with lo <= hi, got {pair}")
    if a.babble_speakers[0] < 1:
        raise ConfigError(f"config key 'augment.babble_speakers' must start at >= 1, got {a.babble_speakers}")


def _set_dotted(raw: Dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(items: List[str]) -> List[tuple]:
    """`["train.epochs=2", "model.args.m_channels=16"]` -> `[("train.epochs", 2), ...]` (YAML scalars)."""
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        key, text = item.split("=", 1)
        out.append((key.strip(), yaml.safe_load(text) if text.strip() else None))
    return out


def load_config(path: Optional[Union[str, Path, List]] = None, overrides: Optional[List[str]] = None,
                hardware: Optional[Union[str, Path]] = None, raw: Optional[Dict[str, Any]] = None) -> Config:
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
            raw = _merge(raw, _read_yaml(Path(p)))
    raw = _deep_copy(raw)
    if hardware:
        profile = _read_yaml(resolve_hardware(hardware))
        merged = dict(profile)
        merged.update(raw.get("hardware") or {})
        raw["hardware"] = merged
    for key, value in parse_overrides(overrides or []):
        _set_dotted(raw, key, value)
    where = f" in {', '.join(map(str, paths))}" if paths else ""
    try:
        cfg = _build(Config, raw, "")
        _validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None
    return cfg


def config_from_dict(raw: Dict[str, Any]) -> Config:
    """Rebuild a Config from `Config.to_dict()` output (e.g. stored in a checkpoint)."""
    return load_config(raw=raw)


def save_config(cfg: Config, path: Union[str, Path]) -> None:
    with open(path, "w") as f:
        yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)


def resolve_hardware(name_or_path: Union[str, Path]) -> Path:
    """A hardware profile: a YAML path, or a name under <repo>/conf/hardware/."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    profile = Path(__file__).resolve().parent.parent / "conf" / "hardware" / f"{name_or_path}.yaml"
    if not profile.exists():
        known = sorted(q.stem for q in profile.parent.glob("*.yaml"))
        raise ConfigError(f"unknown hardware profile {str(name_or_path)!r}; known: {', '.join(known)}")
    return profile


def _read_yaml(path: Path) -> Dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    return data


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `over` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _deep_copy(d):
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d
