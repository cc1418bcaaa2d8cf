"""ReDimNet2 compatibility with the official releases (PalabraAI/redimnet2).

Each fixture in tests/data/redimnet2/ lists a release's constructor settings (`reference_kwargs`,
a checkpoint's `model_config`), every state-dict key and shape, the parameter count, and the
reference model's embedding for a state dict filled by the 3D-Speaker fixtures' rule (see
tests/test_compat.py) after BatchNorm calibration, for a synthetic (4, 72, 200) log-mel input.
frontend_tf.json holds the official front-end's features for two waveforms; official_float64.json
the official code's embeddings of the fixture problem computed in float64 (bench/redimnet2_float64.py).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from speakerlab.features.redimnet import ReDimNetMel
from speakerlab.models import build_model
from speakerlab.models.redimnet2 import ReDimNet2, redimnet2_kwargs
from tests.fixture_models import (
    FLOAT32_TOL,
    assert_embedding_matches,
    calibrated_embedding,
    filled_state,
    load_redimnet2_fixture,
)
from tests.helpers import registry_params

DATA = Path(__file__).parent / "data" / "redimnet2"
VOX2 = ["b0", "b1", "b2", "b3", "b4", "b5", "b6"]
SIZES = VOX2 + ["b3_vb2_vox2_cnc2", "b6_vb2_vox2_cnc2"]
ALTERNATIVE = [s for s in SIZES if s in ("b1", "b2", "b4")]
FAST_SIZES = ("b0", "b1")  # the fast lane; every size in the full suite


@functools.lru_cache(maxsize=None)
def official_float64() -> dict:
    with open(DATA / "official_float64.json") as f:
        return json.load(f)


@pytest.mark.parametrize("size", registry_params(SIZES, fast=FAST_SIZES))
def test_parameter_count_and_state_dict_layout(size):
    """Same parameter count, and the same keys in the same order with the same shapes, as the release."""
    fixture = load_redimnet2_fixture(size)
    model = ReDimNet2(**redimnet2_kwargs(fixture["reference_kwargs"]))
    assert sum(p.numel() for p in model.parameters()) == fixture["num_parameters"]
    assert sum(p.numel() for p in model.parameters() if not p.requires_grad) == fixture["num_parameters_frozen"]
    assert [[k, list(v.shape)] for k, v in model.state_dict().items()] == fixture["state_dict"]


@pytest.mark.parametrize("size", registry_params(VOX2, fast=FAST_SIZES))
def test_registered_defaults_are_the_vox2_release(size):
    """`build_model("redimnet2_<size>")` has the release's parameter count and state-dict layout."""
    fixture = load_redimnet2_fixture(size)
    model = build_model(f"redimnet2_{size}")
    assert model.feat_dim == fixture["reference_kwargs"]["F"]
    assert sum(p.numel() for p in model.parameters()) == fixture["num_parameters"]
    assert [[k, list(v.shape)] for k, v in model.state_dict().items()] == fixture["state_dict"]


# The official code's embeddings of the same problem in float64 (official_float64.json, written by
# bench/redimnet2_float64.py from the official ReDimNet2Wrap: same fill, input values and calibration).
# In float64 the problem is well posed: ours agrees with them to about 1e-10 absolute for every size
# (measured), so this holds it to 1e-6, a thousand times tighter than the fixtures' 1e-3.
FLOAT64_TOL = dict(rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("size", registry_params(SIZES, fast=FAST_SIZES))
def test_reference_embedding_in_float64_equals_official(size):
    expected = torch.tensor(official_float64()["embeddings"][size], dtype=torch.float64)
    torch.testing.assert_close(calibrated_embedding(size, dtype=torch.float64), expected, **FLOAT64_TOL)


@pytest.mark.parametrize("size", registry_params(ALTERNATIVE, fast=FAST_SIZES))
def test_alternative_flattening_in_float64_equals_official(size):
    alternative = official_float64()["alternative"][size]
    assert alternative["reference_kwargs_override"] == {"return_2d_output": False}
    expected = torch.tensor(alternative["embedding"], dtype=torch.float64)
    torch.testing.assert_close(
        calibrated_embedding(size, return_2d_output=False, dtype=torch.float64), expected, **FLOAT64_TOL
    )


def test_official_float64_covers_every_fixture():
    reference = official_float64()
    assert sorted(reference["embeddings"]) == sorted(SIZES)
    assert sorted(reference["alternative"]) == sorted(ALTERNATIVE)
    assert reference["command"].startswith("python bench/redimnet2_float64.py --reference-root ")


# The fixtures ask for rtol = atol = 1e-3 on the float32 embedding. For ReDimNet2 no float32 run
# meets that, the official code included: after calibration the BatchNorms (the last one normalises
# statistics of 4 utterances with little spread) grow float32 rounding (1e-7) to about 1e-3 relative
# in the embedding, so float32 runs that differ only in thread count or torch version disagree by
# several times that tolerance. Measured with torch 2.13 on CPU: b3 with 1 vs 2 threads, 11x; the
# official code vs the b0 fixture, 4.4x. The fixtures (float32, torch 2.15) lie 4e-3 to 3.6e-2
# absolute from the official float64 result above, which ours meets to 1e-10. So this test holds
# the float32 embedding to a float32 reproducibility bound, 2-3x the largest deviation seen here
# (b6 sizes: 4.5e-2 absolute, cosine 0.99996): rtol = atol = 0.1 and cosine >= 0.9999. A structural
# difference, e.g. the other flattening order of `return_2d_output`, is off by 1.5 in relative L2
# norm (cosine about -0.1), far outside it. The 1e-3 check is kept below, expected to fail.
@pytest.mark.parametrize("size", registry_params(SIZES, fast=FAST_SIZES))
def test_reference_embedding_to_float32_reproducibility(size):
    expected = torch.tensor(load_redimnet2_fixture(size)["embedding"], dtype=torch.float32)
    assert_embedding_matches(calibrated_embedding(size), expected)


@pytest.mark.parametrize("size", registry_params(ALTERNATIVE, fast=FAST_SIZES))
def test_reference_embedding_alternative_flattening(size):
    """With `return_2d_output=False` (same keys and shapes) the model gives `embedding_alternative`."""
    alternative = load_redimnet2_fixture(size)["embedding_alternative"]
    assert alternative["reference_kwargs_override"] == {"return_2d_output": False}
    expected = torch.tensor(alternative["embedding"], dtype=torch.float32)
    assert_embedding_matches(calibrated_embedding(size, return_2d_output=False), expected)
    # The two orders are told apart: the default one is far from the alternative embedding.
    assert not torch.allclose(calibrated_embedding(size), expected, **FLOAT32_TOL)


@pytest.mark.xfail(reason="float32 rounding amplified by the calibrated BatchNorms exceeds 1e-3 (see above)")
@pytest.mark.parametrize("size", registry_params(SIZES, fast=FAST_SIZES))
def test_reference_embedding_at_fixture_tolerance(size):
    expected = torch.tensor(load_redimnet2_fixture(size)["embedding"], dtype=torch.float32)
    torch.testing.assert_close(calibrated_embedding(size), expected, rtol=1e-3, atol=1e-3)


def release_file(tmp_path, state: dict) -> Path:
    """A b0 release file as PalabraAI/redimnet2 saves one: `{model_config, state_dict}`."""
    path = tmp_path / "b0-vox2-lm.pt"
    torch.save({"model_config": load_redimnet2_fixture("b0")["reference_kwargs"], "state_dict": state}, path)
    return path


def test_a_release_loads_with_or_without_its_frontend_buffers(tmp_path):
    """A release's state dict also holds the front-end's `spec.*` constants: the one reader of pretrained files
    (speakerlab.sources) accepts and drops them, and the model holds every other weight exactly."""
    from speakerlab.sources import read_source

    fixture = load_redimnet2_fixture("b0")
    state = filled_state("b0")
    with_spec = dict(state)
    for name, shape in fixture["frontend_state_dict"]:
        with_spec[name] = torch.zeros(shape)
    for candidate in (state, with_spec):
        model = read_source(release_file(tmp_path, candidate)).build()
        assert not model.training
        loaded = model.state_dict()  # once: state_dict() builds the whole dict on every call
        assert not any(k.startswith("spec.") for k in loaded)
        for key, value in state.items():
            torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)


def test_a_release_that_does_not_fit_names_missing_unexpected_and_misshapen_keys(tmp_path):
    from speakerlab.sources import SourceError, read_source

    state = dict(filled_state("b0"))
    missing = dict(state)
    del missing["backbone.stage2.0.w"]
    extra = dict(state, **{"backbone.stage9.0.w": torch.zeros(1)})
    wrong = dict(state, **{"linear.weight": torch.zeros(192, 7)})
    for weights, problem in (
        (missing, r"missing backbone.stage2.0.w(;|$)"),
        (extra, r"unexpected backbone.stage9.0.w(;|$)"),
        (wrong, r"linear.weight: \(192, 7\) in the file, \(192, \d+\) in the model"),
    ):
        with pytest.raises(SourceError, match=r"b0-vox2-lm.pt: .*" + problem):
            read_source(release_file(tmp_path, weights)).build()


def test_unsupported_settings_are_named():
    config = dict(load_redimnet2_fixture("b0")["reference_kwargs"], dual_agg=True)
    with pytest.raises(ValueError, match="dual_agg"):
        redimnet2_kwargs(config)
    with pytest.raises(ValueError, match="no_such_setting"):
        redimnet2_kwargs(dict(config, dual_agg=False, no_such_setting=1))


def test_frontend_matches_official_features():
    """`ReDimNetMel` gives the official 'tf' front-end's log-mels within 1e-3 (frontend_tf.json)."""
    with open(DATA / "frontend_tf.json") as f:
        reference = json.load(f)
    kwargs = reference["kwargs"]
    assert kwargs["do_preemph"] and kwargs["norm_signal"] and not kwargs["do_spec_aug"]
    frontend = ReDimNetMel(n_mels=kwargs["n_mels"], hop_length=kwargs["hop_length"])
    wave = torch.tensor(reference["waveform_values"], dtype=torch.float32)
    expected = torch.tensor(reference["features"], dtype=torch.float32)  # (B, 72, T) mel-major
    assert list(expected.shape) == reference["features_shape"]
    feats = frontend(wave)
    assert feats.shape == (wave.shape[0], frontend.num_frames(wave.shape[1]), kwargs["n_mels"])
    torch.testing.assert_close(feats.transpose(1, 2), expected, rtol=0, atol=1e-3)
    torch.testing.assert_close(frontend(wave[1]), feats[1], rtol=0, atol=0)


def test_frontend_feeds_the_model():
    """wave -> ReDimNetMel -> registered model: (B, samples) -> (B, 192)."""
    model = build_model("redimnet2_b0").eval()
    wave = torch.randn(2, 16000, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        emb = model(ReDimNetMel()(wave))
    assert emb.shape == (2, 192) and torch.isfinite(emb).all()
