"""What rank 0 records while a run trains: the per-step JSON-lines log (--metrics-jsonl),
TensorBoard events (--tensorboard, Accelerate's trackers in raw form) and the progress line
with the time left. One object, so the loop calls it once a step and once an epoch.

None of it slows a step down: the JSON lines are buffered, SummaryWriter queues events to
its own thread, and the progress line reads the loss once per --log-every seconds.
"""
from __future__ import annotations

import importlib.util
import json
import time
from typing import Any

import torch

from .collectives import raise_if_any_rank_failed
from .errors import UsageError
from .metrics import MetricsLog

INSTALL_TENSORBOARD = "pip install 'ddp_abci[tensorboard]'"


def check_tensorboard_installed() -> None:
    """--tensorboard without the package is a one-line error before any work."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError(f"--tensorboard needs the tensorboard package; install it with {INSTALL_TENSORBOARD}")


class TensorBoardLog:
    """torch.utils.tensorboard's SummaryWriter in DIR. A resumed run writes a new event file
    into the same folder with purge_step = its first step: TensorBoard shows one run, and
    steps a killed run logged after its last checkpoint are hidden, not doubled."""

    def __init__(self, log_dir: str, first_step: int, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (optional extra)

        self.writer = SummaryWriter(log_dir=log_dir, purge_step=first_step if first_step > 1 else None)
        self.writer.add_text("config", "    " + json.dumps(config, indent=1).replace("\n", "\n    "), first_step)

    def step(self, step: int, values: dict[str, float | None]) -> None:
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class Progress:
    """The line every --log-every seconds: epoch and batch, the loss over the steps since the
    last line (all of this rank's, not one step's), samples/s, and the time left, with
    whether the run ends before --stop-after. No carriage returns: job logs are files."""

    def __init__(self, every_s: float, total_steps: int, first_step: int, deadline: float | None) -> None:
        self.every_s, self.total_steps, self.deadline = every_s, total_steps, deadline
        self.last_t, self.last_step, self.last_sum = time.perf_counter(), first_step, 0.0  # the loop's clock
        self.start_t, self.start_step = self.last_t, first_step

    def due(self, now: float) -> bool:
        return now - self.last_t >= self.every_s

    def line(self, now: float, step: int, epoch: str, loss_sum: torch.Tensor, rate: float | None) -> str:
        total = loss_sum.item()
        recent = (total - self.last_sum) / max(step - self.last_step, 1) if step > self.last_step else float("nan")
        self.last_t, self.last_step, self.last_sum = now, step, total
        per_step = (now - self.start_t) / max(step - self.start_step, 1)
        left = (self.total_steps - step) * per_step
        text = f"  {epoch} loss {recent:.4f} (mean of recent steps)"
        if rate:
            text += f", {rate:,.0f} samples/s"
        text += f", {_duration(left)} left"
        if self.deadline is not None:
            before = self.deadline - time.monotonic()
            text += ", ends inside --stop-after" if left < before else f", --stop-after stops it in {_duration(before)}"
        return text

    def epoch_started(self, step: int) -> None:
        """The loop's loss sum starts again at each epoch."""
        self.last_sum, self.last_step = 0.0, step


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class RunTrackers:
    """Rank 0's JSON lines, TensorBoard and progress line; on other ranks, nothing."""

    def __init__(self, config: Any, launch: Any, first_step: int, total_steps: int) -> None:
        self.metrics: MetricsLog | None = None
        self.board: TensorBoardLog | None = None
        error = None
        if launch.is_main:
            try:
                if config.metrics_jsonl:
                    self.metrics = MetricsLog(config.metrics_jsonl)
                if config.tensorboard:
                    self.board = TensorBoardLog(config.tensorboard, first_step + 1, config.to_dict())
            except OSError as e:
                error = f"{e.filename or 'an output'} cannot be opened ({e.strerror or e}); choose a writable path"
        raise_if_any_rank_failed(error)  # every rank stops together, before training
        self.is_main = launch.is_main
        self.first_step = first_step + 1
        self._progress: Progress | None = None
        self.total_steps = total_steps

    def start(self, every_s: float, step: int, deadline: float | None) -> None:
        self._progress = Progress(every_s, self.total_steps, step, deadline) if self.is_main else None

    @property
    def recording(self) -> bool:
        """Whether step() records anything: the loop gathers the step's values only then."""
        return self.metrics is not None or self.board is not None

    def step(self, step: int, epoch: int, samples: int, loss: torch.Tensor, lr: float, grad_norm: float | None,
             scale: float | None) -> None:
        value = loss.item()
        rate = self.metrics.step(step=step, epoch=epoch, samples=samples, loss=value, lr=lr, grad_norm=grad_norm,
                                 scale=scale, start=step == self.first_step) if self.metrics else None
        if self.board is not None:
            self.board.step(step, {"loss": value, "lr": lr, "grad_norm": grad_norm, "samples_per_s": rate,
                                   "scale": scale})

    def progress_due(self, now: float) -> bool:
        return self._progress is not None and self._progress.due(now)

    def progress(self, now: float, step: int, where: str, loss_sum: torch.Tensor, rate: float | None) -> None:
        """The progress line; call it when progress_due(now)."""
        print(self._progress.line(now, step, where, loss_sum, rate), flush=True)

    def epoch_started(self, step: int) -> None:
        if self._progress is not None:
            self._progress.epoch_started(step)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Per-epoch figures (the epoch loss over all ranks, evaluation); flushes the JSON lines."""
        if self.board is not None:
            self.board.step(step, values)
        if self.metrics is not None:
            self.metrics.flush()

    def close(self) -> None:
        for log in (self.metrics, self.board):
            if log is not None:
                log.close()
        self.metrics = self.board = None
