"""Pooling statistics precision: float32 for low-precision input, float64 kept for a float64 model."""

from __future__ import annotations

import torch

from speakerlab.models.pooling import ASTP, TSTP, StatsPool


def direct_astp(pool: ASTP, x: torch.Tensor) -> torch.Tensor:
    """ASTP written out in the input's dtype: `(B, C, T) -> (B, 2C)`."""
    var, mean = torch.var_mean(x, dim=-1, correction=1, keepdim=True)
    h = torch.cat([x, mean.expand_as(x), (var + 1e-7).sqrt().expand_as(x)], dim=1)
    w = torch.softmax(pool.linear2(torch.tanh(pool.linear1(h))), dim=-1)
    mu = (w * x).sum(-1)
    sigma = (w * (x - mu.unsqueeze(-1)) ** 2).sum(-1).clamp(min=1e-7).sqrt()
    return torch.cat([mu, sigma], dim=1)


def test_float64_statistics_stay_float64():
    g = torch.Generator().manual_seed(0)
    x = 3.0 + torch.randn(2, 6, 50, generator=g, dtype=torch.float64)
    std, mean = torch.std_mean(x, dim=-1)
    out = StatsPool()(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.cat([mean, std], dim=1), rtol=0, atol=1e-14)
    x4 = x.reshape(2, 3, 2, 50)
    out = TSTP()(x4)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out[:, :6], x4.mean(-1).flatten(1), rtol=0, atol=1e-14)
    pool = ASTP(6, 8).double()
    out = pool(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, direct_astp(pool, x), rtol=0, atol=1e-12)


def test_low_precision_input_gives_float32_statistics():
    """Computed in float32 (the bfloat16 result equals the float32 one rounded once), returned as bfloat16."""
    x = torch.randn(2, 6, 50, generator=torch.Generator().manual_seed(1)).bfloat16()
    out = StatsPool()(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, StatsPool()(x.float()).bfloat16(), rtol=0, atol=0)
    x4 = x.reshape(2, 3, 2, 50)
    out = TSTP()(x4)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, TSTP()(x4.float()).bfloat16(), rtol=0, atol=0)
    pool = ASTP(6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = pool(x)
    assert out.dtype == torch.bfloat16  # the input's dtype, like the other two
    # Statistics from float32 data: within bfloat16 rounding (and the bfloat16 attention logits) of fp32.
    torch.testing.assert_close(out.float(), pool(x.float()), rtol=2e-2, atol=2e-2)
