"""Typed settings from YAML mappings: the field helper `setting` that carries a field's rule, and
`build_settings`, which checks every key's type and rule and names the dotted key in its errors.
speakerlab.config declares the sections with it; nothing here knows any section.

A section may list keys it no longer takes in a class attribute `RENAMED = {old: (new, convert)}`, `convert`
turning an old value into the new key's: the old key is then an error that says how to write its value in the
new one, and `upgrade_renamed` translates a config written before the rename (a checkpoint's)."""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import yaml


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key (and file)."""


def auto_or_bool(v) -> Optional[str]:
    """The rule of a setting that is true, false or auto (decided when the run is built)."""
    return None if isinstance(v, bool) or v == "auto" else f"must be auto, true or false, got {v!r}"


def setting(
    default: Any,
    *,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    lt: Optional[float] = None,
    choices: Optional[tuple] = None,
    check: Optional[Callable[[Any], Optional[str]]] = None,
):
    """A settings field with its rule: bounds (`ge`/`gt`/`le`/`lt`), allowed `choices`, or `check(value)`
    returning what is wrong (None when fine). Lists and dicts are copied per instance."""
    rule = {"ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "check": check}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=rule)
    return field(default=default, metadata=rule)


def _type_name(tp) -> str:
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_value(key: str, value: Any, tp) -> Any:
    """Return `value` converted to `tp` or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if origin is Union:
        failed = []
        for option in typing.get_args(tp):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check_value(key, value, option)
            except ConfigError as e:
                failed.append((option, e))
        for option, e in failed:  # a list given for the union's list type: what is wrong inside it
            if isinstance(value, list) and typing.get_origin(option) in (list, List):
                raise e
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
    if dataclasses.is_dataclass(tp):  # a list of records, e.g. train.freeze
        return build_settings(tp, value, key)
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


def _check_rule(key: str, value: Any, rule: Dict[str, Any]) -> None:
    """Apply a field's `setting` rule to its (type-checked) value."""
    if not rule or value is None:
        return
    problem = None
    if rule.get("choices") is not None and value not in rule["choices"]:
        problem = f"must be one of {rule['choices']}, got {value!r}"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = ("ge", "gt"), ("le", "lt")
        low = next(((n, rule[n]) for n in lo if rule.get(n) is not None), None)
        high = next(((n, rule[n]) for n in hi if rule.get(n) is not None), None)
        ok = (low is None or (value >= low[1] if low[0] == "ge" else value > low[1])) and (
            high is None or (value <= high[1] if high[0] == "le" else value < high[1])
        )
        if not ok:
            if low and high:
                bound = f"in {'[' if low[0] == 'ge' else '('}{low[1]:g}, {high[1]:g}{']' if high[0] == 'le' else ')'}"
            else:
                name, limit = low or high
                bound = f"{ {'ge': '>=', 'gt': '>', 'le': '<=', 'lt': '<'}[name] } {limit:g}"
            problem = f"must be {bound}, got {value!r}"
    if problem is None and rule.get("check") is not None:
        problem = rule["check"](value)
    if problem:
        raise ConfigError(f"config key '{key}' {problem}")


def build_settings(cls, raw: Dict[str, Any], prefix: str = ""):
    """`raw` (a YAML mapping) -> an instance of the settings dataclass `cls`, every key type- and rule-checked;
    nested dataclass fields are built from nested mappings. Errors name the dotted key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config section '{prefix or '<top>'}' must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        if unknown[0] in getattr(cls, "RENAMED", {}):
            raise ConfigError(_renamed_message(cls, unknown[0], raw[unknown[0]], prefix))
        raise ConfigError(f"unknown config key '{key}' (known in '{prefix or '<top>'}': {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in raw.items():
        key = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build_settings(tp, value if value is not None else {}, key)
            continue
        value = _check_value(key, value, tp)
        _check_rule(key, value, dict(fields[name].metadata))
        kwargs[name] = value
    return cls(**kwargs)


def _renamed_message(cls, old: str, value: Any, prefix: str) -> str:
    new, convert = cls.RENAMED[old]
    section = f"{prefix}." if prefix else ""
    line = f"config key '{section}{old}' was replaced by '{section}{new}'"
    try:
        written = yaml.safe_dump({new: convert(value)}, default_flow_style=True, sort_keys=False).strip()[1:-1]
    except (TypeError, ValueError):  # not a value the old key took: no translation to show
        return line
    return f"{line}: {old}: {value!r} is written {written}"


def upgrade_renamed(cls, raw: Dict[str, Any]) -> Dict[str, Any]:
    """A plain config mapping of the settings dataclass `cls` written before keys were renamed -> the same
    settings under the new keys (a copy; values of several old keys renamed into one list are concatenated).
    Sections and keys it does not know are left as they are."""
    out = dict(raw)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(out.get(f.name), dict):
            out[f.name] = upgrade_renamed(hints[f.name], out[f.name])
    for old, (new, convert) in getattr(cls, "RENAMED", {}).items():
        if old in out:
            value = convert(out.pop(old))
            out[new] = out[new] + value if isinstance(out.get(new), list) and isinstance(value, list) else value
    return out


# --- YAML files and dotted overrides ---------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (safe_load keeps the last silently: a second
    `train:` section would replace the first whole)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {seen[key] + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, what: str = "file") -> Any:
    """The data of a YAML file (safe_load, a key given twice in one mapping refused; None when empty); a missing
    file, invalid YAML or a file that is not UTF-8 text is one ConfigError naming the file and, for YAML problems,
    the line."""
    if not path.exists():
        raise ConfigError(f"{what} {path} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror}") from None


def merge_mappings(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `over` replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_mappings(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def parse_overrides(items: List[str]) -> List[tuple]:
    """`["train.epochs=2", "model.args.m_channels=16"]` -> `[("train.epochs", 2), ...]` (YAML scalars)."""
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (section.key=value for a key in a section)")
        key, text = item.split("=", 1)
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: its value is not valid YAML: {getattr(e, 'problem', e)}") from None
        out.append((key.strip(), value))
    return out


def set_dotted(raw: Dict[str, Any], dotted: str, value: Any) -> None:
    """Set `raw[a][b][c] = value` for `dotted` 'a.b.c', making the missing sections."""
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
