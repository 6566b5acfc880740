"""Watching a run: what rank 0 records while it trains (the per-step JSON-lines log of
--metrics-jsonl with each evaluation's figures, the trackers of --track (trackers.py), the
progress line with the time left and CKPT_DIR/progress.json for the status command), the
throughput clock, and the run's summary JSON. RunTrackers is one object, so the loop calls it
once a step, once an epoch and once an evaluation.

None of it slows a step down: the JSON lines are buffered, SummaryWriter queues events to
its own thread, and the progress line reads the loss once per --log-every seconds.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from . import run_folder
from .atomic_text import replace_text
from .cluster.schedulers import job_id
from .errors import one_line
from .parallel.collectives import raise_if_any_rank_failed
from .throughput import Throughput
from .trackers import Trackers


class MetricsLog:
    """Appends a line a step and one an evaluation (RunTrackers gives their figures); buffered,
    flushed at every epoch's end and on close, so that a step costs no system call.

    A write that fails (disk full, quota, folder gone) is reported once and ends this log,
    not the training: the metrics are a by-product, the checkpoint is what must not be lost."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.file = open(path, "a", buffering=1 << 16)

    def step(self, figures: dict[str, Any]) -> None:
        """One optimizer step's line: {step, epoch, loss, lr, grad_norm, samples_per_s, scale},
        with tokens_per_s and mfu where the run counts tokens. samples_per_s is null on a run's
        first step (nothing before it to time from), and the plot marks such a line after step 1
        as a resume."""
        self._guard(self.file and self.file.write, json.dumps(figures) + "\n")

    def evaluation(self, step: int, epoch: int, figures: dict[str, float]) -> None:
        """One evaluation's line, {"step", "epoch", "eval": {metric: value}, "unix"}, flushed;
        `epoch` is the epochs completed when it ran (a step's line holds its epoch's index)."""
        self._guard(self.file and self.file.write, json.dumps({"step": step, "epoch": epoch, "eval": figures,
                                                               "unix": time.time()}) + "\n")
        self.flush()

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
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_rss"


def run_summary(world_size: int, global_batch: int, precision: str, steps: int, final_loss: float, clock: Clock,
                peaks: list[float], memory_kind: str, stopped_by: str | None, device: Any, **more: Any) -> dict:
    """The summary's keys (the benchmark reads them); `more` adds the trainer's own
    (checkpoints_saved, checkpoint_stall_s, stragglers, gradients: the path chosen,
    gradients_measured_ms: the all-reduce's milliseconds through MPI and gloo that --comm auto
    chose it on, or None)."""
    return {**more,
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


class Progress:
    """The line every --log-every seconds: epoch and batch, the loss over the steps since the
    last line (all of this rank's, not one step's), samples/s, and the time left, with
    whether the run ends before --stop-after. No carriage returns: job logs are files."""

    def __init__(self, every_s: float, total_steps: int | None, first_step: int, deadline: float | None) -> None:
        self.every_s, self.total_steps, self.deadline = every_s, total_steps, deadline
        self.last_t, self.last_step, self.last_sum = time.perf_counter(), first_step, 0.0  # the loop's clock
        self.start_t, self.start_step = self.last_t, first_step
        self.recent: float | None = None

    def due(self, now: float) -> bool:
        return now - self.last_t >= self.every_s

    def line(self, now: float, step: int, epoch: str, loss_sum: torch.Tensor, rate: float | None) -> str:
        total = loss_sum.item()
        recent = (total - self.last_sum) / max(step - self.last_step, 1) if step > self.last_step else float("nan")
        self.recent = recent if recent == recent else None  # the status command's last training loss
        self.last_t, self.last_step, self.last_sum = now, step, total
        per_step = (now - self.start_t) / max(step - self.start_step, 1)
        text = f"  {epoch} loss {recent:.4f} (mean of recent steps)"
        if rate:
            text += f", {rate:,.0f} samples/s"
        if self.total_steps is None:  # a stream without a length, and no --max-steps: only a deadline to count to
            before = self.deadline - time.monotonic() if self.deadline is not None else None
            return text + (f", the deadline stops it in {_duration(before)}" if before is not None else "")
        left = (self.total_steps - step) * per_step
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


class ProgressFile:
    """CKPT_DIR/progress.json: where the running job stands (step, speed, the run's length, the
    scheduler's job id; the step this process resumed from, when it started and took its first
    step, which the in-job restarts measure their cost by; the last training loss, the last
    evaluation and the best so far, kept across a chain's jobs), rewritten whole at the first
    step, each progress line, each epoch end and each evaluation, for `python -m ddp_abci.status`
    and the job scripts. A write that fails is said once and ends this file, not the training."""

    def __init__(self, ckpt_dir: str, total_steps: int | None, config: Any, world_size: int, first_step: int,
                 clock: Clock) -> None:
        self.path, self.total_steps, self.world_size = run_folder.path(ckpt_dir, run_folder.PROGRESS), total_steps, \
            world_size
        self.items_per_step, self.global_batch = config.global_batch * config.accum, config.global_batch
        self.job, self.resumed_from, self.clock = job_id(os.environ), first_step, clock
        self.figures: dict[str, Any] = {"loss": None, "tokens_per_s": None, "mfu": None, "eval": None,
                                        "best_eval": self._best_before(first_step)}

    def _best_before(self, first_step: int) -> dict | None:
        """The best evaluation of the jobs before this one, at or before its resume step."""
        try:
            best = json.loads(self.path.read_text()).get("best_eval") if first_step else None
        except (OSError, ValueError):
            return None
        return best if isinstance(best, dict) and best.get("step", first_step + 1) <= first_step else None

    def note(self, **figures: Any) -> None:
        """The latest loss, tokens/s or MFU, written with the next write."""
        self.figures.update(figures)

    def evaluated(self, step: int, epoch: int, results: dict[str, float]) -> None:
        """An evaluation: the last, and the best so far by its loss (its first figure without one)."""
        entry = {"step": step, "epoch": epoch, "values": results, "unix": time.time()}
        key = "loss" if "loss" in results else next(iter(results), None)
        best = self.figures["best_eval"]
        if key is not None and (best is None or best.get("key") != key or results[key] < best["values"][key]):
            self.figures["best_eval"] = dict(entry, key=key)
        self.figures["eval"] = entry
        self.write(step, epoch, self.figures.get("samples_per_s"))

    def write(self, step: int, epoch: int, samples_per_s: float | None) -> None:
        if self.path is None:
            return
        self.figures["samples_per_s"] = samples_per_s
        state = {"step": step, "epoch": epoch, "total_steps": self.total_steps, "samples_per_s": samples_per_s,
                 "steps_per_s": samples_per_s / self.items_per_step if samples_per_s else None,
                 "world_size": self.world_size, "global_batch": self.global_batch, "job": self.job,
                 "resumed_from": self.resumed_from, "started_unix": self.clock.startup.get("process_unix"),
                 "first_step_unix": self.clock.first_step_unix, "unix": time.time(), **self.figures}
        try:
            replace_text(self.path, json.dumps(state))
        except OSError as e:
            print(f"warning: {self.path}: {e.strerror or e}; the progress file stops here, training goes on",
                  file=sys.stderr, flush=True)
            self.path = None


class RunTrackers:
    """Rank 0's JSON lines, trackers, progress line and progress file; on other ranks, nothing."""

    def __init__(self, config: Any, launch: Any, first_step: int, total_steps: int | None,
                 deadline: float | None, clock: Clock, throughput: Throughput | None = None,
                 settings: dict | None = None) -> None:
        """Collective: rank 0 opens the logs and trackers, and a failure there stops every rank,
        before training. `throughput`: what samples/s mean in tokens and MFU (throughput.py);
        `settings`: what the trackers record as the run's config."""
        self.metrics: MetricsLog | None = None
        self.trackers: Trackers | None = None
        self.throughput, self.tokens_per_item = throughput, None  # counted tokens an item, where counted
        error = None
        if launch.is_main:
            try:
                if config.metrics_jsonl:
                    self.metrics = MetricsLog(config.metrics_jsonl)
                if config.trackers or config.tensorboard:
                    self.trackers = Trackers(config, first_step + 1, settings or config.to_dict())
            except OSError as e:
                error = f"{e.filename or 'an output'} cannot be opened ({e.strerror or e}); choose a writable path"
            except Exception as e:  # noqa: BLE001  (a tracker's own start: W&B's, MLflow's)
                error = f"a tracker could not start ({one_line(e)}); fix it or leave it out of --track"
        raise_if_any_rank_failed(error)
        self.first_step, self.last = first_step + 1, time.perf_counter()
        self._progress = Progress(config.log_every_s, total_steps, first_step, deadline) if launch.is_main else None
        self._file = ProgressFile(config.ckpt_dir, total_steps, config, launch.world_size, first_step, clock) \
            if launch.is_main and config.ckpt_dir else None

    @property
    def recording(self) -> bool:
        """Whether step() records anything: the loop gathers the step's values only then."""
        return self.metrics is not None or self.trackers is not None

    def tokens(self, samples_per_s: float | None) -> dict[str, float | None]:
        """{tokens_per_s, mfu} at `samples_per_s` ({} where the run counts no tokens)."""
        if self.throughput is None:
            return {}
        tokens_per_s = self.throughput.tokens_per_s(samples_per_s, self.tokens_per_item)
        return {"tokens_per_s": tokens_per_s, "mfu": self.throughput.mfu(tokens_per_s)}

    def step(self, step: int, epoch: int, samples: int, loss: torch.Tensor, lr: float, grad_norm: float | None,
             scale: float | None) -> None:
        """One optimizer step that trained `samples` items over all ranks."""
        now = time.perf_counter()
        rate = samples / (now - self.last) if now > self.last and step != self.first_step else None
        self.last = now
        figures = {"step": step, "epoch": epoch, "loss": loss.item(), "lr": lr, "grad_norm": grad_norm,
                   "samples_per_s": rate, "scale": scale, **self.tokens(rate)}
        if self.metrics is not None:
            self.metrics.step(figures)
        if self.trackers is not None:
            self.trackers.log(step, {k: v for k, v in figures.items() if k not in ("step", "epoch")})

    def after_step(self, now: float, step: int, epoch: int, result: Any, optimizer: Any, scaler: Any, clock: Clock,
                   tally: Any, where: Callable[[], str]) -> None:
        """Everything a step that ended at `now` (time.perf_counter()) feeds: the throughput
        clock, the logs, the progress line (`where` the run is, formed only when the line is due)."""
        clock.step_done(now, result.samples)
        if result.tokens:
            self.tokens_per_item = result.tokens / result.samples
        if self.recording:  # only then: under fp16 get_scale() is a host sync
            self.step(step, epoch, result.samples, result.loss, optimizer.param_groups[0]["lr"], result.grad_norm,
                      scaler.get_scale() if scaler.is_enabled() else None)
        if self.progress_due(now):
            self.progress(now, step, where(), tally.loss_sum, clock.samples_per_s())
            if self._file is not None:
                self._file.note(loss=self._progress.recent, **self.tokens(clock.samples_per_s()))
                self._file.write(step, epoch, clock.samples_per_s())
        elif step == self.first_step and self._file is not None:  # the first step: the start-up's cost, said
            self._file.write(step, epoch, None)

    def progress_due(self, now: float) -> bool:
        return self._progress is not None and self._progress.due(now)

    def progress(self, now: float, step: int, where: str, loss_sum: torch.Tensor, rate: float | None) -> None:
        """The progress line (with tokens/s and MFU where counted); call it when progress_due(now)."""
        line = self._progress.line(now, step, where, loss_sum, rate)
        if self.throughput is not None:
            line += self.throughput.words(self.tokens(rate)["tokens_per_s"])
        print(line, flush=True)

    def epoch_started(self, step: int) -> None:
        if self._progress is not None:
            self._progress.epoch_started(step)

    def epoch_ended(self, step: int, epoch: int, samples_per_s: float | None, loss: float | None = None) -> None:
        """At an epoch's end (or where a stop cut it): the progress file, for the status command."""
        if self._file is not None:
            self._file.note(loss=loss, **self.tokens(samples_per_s))
            self._file.write(step, epoch, samples_per_s)

    def evaluated(self, step: int, epoch: int, results: dict[str, float]) -> None:
        """An evaluation's figures: the metrics log, the trackers (eval/NAME) and progress.json."""
        if self.metrics is not None:
            self.metrics.evaluation(step, epoch, results)
        if self.trackers is not None:
            self.trackers.log(step, {f"eval/{metric}": value for metric, value in results.items()})
        if self._file is not None:
            self._file.evaluated(step, epoch, results)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Per-epoch figures (the epoch loss over all ranks, the stragglers'); flushes the JSON lines."""
        if self.trackers is not None:
            self.trackers.log(step, values)
        if self.metrics is not None:
            self.metrics.flush()

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        if self.trackers is not None:
            self.trackers.close()
        self.metrics = self.trackers = None


def training_line(config: Any, epoch_batches: int | None, per_rank_batch: int, precision: str,
                  checkpoint: Any) -> str:
    """The line before the first step: what the run will train, and where it saves."""
    accum = f", {config.accum} micro-batches a step" if config.accum > 1 else ""
    size = f"{epoch_batches} batches" if epoch_batches is not None else "a stream of batches"
    return (f"training: {config.epochs} epochs of {size}{accum}, global batch {config.global_batch} "
            f"({per_rank_batch} per rank), precision {precision}, checkpoints {checkpoint or 'off'}")


def epoch_line(which: str, mean: float, tally: Any, dropped: int, short: int = 0) -> str:
    """The line at an epoch's end (or where a stop cut it): the loss over every rank's steps; a
    stream's items read ahead past the shortest share's end (`dropped`) and in its readers'
    short last batches (`short`), never trained this epoch."""
    elapsed = time.perf_counter() - tally.started
    if not tally.steps:
        return f"epoch {which}: no step trained ({elapsed:.2f}s)"
    extra = f", {tally.skipped} steps skipped by fp16 overflow" if tally.skipped else ""
    if tally.norms:
        mean_norm = sum(tally.norms) / len(tally.norms)
        extra += f", grad norm before clipping mean {mean_norm:.3g} max {max(tally.norms):.3g}"
    if dropped:
        extra += f", {dropped} items of the longer shares dropped (the shortest share ended it)"
    if short:
        extra += f", {short} items of the readers' short last batches dropped"
    return (f"epoch {which}: loss {mean:.4f}, {tally.samples / max(elapsed, 1e-9):,.0f} samples/s, {elapsed:.2f}s"
            f"{extra}")
