"""Model registry: builders register under their own function name, or variants of one class from a table.

    @register
    def campplus(feat_dim=80, embedding_size=512, **kw) -> nn.Module: ...

    register_variant("resnet34", ResNet, dict(feat_dim=80, embedding_size=192, ...), "doc", fixed=dict(block="basic"))

    build_model("campplus", embedding_size=192)

Every model of `list_models()` maps fbank features `(B, T, F)` to embeddings `(B, D)` and builds from its
defaults. Models on a self-supervised encoder (`register_ssl`, `list_ssl_models()`) need its directory or
config among their arguments and take the input of their encoder's front-end (speakerlab.models.ssl).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional, Set

import torch
import torch.nn as nn

_BUILDERS: Dict[str, Callable[..., nn.Module]] = {}
_SSL: Set[str] = set()
# A model's `features` config section where its releases take another input than the default (80-bin kaldi_fbank).
_FEATURES: Dict[str, Dict[str, Any]] = {}


def register(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register `builder` under `builder.__name__` (the registry key is the builder's name)."""
    name = builder.__name__
    if name in _BUILDERS and _BUILDERS[name] is not builder:
        raise ValueError(f"model name {name!r} is registered twice")
    _BUILDERS[name] = builder
    return builder


def register_variant(
    name: str,
    make: Callable[..., nn.Module],
    defaults: Dict[str, Any],
    doc: str,
    fixed: Optional[Dict[str, Any]] = None,
    features: Optional[Dict[str, Any]] = None,
) -> None:
    """Register `name` as `make(**fixed, **defaults)`: `defaults` are the variant's keyword arguments (what a
    config's `model.args` may set, checked like a builder's signature), `fixed` what makes it this variant
    and is not an argument (a block type, channel widths of a release), `features` the config's `features`
    section its releases were trained with when not the default (`model_features`)."""

    def builder(**kwargs) -> nn.Module:
        return make(**(fixed or {}), **{**defaults, **kwargs})

    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = doc
    kind = inspect.Parameter.KEYWORD_ONLY
    builder.__signature__ = inspect.Signature([inspect.Parameter(k, kind, default=v) for k, v in defaults.items()])
    register(builder)
    if features:
        _FEATURES[name] = dict(features)


def model_features(name: str) -> Dict[str, Any]:
    """The `features` config section model `name` takes ({}: the default front-end, 80-bin kaldi_fbank), as plain
    keys: this layer does not import speakerlab.frontends, which turns them into a FeatureSpec (`feature_spec`)."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; registered: {', '.join(sorted(_BUILDERS))}")
    return dict(_FEATURES.get(name, {}))


def class_defaults(cls: type) -> Dict[str, Any]:
    """The keyword defaults of `cls.__init__`: the arguments of a model registered as the class itself."""
    params = inspect.signature(cls).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def register_ssl(builder: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """`register` for a model on a self-supervised encoder (listed by `list_ssl_models`, not `list_models`)."""
    register(builder)
    _SSL.add(builder.__name__)
    return builder


def list_models() -> list:
    """Sorted names of the registered fbank models (each builds from its defaults)."""
    return sorted(set(_BUILDERS) - _SSL)


def list_ssl_models() -> list:
    """Sorted names of the registered models on a self-supervised encoder."""
    return sorted(_SSL)


def build_model(name: str, **kwargs) -> nn.Module:
    """Build a registered model by name; unknown names or arguments raise a ValueError naming them.

    The returned module maps `(B, T, feat_dim)` fbank (an SSL model: its front-end's input) to
    `(B, embedding_size)` embeddings.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; registered: {', '.join(sorted(_BUILDERS))}")
    builder = _BUILDERS[name]
    params = inspect.signature(builder).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(kwargs) - set(params))
        if unknown:
            raise ValueError(f"model {name!r} has no argument(s) {unknown}; it takes {sorted(params)}")
    return builder(**kwargs)


def builder_defaults(name: str) -> Dict[str, object]:
    """The default value of every argument of model `name` that has one."""
    params = inspect.signature(_BUILDERS[name]).parameters
    return {n: p.default for n, p in params.items() if p.default is not p.empty}


def model_args_problems(name: str, args: Dict[str, object], prefix: str = "model.args") -> List[str]:
    """What is wrong with building model `name` from `args`, one line per problem naming
    `<prefix>.<key>` (an empty list when it would build): unknown names, missing required arguments."""
    if name not in _BUILDERS:
        return [f"'model.name': unknown model {name!r}; registered: {', '.join(sorted(_BUILDERS))}"]
    params = inspect.signature(_BUILDERS[name]).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    problems = (
        []
        if takes_any
        else [
            f"'{prefix}.{key}': model {name!r} has no argument {key!r} (it takes {', '.join(named)})"
            for key in sorted(set(args) - set(named))
        ]
    )
    problems += [
        f"'{prefix}.{n}': model {name!r} needs this argument"
        for n, p in params.items()
        if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n not in args
    ]
    problems += [
        f"'{prefix}.{key}' must be {kind}, got {args[key]!r} (model {name!r}; its default: {params[key].default!r})"
        for key, kind in ((k, _kind_problem(params[k].default, args[k])) for k in args if k in params)
        if kind
    ]
    return problems


def _kind_problem(default: object, value: object) -> Optional[str]:
    """The kind of value an argument with `default` takes when `value` is not of it (a bool for a bool, an integer
    for an int, a number for a float, a list for a tuple or list), else None; a default of None takes anything."""
    if default is None or value is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true/false"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "an integer"
    if isinstance(default, float):
        return None if isinstance(value, (int, float)) and not isinstance(value, bool) else "a number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    if isinstance(default, (list, tuple)):
        return None if isinstance(value, (list, tuple)) else "a list"
    return None


def weight_problems(model: nn.Module, state: Mapping[str, Any]) -> Optional[str]:
    """What keeps `state` from loading into `model` strictly, in one line (missing keys, unexpected ones, other
    shapes; the first four and the count), or None when it loads. `model` may live on the meta device."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
    problems = [f"missing {k}" for k in expected if k not in got]
    problems += [f"unexpected {k}" for k in got if k not in expected]
    problems += [f"{k}: {got[k]} in the file, {s} in the model" for k, s in expected.items() if got.get(k, s) != s]
    if not problems:
        return None
    return "; ".join(problems[:4]) + (f"; ... ({len(problems)} problems)" if len(problems) > 4 else "")


def load_model(name: str, args: Dict[str, Any], state: Mapping[str, Any]) -> nn.Module:
    """`build_model(name, **args)` with `state` loaded strictly, in eval mode: `(B, T, F) -> (B, D)`. Weights that
    do not fit are a ValueError saying how (`weight_problems`)."""
    model = build_model(name, **args)
    problems = weight_problems(model, state)
    if problems:
        shown = repr(args)  # an SSL model's args hold its whole encoder config: thousands of characters
        shown = shown if len(shown) <= 300 else shown[:300] + f"... ({len(shown)} characters)"
        raise ValueError(f"the weights do not fit model {name} with args {shown}: {problems}")
    model.load_state_dict(state)
    return model.eval()
