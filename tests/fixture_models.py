"""The fixtures' published-weight problems (../shared/fixtures, copied into tests/data): the deterministic fill
rule of a released state dict's keys and shapes, the synthetic input, the BatchNorm calibration, and the
ReDimNet2 fixtures' calibrated embeddings. Shared by the compatibility tests and bench/redimnet2_float64.py."""

from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

import numpy as np
import torch

from speakerlab.models.redimnet2 import ReDimNet2, redimnet2_kwargs

REDIMNET2_DATA = Path(__file__).parent / "data" / "redimnet2"


def fill_state_dict(keys_and_shapes) -> dict:
    """The fixture README's fill rule: a deterministic state dict from names and shapes alone."""
    state = {}
    for name, shape in keys_and_shapes:
        if name.endswith("num_batches_tracked"):
            state[name] = torch.zeros(shape, dtype=torch.long)
            continue
        n = int(np.prod(shape)) if shape else 1
        noise = np.random.RandomState(zlib.crc32(name.encode())).standard_normal(n).reshape(shape)
        if name.endswith("running_var"):
            value = np.ones(shape)
        elif name.endswith("running_mean"):
            value = np.zeros(shape)
        elif len(shape) == 1:
            value = 1.0 + 0.1 * noise if name.endswith("weight") else 0.1 * noise
        else:
            value = noise * np.sqrt(2.0 / (n // shape[0]))
        state[name] = torch.from_numpy(np.asarray(value, dtype=np.float64)).float()
    return state


def make_input(batch: int, frames: int, dims: int) -> torch.Tensor:
    """x[b, t, f] = sin(0.01 (t+1)(f+1) + b) + 0.3 cos(0.05 t (b+1)), computed in float64."""
    b = np.arange(batch)[:, None, None]
    t = np.arange(frames)[None, :, None]
    f = np.arange(dims)[None, None, :]
    x = np.sin(0.01 * (t + 1) * (f + 1) + b) + 0.3 * np.cos(0.05 * t * (b + 1))
    return torch.from_numpy(x).float()


def calibrate(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Set every BatchNorm's running statistics to those of one training-mode pass over `x`."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average: after one batch, exactly that batch's stats
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()


def release_model(model_config: dict, state: dict) -> ReDimNet2:
    """The model of a release's constructor settings (any the official code accepts, not only the registered
    sizes) with `state` loaded strictly, in eval mode: the official comparisons' model. Release files as users give
    them go through speakerlab.sources.read_source."""
    model = ReDimNet2(**redimnet2_kwargs(model_config))
    model.load_state_dict(state, strict=True)
    return model.eval()


@functools.lru_cache(maxsize=None)
def load_redimnet2_fixture(size: str) -> dict:
    with open(REDIMNET2_DATA / f"{size}.json") as f:
        return json.load(f)


def fixture_input(fixture: dict) -> torch.Tensor:
    """The fixture's input, time-major as our models take it: (B, T, 72)."""
    shape = fixture["input"]
    return make_input(shape["batch"], shape["frames"], shape["mels"])


@functools.lru_cache(maxsize=None)
def filled_state(size: str) -> dict:
    return fill_state_dict(load_redimnet2_fixture(size)["state_dict"])


@functools.lru_cache(maxsize=None)
def calibrated_embedding(
    size: str, return_2d_output: bool | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Our eval-mode embedding of the fixture input, after loading the filled state and calibrating,
    computed in `dtype` (the filled values and the input are float32 values either way).

    Built once per size and setting (cached): the largest sizes take seconds on a small CPU.
    """
    fixture = load_redimnet2_fixture(size)
    config = dict(fixture["reference_kwargs"])
    if return_2d_output is not None:
        config["return_2d_output"] = return_2d_output
    model = release_model(config, filled_state(size)).to(dtype)
    assert not model.training
    x = fixture_input(fixture).to(dtype)
    calibrate(model, x)
    with torch.no_grad():
        return model(x)


def load_fixture(arch: str) -> dict:
    """A 3D-Speaker compatibility fixture (tests/data/3dspeaker_compat/<arch>.json): reference constructor
    arguments, the fill rule's state-dict layout and the reference embedding."""
    with open(Path(__file__).parent / "data" / "3dspeaker_compat" / f"{arch}.json") as f:
        return json.load(f)


# ReDimNet2 float32 reproducibility bound (tests/test_redimnet2.py explains the figures).
FLOAT32_TOL = dict(rtol=0.1, atol=0.1)
MIN_COSINE = 0.9999


def assert_embedding_matches(ours: torch.Tensor, expected: torch.Tensor) -> None:
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, **FLOAT32_TOL)
    assert torch.nn.functional.cosine_similarity(ours, expected, dim=1).min() >= MIN_COSINE
