"""Slow ranks, named while training (as NVIDIA's resiliency extension scores them).

In synchronous DDP every rank goes at the pace of the slowest, so a rank's step time says
nothing; its compute time does. Each rank times its own steps without the time it waited in
collectives (the watchdog's marks), reading its batches included, and sends the median of
those since the last check in its own slot of the stop agreement: no collective of its own.
Rank 0 scores each rank every report interval (--log-every):

    relative    the fastest rank's median over this rank's        (a rank slower than its peers)
    individual  this rank's best interval median over its current (a rank slower than it was)

and a rank whose relative score is below --straggler-threshold (0.75, as NVIDIA's default) is
named in one line when it starts straggling and again when it recovers. The individual score
is reported beside it, and kept in the summary and the logs, but names no one by itself: a
busy machine slows every rank alike, and then no rank is slower than its peers.

On GPUs the clock is the host's: the NCCL waits happen on the device, so there the scores
follow the host's pace (not run here: no GPU was lent). The hosts that straggled go
to CKPT_DIR/slow_hosts.json, which submit.sh's next job of a chain leaves out (Slurm).
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any

from . import run_folder


class StepClock:
    """Each rank's compute time per step: wall time since the last step, less the waits."""

    def __init__(self, watchdog: Any) -> None:
        self.watchdog = watchdog
        self.samples: list[float] = []
        self.mark, self.waited = time.perf_counter(), watchdog.waited_s

    def restart(self) -> None:
        """After work that is not a step (a save, an evaluation): it is not timed."""
        self.mark, self.waited = time.perf_counter(), self.watchdog.waited_s

    def step_done(self, now: float) -> None:
        """A step ended at `now` (time.perf_counter())."""
        waited = self.watchdog.waited_s
        self.samples.append(max(0.0, (now - self.mark) - (waited - self.waited)))
        self.mark, self.waited = now, waited

    def take_median_us(self) -> int:
        """The median since the last call, in microseconds (0: no step)."""
        samples = sorted(self.samples)  # statistics.median's value, at a fraction of its cost (once per check)
        self.samples.clear()
        n = len(samples)
        return int((samples[n // 2] + samples[(n - 1) // 2]) / 2 * 1e6) if n else 0


class StragglerWatch:
    """Rank 0's scores of every rank, from the agreed compute times."""

    def __init__(self, threshold: float, hosts: list[str], every_s: float, ckpt_dir: str | None) -> None:
        self.threshold, self.hosts, self.every_s = threshold, hosts, every_s
        self.file = run_folder.path(ckpt_dir, run_folder.SLOW_HOSTS) if ckpt_dir else None
        self.window: list[list[int]] = [[] for _ in hosts]   # this interval's medians, per rank
        self.medians: list[list[int]] = [[] for _ in hosts]  # every interval's median, per rank
        self.best = [0] * len(hosts)
        self.straggling: set[int] = set()
        self.slow: dict[str, float] = {}                     # host -> its worst score
        self.scores = [1.0] * len(hosts)       # relative: the fastest rank's median over this rank's
        self.individual = [1.0] * len(hosts)   # this rank's best interval median over its current
        self.last = time.monotonic()

    def observe(self, compute_us: tuple[int, ...]) -> list[str]:
        """One agreement's medians; at the end of a report interval, the lines to print."""
        if not self.threshold:
            return []
        for rank, us in enumerate(compute_us):
            if us:
                self.window[rank].append(us)
        if time.monotonic() - self.last < self.every_s or not all(self.window):
            return []
        self.last = time.monotonic()
        return self._score()

    def _score(self) -> list[str]:
        current = [int(statistics.median(w)) for w in self.window]
        self.window = [[] for _ in self.hosts]
        fastest, middle = min(current), statistics.median(current)
        lines = []
        for rank, us in enumerate(current):
            self.medians[rank].append(us)
            self.best[rank] = min(self.best[rank] or us, us)
            relative, individual = fastest / us, self.best[rank] / us
            self.scores[rank], self.individual[rank] = relative, individual
            score = relative
            if score < self.threshold and rank not in self.straggling:
                self.straggling.add(rank)
                self.slow[self.hosts[rank]] = min(score, self.slow.get(self.hosts[rank], 1.0))
                lines.append(f"straggler: rank {rank} (host {self.hosts[rank]}) score {score:.2f}: its step compute "
                             f"{us / 1e3:.2f} ms against the ranks' median {middle / 1e3:.2f} ms (relative "
                             f"{relative:.2f}, individual {individual:.2f}, threshold {self.threshold:g})")
            elif score >= self.threshold and rank in self.straggling:
                self.straggling.discard(rank)
                lines.append(f"straggler: rank {rank} (host {self.hosts[rank]}) recovered: score {score:.2f}")
        if lines and self.slow:
            self._write()
        return lines

    def _write(self) -> None:
        if self.file is None:
            return
        try:  # one line: the job scripts read "hosts" with grep
            self.file.write_text(json.dumps({"hosts": sorted(self.slow), "worst_score": self.slow,
                                             "threshold": self.threshold}) + "\n")
        except OSError:
            pass  # a report, not the run: the checkpoint folder's own failures are said at the next save

    def summary(self) -> list[dict]:
        """Each rank's median step compute over the run and its last score (the summary JSON)."""
        def median_ms(rank: int) -> float | None:  # the intervals', or the run's only, unfinished one
            values = self.medians[rank] or self.window[rank]
            return statistics.median(values) / 1e3 if values else None

        return [{"rank": rank, "host": host, "median_step_compute_ms": median_ms(rank),
                 "score": round(self.scores[rank], 4), "individual_score": round(self.individual[rank], 4)}
                for rank, host in enumerate(self.hosts)]

    def tracked(self) -> dict[str, float]:
        """The scores for the metrics log and TensorBoard."""
        return {**{f"straggler/score_rank{rank}": score for rank, score in enumerate(self.scores)},
                **{f"straggler/individual_rank{rank}": score for rank, score in enumerate(self.individual)}}
