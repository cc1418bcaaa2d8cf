"""Published-architecture compatibility with the 3D-Speaker model zoo.

Each fixture in tests/data/3dspeaker_compat/ lists a released checkpoint's keys and shapes, the
published parameter count, and the reference model's embeddings for a synthetic state dict
(deterministic fill rule + BatchNorm calibration) and a synthetic input; see tests/fixture_models.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speakerlab.models import build_model, load_3dspeaker
from tests.fixture_models import calibrate, fill_state_dict, load_fixture, make_input
from tests.helpers import registry_params

DATA = Path(__file__).parent / "data" / "3dspeaker_compat"
ARCHITECTURES = ["campplus", "eres2net_base", "eres2net_large", "eres2netv2", "ecapa_tdnn_c1024", "resnet34"]

# Reference constructor arguments that have a different name in our builders; arguments not
# listed (e.g. channel widths) are implied by the builder's name and not passed on.
_KWARG_NAMES = {
    "feat_dim": "feat_dim",
    "input_size": "feat_dim",
    "embedding_size": "embedding_size",
    "lin_neurons": "embedding_size",
}


def builder_kwargs(fixture: dict) -> dict:
    """Our builder's arguments for the fixture's reference constructor arguments."""
    ref = fixture["reference_kwargs"]
    return {ours: ref[theirs] for theirs, ours in _KWARG_NAMES.items() if theirs in ref}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_parameter_count(arch):
    fixture = load_fixture(arch)
    model = build_model(arch, **builder_kwargs(fixture))
    assert sum(p.numel() for p in model.parameters()) == fixture["num_parameters"]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_state_dict_layout(arch):
    """Same keys, in the same order, with the same shapes as the released checkpoint."""
    fixture = load_fixture(arch)
    model = build_model(arch, **builder_kwargs(fixture))
    ours = [[k, list(v.shape)] for k, v in model.state_dict().items()]
    assert ours == fixture["state_dict"]


@pytest.mark.parametrize("arch", registry_params(ARCHITECTURES, fast=("campplus", "resnet34")))
def test_reference_embedding(arch, tmp_path):
    fixture = load_fixture(arch)
    path = tmp_path / f"{arch}.bin"
    torch.save(fill_state_dict(fixture["state_dict"]), path)
    model = load_3dspeaker(arch, str(path), **builder_kwargs(fixture))
    assert not model.training

    inp = fixture["input"]
    x = make_input(inp["batch"], inp["frames"], inp["dims"])
    calibrate(model, x)
    with torch.no_grad():
        emb = model(x)
    expected = torch.tensor(fixture["embedding"], dtype=torch.float32)
    assert emb.shape == expected.shape
    torch.testing.assert_close(emb, expected, rtol=1e-3, atol=1e-3)


def test_load_3dspeaker_rejects_mismatched_keys():
    fixture = load_fixture("campplus")
    state = fill_state_dict(fixture["state_dict"])
    state.pop(next(iter(state)))
    with pytest.raises(RuntimeError, match="Missing key"):
        load_3dspeaker("campplus", state, **builder_kwargs(fixture))


def test_load_3dspeaker_unwraps_container():
    fixture = load_fixture("campplus")
    state = fill_state_dict(fixture["state_dict"])
    wrapped = {"state_dict": {f"module.{k}": v for k, v in state.items()}}
    model = load_3dspeaker("campplus", wrapped, **builder_kwargs(fixture))
    torch.testing.assert_close(model.state_dict()["head.conv1.weight"], state["head.conv1.weight"])
