"""Every registered model: shapes, variable length, determinism, TorchScript, gradients, autocast.

Inputs are kept to batch 2 and a few hundred frames so the whole registry runs in seconds.
"""
from __future__ import annotations

import pytest
import torch

from speakerlab.models import build_model, list_models

MODELS = list_models()
FEAT_DIM = 80


def _fbank(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, frames, FEAT_DIM, generator=gen)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    torch.manual_seed(0)
    return build_model(request.param, feat_dim=FEAT_DIM).eval()


def test_registry_is_populated():
    for name in ["campplus", "ecapa_tdnn_c1024", "ecapa_tdnn_c512"]:
        assert name in MODELS


def test_forward_shape_and_lengths(model):
    with torch.no_grad():
        out = model(_fbank(2, 200))
        assert out.ndim == 2 and out.shape[0] == 2
        assert torch.isfinite(out).all()
        # Lengths that are not multiples of any stride or segment size.
        for frames in (137, 331):
            other = model(_fbank(2, frames, seed=frames))
            assert other.shape == out.shape
            assert torch.isfinite(other).all()


def test_eval_is_deterministic(model):
    x = _fbank(2, 200)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)


# torch.jit.script still works but warns that it is deprecated in favour of torch.compile/export.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_matches_eager(model):
    scripted = torch.jit.script(model)
    for frames in (200, 157):
        x = _fbank(2, frames, seed=frames)
        with torch.no_grad():
            torch.testing.assert_close(scripted(x), model(x), rtol=1e-4, atol=1e-5)


def test_backward_gives_finite_grads(model):
    model.train()
    try:
        model.zero_grad(set_to_none=True)
        out = model(_fbank(2, 200))
        # Squared output: a plain sum is constant under a final BatchNorm without affine.
        out.square().sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()


def test_bfloat16_autocast(model):
    """bf16 autocast gives the fp32 embeddings up to bf16 rounding: every row points the same way."""
    x = _fbank(2, 200)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    assert out.shape == ref.shape and torch.isfinite(out.float()).all()
    assert torch.nn.functional.cosine_similarity(out.float(), ref, dim=1).min() > 0.99


def _is_2d_conv(model) -> bool:
    return any(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def test_channels_last_matches(model):
    """2-D conv models give the same embeddings with channels_last weights (eval mode: the CPU
    channels_last batch-norm kernel differs slightly in training statistics)."""
    if not _is_2d_conv(model):
        pytest.skip("no 2-D convolutions")
    x = _fbank(2, 200)
    with torch.no_grad():
        ref = model(x)
        model.to(memory_format=torch.channels_last)
        try:
            out = model(x)
        finally:
            model.to(memory_format=torch.contiguous_format)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
