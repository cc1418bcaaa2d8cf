"""Non-finite guard: skip optimizer steps whose loss or gradient norm is not finite.

A skipped step changes no weight. It is counted and logged with the files of its batch (the ones
whose features are non-finite when there are any, e.g. a wav holding NaN samples). After
`max_consecutive` skipped steps in a row training stops with `TrainingStopped`, before any further
checkpoint is written, so the last good checkpoint is intact.
"""

from __future__ import annotations

import math
from typing import Callable, List, Sequence, Tuple

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


def batch_culprits(pending: List[Tuple[torch.Tensor, torch.Tensor]], paths: Sequence[str], info) -> List[str]:
    """Files of a step's micro-batches whose features were non-finite, gathered from every rank.

    `pending` holds each micro-batch's (utterance indices, `nonfinite_rows` mask)."""
    files = [paths[int(i)] for index, bad in pending for i in index[bad.cpu()].tolist()]
    if info.enabled:
        gathered = [None] * info.world_size
        dist.all_gather_object(gathered, files)
        files = [f for part in gathered for f in part]
    return files
