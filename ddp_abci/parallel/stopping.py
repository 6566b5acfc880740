"""When the ranks stop together: a stop signal, the --stop-after deadline, or a run that diverged.

Every rank must leave the loop at the same step, or the next collective hangs; so each
decision is one all-reduce (MAX) of a small vector, taken at the same step on every rank:
every --stop-check-every steps, at each epoch's last step and at the run's last step.
Checkpoints are written only right after such an agreement, so a diverged state is never
saved: the divergence is always seen before the save.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from .mpi_hook import mpi_max_vector
from .signals import DEADLINE, StopRequest

# What went wrong, in the order MAX prefers: any rank's divergence beats a stop signal.
OK, LOSS, GRAD_NORM, FP16_SKIPS = 0, 1, 2, 3
_WHAT = {LOSS: "the loss", GRAD_NORM: "the gradient norm", FP16_SKIPS: "fp16's GradScaler"}


class Verdict(NamedTuple):
    signal: int      # the stop signal some rank received, DEADLINE, or 0
    diverged: int    # OK, LOSS, GRAD_NORM or FP16_SKIPS

    def __bool__(self) -> bool:
        return bool(self.signal or self.diverged)


class StopAgreement:
    """Watches each step for free (host values the loop has anyway, device tensors it
    sums anyway) and turns what it saw into one agreed Verdict at the check steps."""

    def __init__(self, stop: StopRequest, every: int, comm: str, device: torch.device, world_size: int,
                 guard_finite: bool, max_fp16_skips: int, stop_after_s: float = 0.0,
                 expected_save_s: float = 0.0, step: int = 0) -> None:
        self.stop, self.every, self.comm, self.device, self.world_size = stop, every, comm, device, world_size
        self.guard_finite, self.max_fp16_skips = guard_finite, max_fp16_skips
        self.deadline = stop.created + stop_after_s if stop_after_s else None
        self.save_s, self.interval_s, self.last_check = expected_save_s, 0.0, time.monotonic()
        self.bad_norm: float | None = None
        self.skips_in_a_row = 0
        self.checked_step = step  # the last agreed step: a divergence is reported since then

    def watch(self, grad_norm: float | None, skipped: bool) -> None:
        """After each step: the gradient norm (a host float when clipping) and fp16's skip."""
        if self.guard_finite and grad_norm is not None and not math.isfinite(grad_norm):
            self.bad_norm = grad_norm
        self.skips_in_a_row = self.skips_in_a_row + 1 if skipped else 0

    def saved(self, seconds: float) -> None:
        """A checkpoint write took this long (on this rank, waiting for rank 0 included)."""
        self.save_s = max(self.save_s, seconds)

    def reserve_s(self) -> float:
        """Time kept free before the deadline: two of the longest save and of the longest run
        of steps between checks seen so far, plus a second. Measured as the run goes."""
        return 2 * self.save_s + 2 * self.interval_s + 1.0

    def _deadline_near(self) -> bool:
        now = time.monotonic()
        self.interval_s, self.last_check = max(self.interval_s, now - self.last_check), now
        return self.deadline is not None and now + self.reserve_s() >= self.deadline

    def deadline_line(self) -> str:
        left = self.deadline - time.monotonic()
        return (f"deadline: --stop-after stops, saves and exits 75 with at least {self.reserve_s():.1f}s to spare "
                f"(twice the longest save and check interval, measured as the run goes), {left:.0f}s from now")

    def due(self, step: int) -> bool:
        """A check step (the trainer also agrees at every save point)."""
        return step % self.every == 0

    def agree(self, step: int, epoch_loss_sum: torch.Tensor) -> Verdict:
        """The verdict every rank shares. `epoch_loss_sum` is the epoch's running sum of step
        losses: a non-finite step loss makes it non-finite for good (inf and nan propagate
        through a sum), so one read here checks every step since the last check, with no
        per-step host sync."""
        self.checked_step = step
        deadline = DEADLINE if self._deadline_near() else 0
        local = Verdict(max(self.stop.received, deadline), self._local_divergence(epoch_loss_sum))
        if self.world_size == 1:
            return local
        if self.comm == "mpi":
            return Verdict(*mpi_max_vector(list(local)))
        flags = torch.tensor(list(local), dtype=torch.int64, device=self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return Verdict(*(int(v) for v in flags.tolist()))

    def _local_divergence(self, epoch_loss_sum: torch.Tensor) -> int:
        if self.max_fp16_skips and self.skips_in_a_row >= self.max_fp16_skips:
            return FP16_SKIPS
        if not self.guard_finite:
            return OK
        if self.bad_norm is not None:
            return GRAD_NORM
        return OK if np.isfinite(epoch_loss_sum.item()) else LOSS

    def describe(self, kind: int, since_step: int, step: int, last_loss: float) -> str:
        """The one line a divergence ends with (the value is this rank's, rank 0's when printed)."""
        if kind == FP16_SKIPS:
            what = f"fp16's GradScaler skipped {self.skips_in_a_row} steps in a row (inf/nan gradients every step)"
        elif kind == GRAD_NORM and self.bad_norm is not None:
            what = f"the gradient norm became {self.bad_norm}"
        else:
            what = f"{_WHAT[kind]} became non-finite (last step loss {last_loss})"
        return f"diverged: {what} between steps {since_step + 1} and {step}"
