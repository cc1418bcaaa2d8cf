"""Non-finite guard: skip optimizer steps whose loss or gradient norm is not finite.

A skipped step changes no weight. It is counted and logged with the files of its batch (the ones
whose features are non-finite when there are any, e.g. a wav holding NaN samples). After
`max_consecutive` skipped steps in a row training stops with `TrainingStopped`, before any further
checkpoint is written, so the last good checkpoint is intact.
"""
from __future__ import annotations

import math
from typing import List, Tuple

import torch
import torch.distributed as dist


class TrainingStopped(RuntimeError):
    """Training cannot continue; the message names the cause."""


class NonFiniteGuard:
    def __init__(self, max_consecutive: int):
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total = 0

    @staticmethod
    def nonfinite_rows(feats: torch.Tensor) -> torch.Tensor:
        """`(B, T, F)` features -> `(B,)` bool mask of rows holding NaN/inf. Stays on the device (no
        host sync in the training step); it is read only when a step turns out non-finite."""
        return ~torch.isfinite(feats).flatten(1).all(dim=1)

    @staticmethod
    def _files(pending: List[Tuple[torch.Tensor, torch.Tensor]], dataset) -> List[str]:
        return [dataset.paths[int(i)] for index, bad in pending for i in index[bad.cpu()].tolist()]

    def check(self, run, loss: float, grad_norm: float, pending: List[Tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """True when the step may update the weights. `pending` holds each micro-batch's
        (utterance indices, `nonfinite_rows` mask). The answer is the same on every rank: the flag
        is all-reduced, so one rank's NaN batch skips the step everywhere."""
        local_bad = not (math.isfinite(loss) and math.isfinite(grad_norm))
        fp16_overflow = run.precision.use_scaler and math.isfinite(loss) and run.scaler.get_scale() >= 1.0
        flag = torch.tensor([float(local_bad)], device=run.device)
        if run.info.enabled:
            dist.all_reduce(flag)
        if not flag.item():
            self.consecutive = 0
            return True
        bad_files = self._files(pending, run.loader.dataset)
        if run.info.enabled:  # every rank is here (the flag is shared): gather the culprits once
            gathered = [None] * run.info.world_size
            dist.all_gather_object(gathered, bad_files)
            bad_files = [f for part in gathered for f in part]
        if fp16_overflow and not bad_files:
            # fp16 gradients overflowing at a large loss scale is the GradScaler's business: it halves
            # the scale and the step is skipped, without counting toward the stop limit.
            run.monitor.log(f"step {run.step}: fp16 gradient overflow, loss scale -> {run.scaler.get_scale() / 2:g}")
            return False
        self.total += 1
        self.consecutive += 1
        cause = (f"non-finite input features in {', '.join(bad_files[:8])}" if bad_files
                 else f"loss {loss:.4g}, gradient norm {grad_norm:.4g} (no input was non-finite)")
        run.monitor.log(f"step {run.step} skipped (#{self.total}, {self.consecutive} in a row): {cause}")
        if self.consecutive >= self.max_consecutive:
            raise TrainingStopped(
                f"{self.consecutive} consecutive steps had a non-finite loss or gradient (last: {cause}); "
                "check the audio named above, lower optim.lr, or use bf16/fp32 instead of fp16. "
                "The last checkpoint in the exp dir is from before these steps and can be resumed.")
        return False
