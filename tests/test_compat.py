"""Published-architecture compatibility with the 3D-Speaker model zoo.

Each fixture in tests/data/3dspeaker_compat/ lists a released checkpoint's keys and shapes, the
published parameter count, and the reference model's embeddings for a synthetic state dict
(deterministic fill rule + BatchNorm calibration) and a synthetic input; see tests/fixture_models.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from speakerlab.models import build_model
from speakerlab.sources import SourceError, read_source
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
    src = read_source(path, threedspeaker=arch)  # the embedding size read from the file
    assert src.model_args == {k: v for k, v in builder_kwargs(fixture).items() if k == "embedding_size"}
    model = src.build()
    assert not model.training

    inp = fixture["input"]
    x = make_input(inp["batch"], inp["frames"], inp["dims"])
    calibrate(model, x)
    with torch.no_grad():
        emb = model(x)
    expected = torch.tensor(fixture["embedding"], dtype=torch.float32)
    assert emb.shape == expected.shape
    torch.testing.assert_close(emb, expected, rtol=1e-3, atol=1e-3)


def test_3dspeaker_file_with_mismatched_keys_is_named(tmp_path):
    fixture = load_fixture("campplus")
    state = fill_state_dict(fixture["state_dict"])
    first = next(iter(state))
    state.pop(first)
    torch.save(state, tmp_path / "w.bin")
    with pytest.raises(
        SourceError, match=f"{tmp_path / 'w.bin'}: the weights do not fit model campplus .*missing {first}"
    ):
        read_source(tmp_path / "w.bin", threedspeaker="campplus").build()


def test_3dspeaker_file_is_unwrapped_from_its_container(tmp_path):
    fixture = load_fixture("campplus")
    state = fill_state_dict(fixture["state_dict"])
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "w.bin")
    model = read_source(tmp_path / "w.bin", threedspeaker="campplus").build()
    torch.testing.assert_close(model.state_dict()["head.conv1.weight"], state["head.conv1.weight"])


def test_weights_that_do_not_fit_a_model_of_huge_args_are_one_short_line(monkeypatch):
    """An SSL model's args hold its whole encoder config: the error shows their start and length, not all of it."""
    from speakerlab.models import registry

    monkeypatch.setattr(registry, "build_model", lambda name, **args: torch.nn.Linear(2, 2))
    with pytest.raises(ValueError) as e:
        registry.load_model("ssl", {"encoder": {"config": "x" * 5000}}, {"weight": torch.zeros(2, 2)})
    message = str(e.value)
    assert len(message) < 500 and "characters)" in message and "missing bias" in message, message
