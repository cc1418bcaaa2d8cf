"""Eager against compiled: one training step of a tiny model on a device (tests/test_speedups.py on the CPU,
tests/test_cuda.py on a GPU)."""

from __future__ import annotations

import contextlib
import copy

import torch

from speakerlab.config import load_config
from speakerlab.train.build import build_net, build_optimizer
from speakerlab.train.hardware.speedups import apply_switches, resolve_switches, worst_error

TINY = {
    "campplus": {
        "embedding_size": 16,
        "growth_rate": 8,
        "init_channels": 16,
        "m_channels": 4,
        "fcm_blocks": [1, 1],
        "num_layers": [1, 1, 1],
    },
    "eres2net_base": {"embedding_size": 16, "m_channels": 8, "num_blocks": [1, 1, 1, 1]},
}


def compare_compiled_step(name, device, autocast=contextlib.nullcontext, frames=48):
    """One SGD step of tiny `name` on `device` over 4 crops of `frames`, eager and compiled: loss, gradients, weights
    and BatchNorm statistics agree (shared with tests/test_cuda.py)."""
    cfg = load_config(raw={"model": {"name": name, "args": TINY[name]}, "data": {"train": "x"}})
    torch.manual_seed(0)
    eager = build_net(cfg, num_speakers=6, autocast=autocast).to(device)
    compiled = copy.deepcopy(eager)
    apply_switches(resolve_switches(True, False, False, compiled.model, device), compiled, print)
    # (4, 48, 80): the micro-batches of tests/test_speedups.py's compiled training run (4 crops of 0.5 s, 48 frames),
    # whose model is TINY["eres2net_base"]: that run, later in the same process, reuses this step's compiled graphs
    # instead of compiling its own shape (141 s of CPU with an empty inductor cache, one thread, 2-core Intel VM).
    feats = torch.randn(4, frames, 80, generator=torch.Generator().manual_seed(1)).to(device)
    labels = torch.tensor([0, 3, 5, 3], device=device)
    results = []
    for net in (eager, compiled):
        net.classifier.set_margin(0.2)
        opt = build_optimizer(cfg, net)
        before = {k: p.detach().clone() for k, p in net.named_parameters()}
        loss, _ = net(feats, labels)
        loss.backward()
        grads = {k: p.grad.clone() for k, p in net.named_parameters()}
        opt.step()
        updates = {k: p.detach() - before[k] for k, p in net.named_parameters()}
        results.append((loss.detach(), grads, updates, {k: b.clone() for k, b in net.named_buffers()}))
    (loss_e, grads_e, updates_e, buffers_e), (loss_c, grads_c, updates_c, buffers_c) = results
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-5)
    close_in_norm(grads_c, grads_e, "gradient")
    close_in_norm(updates_c, updates_e, "update")
    for k in buffers_e:  # BatchNorm running statistics: from the forward pass alone
        torch.testing.assert_close(buffers_c[k], buffers_e[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def close_in_norm(got, want, what):
    """Per tensor, the error's norm within 5e-3 of the tensor's own norm plus 1e-6 of the whole set's (the first-batch
    check's measure, speakerlab.train.hardware.speedups.worst_error, floor 1e-6 / 5e-3). Measured (CPU): ERes2Net's
    worst tensor, its first conv, is 1.1e-3 off (reductions over ~2e4 positions summed in another order)."""
    names = list(want)
    score, name = worst_error(names, [got[k] for k in names], [want[k] for k in names], 1e-6 / 5e-3)
    assert score <= 5e-3, f"{name}: |{what} error| {score:.3g} of its norm (+ the floor)"
