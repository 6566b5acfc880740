"""Learning-rate schedule: linear warm-up, then constant or cosine decay to zero."""
from __future__ import annotations

import math

import torch

from .config import SCHEDULE_CHOICES as SCHEDULES
from .errors import UsageError
from .options import check_choice


class WarmupThen:
    """The LR factor at optimizer step s (a callable object, so LambdaLR can save it)."""

    def __init__(self, kind: str, warmup_steps: int, total_steps: int) -> None:
        self.kind, self.warmup, self.total = kind, warmup_steps, max(total_steps, warmup_steps + 1)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_schedule(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int,
                   total_steps: int) -> torch.optim.lr_scheduler.LambdaLR | None:
    """None when the LR stays constant from the first step: nothing to step, nothing to pay."""
    check_choice("--schedule", kind, SCHEDULES)
    if warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be 0 or more, got {warmup_steps}")
    if kind == "constant" and warmup_steps == 0:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupThen(kind, warmup_steps, total_steps))
