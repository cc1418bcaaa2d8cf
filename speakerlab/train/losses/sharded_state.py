"""A classifier's rows in checkpoints: a sharded head (speakerlab.train.losses.sharded) is saved whole, its rows and
the optimizer's per-row state (momentum, Adam's moments) gathered into rank 0's host memory, one rank's rows at a
time, so the file is the unsharded head's; each rank of a resumed run, on any number of ranks, takes its own rows
back. `start_rows` starts a head's rows from another classifier's (train.init with matching speakers), sub-centers
and shards included.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from speakerlab.train.losses.sharded import Sharded, shard_range


def _gather_rows(local: torch.Tensor, head) -> Optional[torch.Tensor]:
    """This rank's rows of a per-row tensor of `head` -> the full tensor in rank 0's host memory (None elsewhere).
    Rank 0 receives one rank's rows at a time and moves them to the host: its device never holds the whole head."""
    k = head.subcenters
    counts = [(hi - lo) * k for lo, hi in (shard_range(head.num_classes, r, head.world) for r in range(head.world))]
    if head.rank != 0:
        dist.send(local.contiguous(), dst=0)
        return None
    parts = [local.detach().cpu()]
    for r in range(1, head.world):
        rows = local.new_empty((counts[r], *local.shape[1:]))
        dist.recv(rows, src=r)
        parts.append(rows.cpu())
    return torch.cat(parts)


def head_state(head: nn.Module) -> Optional[Dict[str, torch.Tensor]]:
    """The classifier's state dict as a checkpoint holds it: a sharded head's full rows, on rank 0 (None on the
    others; every rank must call this). Any other head: its state dict."""
    state = head.state_dict()
    if not isinstance(head, Sharded) or head.world == 1:
        return state
    full = _gather_rows(state["weight"], head)
    return None if full is None else {**state, "weight": full}


def _row_param(optimizer: torch.optim.Optimizer, head) -> Optional[int]:
    """The index of a sharded head's weight in `optimizer.state_dict()` (its parameter order)."""
    if not isinstance(head, Sharded) or head.world == 1:
        return None
    params = [p for g in optimizer.param_groups for p in g["params"]]
    return next((i for i, p in enumerate(params) if p is head.weight), None)


def optimizer_state(optimizer: torch.optim.Optimizer, head: nn.Module) -> Optional[dict]:
    """`optimizer.state_dict()` with a sharded head's per-row state (momentum, Adam's moments) gathered in full,
    on rank 0 (None on the others; every rank must call this)."""
    state = optimizer.state_dict()
    index = _row_param(optimizer, head)
    if index is None:
        return state
    rows = head.weight.shape[0]
    kept = state["state"].get(index, {})
    per_row = {k: v for k, v in kept.items() if torch.is_tensor(v) and v.dim() and v.shape[0] == rows}
    full = {k: _gather_rows(v, head) for k, v in sorted(per_row.items())}
    if head.rank != 0:
        return None
    return {**state, "state": {**state["state"], index: {**state["state"][index], **full}}}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict, head: nn.Module) -> None:
    """`optimizer.load_state_dict(state)`, a sharded head's per-row state (saved in full) cut to this rank's rows."""
    index = _row_param(optimizer, head)
    if index is not None and index in state["state"]:
        k, full_rows = head.subcenters, head.num_classes * head.subcenters
        cut = {
            name: v[head.lo * k : head.hi * k] if torch.is_tensor(v) and v.dim() and v.shape[0] == full_rows else v
            for name, v in state["state"][index].items()
        }
        state = {**state, "state": {**state["state"], index: cut}}
    optimizer.load_state_dict(state)


def start_rows(head: nn.Module, source: Dict[str, torch.Tensor], source_classes: int, pairs) -> int:
    """Start the rows of speakers `pairs` [(this head's class, the source's class)] from a source classifier's
    state dict of `source_classes` classes: sub-center j from the source's j mod its sub-centers (a head of one
    direction per speaker seeds all K alike); a sharded head takes the pairs in its shard. SphereFace2's bias is
    taken too when both have one. Returns how many speakers (of all ranks) were started."""
    weight = source["weight"]
    k, k_src = head.subcenters, max(1, weight.shape[0] // max(source_classes, 1))
    lo, hi = (head.lo, head.hi) if isinstance(head, Sharded) else (0, head.weight.shape[0] // k)
    mine = [(n - lo, o) for n, o in pairs if lo <= n < hi]
    with torch.no_grad():
        if mine:
            new, old = torch.tensor(mine).T
            sub = torch.arange(k)
            rows = (new[:, None] * k + sub).reshape(-1)
            taken = (old[:, None] * k_src + sub % k_src).reshape(-1)
            head.weight[rows.to(head.weight.device)] = weight[taken].to(head.weight)
        if "bias" in source and hasattr(head, "bias"):
            head.bias.copy_(source["bias"].to(head.bias))
    return len(pairs)
