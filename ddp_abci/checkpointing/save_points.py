"""When the run saves. Always at an epoch's end, an agreed stop and the run's end; besides,
every --save-every-steps optimizer steps, and every --save-every-minutes of rank 0's clock,
which the ranks agree on at the stop agreement so that all save at the same step.

--save-every-minutes auto takes the interval that loses the least work to failures to first
order, Young's sqrt(2 x stall x MTBF) (J. W. Young, "A first order approximation to the
optimum checkpoint interval", CACM 17(9), 1974; J. T. Daly, FGCS 22(3), 2006, refines it
for intervals near the MTBF), from the stall the first save measured and --mtbf-hours.
Until then it uses the stall estimated from the checkpoint's size.
"""
from __future__ import annotations

import math
import time

ASSUMED_COPY_BYTES_PER_S = 1e9  # serialising into memory, before the first save measures it


class SavePoints:
    def __init__(self, every_steps: int, every_minutes: float | str, mtbf_hours: float, enabled: bool,
                 estimated_stall_s: float) -> None:
        self.every_steps = every_steps if enabled else 0
        self.auto = enabled and every_minutes == "auto"
        self.mtbf_s = mtbf_hours * 3600
        minutes = 0.0 if not enabled or self.auto else float(every_minutes)
        self.interval_s = young_interval_s(estimated_stall_s, self.mtbf_s) if self.auto else 60 * minutes
        self.last = time.monotonic()
        self.measured = False

    @property
    def by_clock(self) -> bool:
        return self.interval_s > 0

    def step_due(self, step: int) -> bool:
        return bool(self.every_steps) and step % self.every_steps == 0

    def clock_due(self) -> bool:
        """Rank 0's view: the interval has passed since the last save."""
        return self.by_clock and time.monotonic() - self.last >= self.interval_s

    def saved(self, stall_s: float) -> str | None:
        """A save just happened, stalling the loop `stall_s`; with auto, the first one sets the
        interval, and the line saying so is returned."""
        self.last = time.monotonic()
        if not self.auto or self.measured:
            return None
        self.measured = True
        self.interval_s = young_interval_s(stall_s, self.mtbf_s)
        return (f"save interval: auto chose {self.interval_s / 60:.3g} min = sqrt(2 x {stall_s:.2f} s stall of the "
                f"first save x {self.mtbf_s / 3600:g} h MTBF) (Young 1974): the interval that loses the least work "
                "to failures; set --mtbf-hours to your cluster's")


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval; at least a second."""
    return max(1.0, math.sqrt(2 * max(stall_s, 1e-3) * mtbf_s))
