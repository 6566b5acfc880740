"""Metrics: the run's throughput clock, and the per-step JSON-lines log (--metrics-jsonl PATH)."""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends {step, epoch, loss, lr, grad_norm, samples_per_s, scale} lines; buffered,
    flushed at every epoch's end and on close, so that a step costs no system call.

    A write that fails (disk full, quota, folder gone) is reported once and ends this log,
    not the training: the metrics are a by-product, the checkpoint is what must not be lost."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.file = open(path, "a", buffering=1 << 16)
        self.last = time.perf_counter()

    def step(self, *, step: int, epoch: int, samples: int, loss: float, lr: float, grad_norm: float | None,
             scale: float | None, start: bool = False) -> float | None:
        """One optimizer step that trained `samples` items over all ranks; returns its samples/s.
        On a run's first step (`start`) samples_per_s is null: it has no step before it, and
        the plot marks such a line after step 1 as a resume."""
        now = time.perf_counter()
        rate = samples / (now - self.last) if now > self.last and not start else None
        self.last = now
        self._guard(self.file and self.file.write, json.dumps({
            "step": step, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": grad_norm,
            "samples_per_s": rate, "scale": scale}) + "\n")
        return rate

    def flush(self) -> None:
        self._guard(self.file and self.file.flush)

    def close(self) -> None:
        if self.file is not None:
            self._guard(self.file.close)
            self.file = None

    def _guard(self, write, *args: object) -> None:
        if not write:
            return
        try:
            write(*args)
        except OSError as e:
            print(f"warning: --metrics-jsonl {self.path}: {e.strerror or e}; the metrics log stops here, "
                  "training goes on", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                self.file.close()  # may retry the buffered write and fail again: nothing more to do
            self.file = None


class Clock:
    """Throughput over the timed loop: from the end of the first step, so that start-up and
    warm-up are excluded; the wall-clock time of that first step is kept for the benchmark."""

    def __init__(self, startup: dict[str, float] | None = None) -> None:
        self.start_unix = time.time()
        # Start-up milestones (unix times: process start, imports, launch, group, DDP), so the
        # benchmark can show where the time to the first step goes.
        self.startup = dict(startup or {})
        self.first_step_unix: float | None = None
        self._t0 = 0.0
        self.samples = 0
        self.seconds = 0.0

    def step_done(self, now: float, samples: int) -> None:
        if self.first_step_unix is None:
            self.first_step_unix, self._t0 = time.time(), now
        else:
            self.samples += samples
            self.seconds = now - self._t0

    def samples_per_s(self) -> float | None:
        return self.samples / self.seconds if self.seconds else None


def peak_memory_mib(device) -> tuple[float, str]:
    """This rank's peak memory in MiB and what it measures: CUDA's allocator on GPUs, the
    process's resident set (ru_maxrss, KiB on Linux) on the CPU."""
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_rss"


def run_summary(world_size: int, global_batch: int, precision: str, steps: int, final_loss: float, clock: Clock,
                peaks: list[float], memory_kind: str, stopped_by: str | None, device: Any) -> dict:
    """The summary's keys (the benchmark reads them)."""
    import torch

    return {
        "side": "raw", "world_size": world_size, "global_batch": global_batch,
        "precision": precision, "steps": steps, "final_loss": final_loss,
        "samples_per_s": clock.samples_per_s(),
        "start_unix": clock.start_unix, "first_step_unix": clock.first_step_unix, "startup_unix": clock.startup,
        "peak_mem_mib_per_rank": peaks, "memory_kind": memory_kind, "stopped_by": stopped_by,
        "device": str(device), "torch": torch.__version__, "python": sys.version.split()[0],
    }


def write_summary(path: str | Path, summary: dict) -> None:
    """The run's figures as one JSON file (the benchmark reads it). A failed write is one
    warning, not a failed run: the training and its checkpoint are already done."""
    try:
        Path(path).write_text(json.dumps(summary, indent=1) + "\n")
    except OSError as e:
        print(f"warning: --summary-json {path} could not be written: {e.strerror or e}", file=sys.stderr, flush=True)
