"""When the ranks act together: a stop signal, the --stop-after deadline, a run that
diverged, a save that is due by the clock, a stream that runs out, and each rank's step time.

Every rank must leave the loop (or save, or end an epoch) at the same step, or the next
collective hangs; so each decision is one all-reduce (MAX) of a small vector, taken at the
same step on every rank: every --stop-check-every steps, at each save point and at the
run's last step. Checkpoints are written only right after such an agreement, so a diverged
state is never saved: the divergence is always seen before the save. The vector also
carries each rank's compute time in a slot of its own (zeros elsewhere, so MAX gathers
them): the straggler report costs no collective of its own.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
import torch

from .gradients import GradientPath
from .signals import DEADLINE, StopRequest

# What went wrong, in the order MAX prefers: any rank's divergence beats a stop signal.
OK, LOSS, GRAD_NORM, FP16_SKIPS = 0, 1, 2, 3
_WHAT = {LOSS: "the loss", GRAD_NORM: "the gradient norm", FP16_SKIPS: "fp16's GradScaler"}
FIELDS = 4  # signal, diverged, save, shortfall; then one compute slot per rank


class Verdict(NamedTuple):
    signal: int              # the stop signal some rank received, DEADLINE, or 0
    diverged: int            # OK, LOSS, GRAD_NORM or FP16_SKIPS
    save: int = 0            # 1: a save is due by rank 0's clock (--save-every-minutes)
    shortfall: int = 0       # the most steps any rank's stream lacks before the next check
    compute_us: tuple[int, ...] = ()  # each rank's median step compute since the last check, in µs

    def __bool__(self) -> bool:
        return bool(self.signal or self.diverged)


class Agreement:
    """Watches each step for free (host values the loop has anyway, device tensors it
    sums anyway) and turns what it saw into one agreed Verdict at the check steps."""

    def __init__(self, stop: StopRequest, every: int, path: GradientPath, device: torch.device, rank: int,
                 world_size: int, guard_finite: bool, max_fp16_skips: int, stop_after_s: float = 0.0,
                 expected_save_s: float = 0.0, step: int = 0, stop_at: float = 0.0) -> None:
        """stop_after_s: a deadline that many seconds after this process started; stop_at: one at
        that wall-clock time (seconds since 1970), on this rank's clock; the earlier counts."""
        self.stop, self.every, self.path, self.device = stop, every, path, device
        self.rank, self.world_size = rank, world_size
        self.guard_finite, self.max_fp16_skips = guard_finite, max_fp16_skips
        deadlines = ([(stop.created + stop_after_s, "--stop-after")] if stop_after_s else []) + \
            ([(time.monotonic() + stop_at - time.time(), "--stop-at")] if stop_at else [])
        self.deadline, self.deadline_flag = min(deadlines) if deadlines else (None, "")
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
        """A save cost this long, the loop's stall and a background write together (on rank
        0, which writes; the others count their wait): the --stop-after reserve grows with it."""
        self.save_s = max(self.save_s, seconds)

    def reserve_s(self) -> float:
        """Time kept free before the deadline: two of the longest save (a write in flight and
        the stop's own) and of the longest run of steps between checks seen so far, plus a
        second. Measured as the run goes."""
        return 2 * self.save_s + 2 * self.interval_s + 1.0

    def _deadline_near(self) -> bool:
        now = time.monotonic()
        self.interval_s, self.last_check = max(self.interval_s, now - self.last_check), now
        return self.deadline is not None and now + self.reserve_s() >= self.deadline

    def deadline_line(self) -> str:
        """The start's line about the deadline: when it is, and what happens there."""
        left = self.deadline - time.monotonic()
        if left <= self.reserve_s():
            return (f"deadline: {self.deadline_flag} is {'past' if left <= 0 else 'too near to train'} "
                    f"({left:.0f}s from now): the run stops at its first check, within {self.every} steps, "
                    "saves and exits 75")
        return (f"deadline: {self.deadline_flag} stops, saves and exits 75 with at least {self.reserve_s():.1f}s to "
                f"spare (twice the longest save and check interval, measured as the run goes), {left:.0f}s from now")

    def due(self, step: int) -> bool:
        """A check step (the trainer also agrees at every save point)."""
        return step % self.every == 0

    def steps_to_next_check(self, step: int) -> int:
        """How many steps until the next check step after `step`."""
        return self.every - step % self.every

    def agree(self, step: int, epoch_loss_sum: torch.Tensor, *, save_due: bool = False, shortfall: int = 0,
              compute_us: int = 0) -> Verdict:
        """The verdict every rank shares. `epoch_loss_sum` is the epoch's running sum of step
        losses: a non-finite step loss makes it non-finite for good (inf and nan propagate
        through a sum), so one read here checks every step since the last check, with no
        per-step host sync."""
        self.checked_step = step
        deadline = DEADLINE if self._deadline_near() else 0
        vector = [max(self.stop.received, deadline), self._local_divergence(epoch_loss_sum), int(save_due),
                  shortfall] + [0] * self.world_size
        vector[FIELDS + self.rank] = compute_us
        if self.world_size > 1:
            vector = self.path.max_vector(vector, self.device)
        return Verdict(*vector[:FIELDS], compute_us=tuple(vector[FIELDS:]))

    def _local_divergence(self, epoch_loss_sum: torch.Tensor) -> int:
        if self.max_fp16_skips and self.skips_in_a_row >= self.max_fp16_skips:
            return FP16_SKIPS
        if not self.guard_finite:
            return OK
        if self.bad_norm is not None:
            return GRAD_NORM
        return OK if np.isfinite(epoch_loss_sum.item()) else LOSS

    def describe(self, kind: int, since_step: int, step: int, last_loss: float, ckpt_file: object, lr: float) -> str:
        """The one line a divergence ends with (the value is this rank's, rank 0's when printed)."""
        if kind == FP16_SKIPS:
            what = f"fp16's GradScaler skipped {self.skips_in_a_row} steps in a row (inf/nan gradients every step)"
        elif kind == GRAD_NORM and self.bad_norm is not None:
            what = f"the gradient norm became {self.bad_norm}"
        else:
            what = f"{_WHAT[kind]} became non-finite (last step loss {last_loss})"
        kept = (f"{ckpt_file} from before it was kept, the diverged state was not saved" if ckpt_file
                else "nothing was saved (no --ckpt-dir)")
        return (f"diverged: {what} between steps {since_step + 1} and {step}; {kept}; try a lower lr (--lr) "
                f"(this run: {lr:g}) or clip_norm (--clip-norm), then resume")
