"""The in-place activations of the Res2Net block give the values and gradients of the plain formulation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speakerlab.models.blocks import Res2NetBlock


def direct_forward(block: Res2NetBlock, x: torch.Tensor) -> torch.Tensor:
    """The block written out of place: `(B, C, F, T) -> (B, C', F', T')`."""
    groups = torch.split(F.hardtanh(block.bn1(block.conv1(x)), 0.0, 20.0), block.width, dim=1)
    outs, sp = [], groups[0]
    for i, (conv, bn) in enumerate(zip(block.convs, block.bns)):
        if i > 0:
            sp = block.fuse_models[i - 1](sp, groups[i]) if block.fuse_models is not None else sp + groups[i]
        sp = F.hardtanh(bn(conv(sp)), 0.0, 20.0)
        outs.append(sp)
    out = block.bn3(block.conv3(torch.cat(outs, dim=1)))
    return F.hardtanh(out + block.shortcut(x), 0.0, 20.0)


@pytest.mark.parametrize("stride, fuse, in_planes", [(1, False, 16), (2, False, 8), (1, True, 16), (2, True, 8)])
def test_res2net_block_in_place_matches_direct(stride, fuse, in_planes):
    torch.manual_seed(0)
    block = Res2NetBlock(in_planes, 8, stride=stride, base_width=32, scale=3, expansion=2, fuse=fuse).train()
    for m in block.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            torch.nn.init.uniform_(m.weight, 5.0, 15.0)  # wide outputs: some pass the cap of 20, some are < 0
    x = torch.randn(2, in_planes, 8, 12)
    results = []
    for forward in (block.forward, lambda t: direct_forward(block, t)):
        block.zero_grad()
        xi = x.clone().requires_grad_()
        y = forward(xi)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        results.append((y.detach(), xi.grad, [p.grad.clone() for p in block.parameters()]))
    (y0, gx0, gp0), (y1, gx1, gp1) = results
    assert (y0 == 20).any() and (y0 == 0).any()  # both ends of the clipped ReLU are exercised
    torch.testing.assert_close(y0, y1)
    torch.testing.assert_close(gx0, gx1)
    for a, b in zip(gp0, gp1):
        torch.testing.assert_close(a, b)
