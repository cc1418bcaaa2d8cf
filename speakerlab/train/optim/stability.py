"""Non-finite guard: skip optimizer steps whose loss or gradient norm is not finite.

A skipped step changes no weight. It is counted and logged with the files of its batch (the ones
whose features are non-finite when there are any, e.g. a wav holding NaN samples). After
`max_consecutive` skipped steps in a row training stops with `TrainingStopped`, before any further
checkpoint is written, so the last good checkpoint is intact.

The verdict stays on the device: `step_unless` skips the update there, and the guard reads the step's
verdicts on the host on logging and saving steps only (`defer`, then `settle`, before anything is written).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


class TrainingStopped(RuntimeError):
    """Training cannot continue; the message names the cause."""


class NonFiniteGuard:
    """Counts skipped steps and stops training after too many in a row; testable alone.

    `log(message)` reports skips. Whether a step is bad is decided by the caller, the same on every rank
    (the training step's one all-reduce: speakerlab.train.step); `nonfinite` is the rule of one rank."""

    def __init__(self, max_consecutive: int, log: Callable[[str], None] = print):
        self.max_consecutive = max_consecutive
        self.log = log
        self.consecutive = 0
        self.total = 0
        self._deferred: List[tuple] = []  # (step, bad, loss, grad_norm, pending) of the steps not yet settled

    @staticmethod
    def nonfinite_rows(feats: torch.Tensor) -> torch.Tensor:
        """`(B, T, F)` features -> `(B,)` bool mask of rows holding NaN/inf. Stays on the device (no
        host sync in the training step); it is read only when a step turns out non-finite."""
        return ~torch.isfinite(feats).flatten(1).all(dim=1)

    @staticmethod
    def nonfinite(loss: torch.Tensor) -> torch.Tensor:
        """This rank's step is bad when its loss is not finite (a 0-dim bool tensor, on the device; the gradient
        norm, the same on every rank, is checked where it is known)."""
        return ~torch.isfinite(loss)

    def check(
        self,
        step: int,
        bad: bool,
        loss,
        grad_norm,
        culprits: Callable[[], List[str]],
        fp16_overflow: Callable[[], bool] = lambda: False,
    ) -> bool:
        """True when step `step` may update the weights. `bad`: some rank's loss or the gradient norm was not
        finite (the same verdict on every rank). `loss` and `grad_norm` (floats or tensors) are read only for a
        bad step's message, and `culprits()`, the files of the step's batch whose input was non-finite, called
        only then (on every rank). `fp16_overflow()`: the GradScaler is active at a scale >= 1, so a non-finite
        gradient may be its overflow."""
        if not bad:
            self.consecutive = 0
            return True
        loss, grad_norm = float(loss), float(grad_norm)
        bad_files = culprits()
        if math.isfinite(loss) and not bad_files and fp16_overflow():
            # fp16 gradients overflowing at a large loss scale is the GradScaler's business: it halves
            # the scale and the step is skipped, without counting toward the stop limit.
            self.log(f"step {step}: fp16 gradient overflow, the GradScaler lowers the loss scale")
            return False
        self.total += 1
        self.consecutive += 1
        cause = (
            f"non-finite input features in {', '.join(bad_files[:8])}"
            if bad_files
            else f"loss {loss:.4g}, gradient norm {grad_norm:.4g} (no input was non-finite)"
        )
        self.log(f"step {step} skipped (#{self.total}, {self.consecutive} in a row): {cause}")
        if self.consecutive >= self.max_consecutive:
            raise TrainingStopped(
                f"{self.consecutive} consecutive steps had a non-finite loss or gradient (last: {cause}); "
                "check the audio named above, lower optim.lr, or use bf16/fp32 instead of fp16. "
                "The last checkpoint in the exp dir is from before these steps and can be resumed."
            )
        return False

    def defer(self, step: int, bad: torch.Tensor, loss: torch.Tensor, grad_norm: torch.Tensor, pending) -> None:
        """Keep step `step`'s verdict (`bad`, a 0-dim bool tensor on the device) for `settle`: no host read.
        `pending`: the step's (utterance indices, `nonfinite_rows` mask) per micro-batch (`batch_culprits`)."""
        self._deferred.append((step, bad, loss, grad_norm, pending))

    def settle(
        self,
        culprits: Callable[[list], List[str]],
        fp16_overflow: Callable[[], bool] = lambda: False,
        extra: Optional[torch.Tensor] = None,
    ) -> List[float]:
        """`check` each deferred step in order (logging its skips, raising TrainingStopped past the limit), from
        one host read of their verdicts; `culprits(pending)` names a bad step's files. `extra`, a 1-D tensor on
        the device, is read in the same copy and returned as floats (the step's stop signals). The fp16 rule
        sees the loss scale of now (the GradScaler's scale is a host read: not taken at each step)."""
        steps, self._deferred = self._deferred, []
        flags = [bad.reshape(1).double() for _, bad, *_ in steps]
        if extra is not None:
            flags.append(extra.double())
        values = torch.cat(flags).tolist() if flags else []
        for (step, _, loss, grad_norm, pending), bad in zip(steps, values):
            self.check(step, bool(bad), loss, grad_norm, lambda p=pending: culprits(p), fp16_overflow)
        return values[len(steps) :]


def step_unless(optimizer: torch.optim.Optimizer, bad: torch.Tensor) -> None:
    """`optimizer.step()` unless `bad` (a 0-dim bool tensor on the device, the same on every rank), decided on the
    device. torch's fused SGD / Adam / AdamW kernels (CPU and CUDA) honour the optimizer's `found_inf` attribute,
    the public contract torch.amp.GradScaler uses: on a non-zero flag they leave the weights, the momentum and
    the Adam moments alone and Adam's step count is taken back; read in torch 2.13's optim/sgd.py, adam.py and
    amp/grad_scaler.py and checked by tests/test_train_units.py. The foreach and single-tensor paths refuse the
    attribute, so an optimizer without fused kernels is stepped on a host read of `bad`. The LR schedule and the
    run's step count are the caller's, moved whether the step was taken or not."""
    if not optimizer.defaults.get("fused"):
        if not bool(bad):
            optimizer.step()
        return
    prime_momentum(optimizer)
    optimizer.found_inf = bad.float()
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf


def prime_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Zero momentum buffers for SGD's parameters that have none. Fused SGD makes them on its first step with
    `empty_like` and fills them in the kernel: a first step skipped by `found_inf` would leave them unset (seen:
    the next step then differs). Zero then a step equals the first step's copy of the gradient (no dampening)."""
    for group in optimizer.param_groups:
        if not group.get("momentum"):
            continue
        if group.get("dampening"):
            raise ValueError("momentum with dampening: a zero buffer is not the first step's, see prime_momentum")
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def batch_culprits(pending: List[Tuple[torch.Tensor, torch.Tensor]], paths: Sequence[str], info) -> List[str]:
    """Files of a step's micro-batches whose features were non-finite, gathered from every rank.

    `pending` holds each micro-batch's (utterance indices, `nonfinite_rows` mask)."""
    files = [paths[int(i)] for index, bad in pending for i in index[bad.cpu()].tolist()]
    if info.enabled:
        gathered = [None] * info.world_size
        dist.all_gather_object(gathered, files)
        files = [f for part in gathered for f in part]
    return files
