"""Learning-rate and margin schedules, pure functions of the global optimizer step.

Because they depend only on the step and on epoch length in optimizer steps (fixed by the global
batch, not by the number of GPUs), a run resumed at step k, or moved to other hardware, follows the
same schedule.
"""

from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, warmup_steps: int, peak_lr: float, min_lr: float) -> float:
    """Linear warmup from peak/warmup to `peak_lr`, then half-cosine decay to `min_lr` at `total_steps`."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def margin_at(step: int, steps_per_epoch: int, final_margin: float, start_epoch: float, warmup_epochs: float) -> float:
    """0 before `start_epoch`, then linear to `final_margin` over `warmup_epochs` (in optimizer steps)."""
    epoch = step / max(1, steps_per_epoch)
    if epoch < start_epoch:
        return 0.0
    if warmup_epochs <= 0:
        return final_margin
    return final_margin * min(1.0, (epoch - start_epoch) / warmup_epochs)
