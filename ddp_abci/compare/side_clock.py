"""What every peer of the raw trainer records for the benchmark, the raw trainer's way: the
start-up marks, a throughput clock that starts after the first step, and the summary JSON
(the same keys as tracking.run_summary's). The peers stay as their users write them; this is
the benchmark's stopwatch beside them."""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path


class SideClock:
    def __init__(self, process_started: float) -> None:
        self.startup = {"process_unix": process_started, "imports_unix": time.time()}
        self.first_step_unix: float | None = None
        self.samples, self.t0, self.elapsed = 0, 0.0, 0.0

    def mark(self, phase: str) -> None:
        """The end of a start-up phase: group (rendezvous and group), ddp (model and DDP)."""
        self.startup[f"{phase}_unix"] = time.time()

    def step_done(self, samples: int) -> None:
        """One optimizer step that trained `samples` items over all ranks."""
        now = time.perf_counter()
        if self.first_step_unix is None:
            self.first_step_unix, self.t0 = time.time(), now
        else:
            self.samples, self.elapsed = self.samples + samples, now - self.t0

    def summary(self, side: str, world_size: int, global_batch: int, precision: str, steps: int, final_loss: float,
                peaks: list[float], **extra: object) -> dict:
        return {"side": side, "world_size": world_size, "global_batch": global_batch, "precision": precision,
                "steps": steps, "final_loss": final_loss,
                "samples_per_s": self.samples / self.elapsed if self.elapsed > 0 else None,
                "first_step_unix": self.first_step_unix, "startup_unix": self.startup,
                "peak_mem_mib_per_rank": peaks, "memory_kind": "max_rss",
                "python": sys.version.split()[0], **extra}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write(path: str | None, summary: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(summary, indent=1) + "\n")
