"""Metrics: the run's throughput clock, and the per-step JSON-lines log (--metrics-jsonl PATH)."""
from __future__ import annotations

import json
import time
from pathlib import Path


class MetricsLog:
    """Appends {step, epoch, loss, lr, grad_norm, samples_per_s, scale} lines; buffered,
    flushed at every epoch's end and on close, so that a step costs no system call."""

    def __init__(self, path: str | Path) -> None:
        self.file = open(path, "a", buffering=1 << 16)
        self.last = time.perf_counter()

    def step(self, *, step: int, epoch: int, samples: int, loss: float, lr: float, grad_norm: float | None,
             scale: float | None) -> None:
        """One optimizer step that trained `samples` items over all ranks."""
        now = time.perf_counter()
        rate = samples / (now - self.last) if now > self.last else None
        self.last = now
        self.file.write(json.dumps({"step": step, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                                    "samples_per_s": rate, "scale": scale}) + "\n")

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class Clock:
    """Throughput over the timed loop: from the end of the first step, so that start-up and
    warm-up are excluded; the wall-clock time of that first step is kept for the benchmark."""

    def __init__(self) -> None:
        self.start_unix = time.time()
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


def write_summary(path: str | Path, summary: dict) -> None:
    """The run's figures as one JSON file (the benchmark reads it)."""
    Path(path).write_text(json.dumps(summary, indent=1) + "\n")
