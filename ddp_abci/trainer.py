"""Training loop: the whole DDP life cycle of one run, read top to bottom in Trainer.run.

The Trainer trains any model: pass `model`, `train_set`, `loss_fn(model, batch)` and an
`optimizer` factory, or leave them out for the seed's job (seed_job.SeedJob: its
autoencoder on LinspaceDataset, RMSE, Adam with betas (0, 0.99)).

The collective rule. A collective is a call every rank must make, in the same order, or
the ranks wait for each other for ever. The Trainer's are the methods marked @collective:
each says so, is called on every rank unconditionally, and skips itself by configuration
(no --ckpt-dir, no --summary-json), never by rank. An `if launch.is_main:` around one of
them is the classic DDP deadlock; here it ends the job within --timeout with a line naming
each rank's step and collective (parallel.watchdog), not a hang.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import math
import random
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from . import checkpoint as ckpt
from . import preflight
from . import resume as snap
from .config import TrainConfig, name, turn_on
from .data import CollateFailed, batch_len, build_loader, iterate, to_device
from .errors import Diverged, RankFailed, RunError, SaveFailed, UsageError
from .evaluation import MetricFn, combine, default_metrics, evaluate_shard
from .model import LossFn, OptimizerFactory, compile_model, make_optimizer, seed_optimizer, unwrap, wrap_model
from .parallel.collectives import (
    all_ranks,
    broadcast_buffers,
    broadcast_error,
    check_replicas_agree,
    print_main,
    reduce,
)
from .parallel.launch import Launch
from .parallel.mpi_hook import register_mpi_hook
from .parallel.signals import EXIT_STOPPED, StopRequest, signal_name
from .parallel.stopping import StopAgreement
from .parallel.watchdog import Watchdog, peer_lost, timed_out
from .plan import RunPlan, plan_run
from .precision import autocast, make_scaler
from .schedule import build_schedule
from .seed_job import SeedJob
from .tracking import Clock, RunTrackers, peak_memory_mib, run_summary, write_summary


class StepResult(NamedTuple):
    loss: torch.Tensor         # mean of the micro-batch losses, detached
    skipped: bool              # fp16 overflow: GradScaler skipped optimizer.step
    grad_norm: float | None    # total gradient norm before clipping (with --clip-norm)
    samples: int               # items trained in this step, over all ranks


class EpochTally:
    """What an epoch has trained so far on this rank (its loss sum stays on the device)."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), device=device)
        self.steps = self.samples = self.skipped = 0
        self.norms: list[float] = []
        self.started = time.perf_counter()
        self.last: StepResult | None = None

    def add(self, result: StepResult) -> None:
        self.loss_sum += result.loss
        self.steps, self.samples, self.skipped = self.steps + 1, self.samples + result.samples, \
            self.skipped + result.skipped
        if result.grad_norm is not None:
            self.norms.append(result.grad_norm)
        self.last = result


def collective(what: str) -> Callable:
    """Marks a Trainer method as a collective: the watchdog times it against --timeout."""
    def mark(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: "Trainer", *args: Any, **kwargs: Any) -> Any:
            with self.watchdog.waiting(what):
                return method(self, *args, **kwargs)
        call.collective = what  # type: ignore[attr-defined]
        return call
    return mark


def seed_everything(seed: int) -> None:
    """torch, random and numpy, as accelerate.utils.set_seed does. The Trainer passes
    seed + rank (nanoGPT's seed offset): dropout and augmentations differ between ranks,
    while DDP's broadcast at wrapping makes the starting weights rank 0's on all."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    def __init__(self, config: TrainConfig, launch: Launch, device: torch.device, *,
                 model: torch.nn.Module | None = None, train_set: Dataset | None = None,
                 eval_set: Dataset | None = None, loss_fn: LossFn | None = None,
                 optimizer: OptimizerFactory | type | None = None, metrics: Mapping[str, MetricFn] | None = None,
                 on_eval: Callable[[dict[str, float]], None] | None = None, collate_fn: Callable | None = None,
                 seed_job: SeedJob | None = None, plan: RunPlan | None = None,
                 startup: dict[str, float] | None = None, stop: StopRequest | None = None) -> None:
        self.config, self.launch, self.device = config, launch, device
        self.plan = plan or plan_run(config, launch, device)  # fit() passes the one it checked before the group
        self.precision, self.per_rank_batch, self.comm = self.plan.precision, self.plan.per_rank_batch, self.plan.comm
        self.epoch = 0           # epochs completed, i.e. the epoch in progress (0-based)
        self.batch_in_epoch = 0  # global batches of that epoch already trained
        self.step = 0            # optimizer steps taken (skipped fp16 steps included)
        self.clock, self.stop, self.host = Clock(startup), stop or StopRequest(), socket.gethostname()
        self.job_settings: dict = {}
        if model is None or train_set is None or loss_fn is None:  # what is left out is the seed's
            job = seed_job or SeedJob()
            parts, self.job_settings = job.build(config.seed, config.eval_every), job.to_dict()
            model = parts.model if model is None else model
            eval_set = parts.eval_set if train_set is None and eval_set is None else eval_set
            train_set, loss_fn = train_set if train_set is not None else parts.train_set, loss_fn or parts.loss_fn
        self.train_set, self.eval_set, self.on_eval, self.collate_fn = train_set, eval_set, on_eval, collate_fn
        self.loss_fn = loss_fn
        self.eval_metrics = dict(metrics) if metrics is not None else default_metrics(self.loss_fn)
        self.eval_every = (config.eval_every or 1) if eval_set is not None else 0
        self.model = self.ddp = self.optimizer = self.scheduler = self.loader = self.sampler = self.trackers = None
        self.watchdog = Watchdog(launch, config.timeout_s, record=self._record).start()
        if config.ckpt_dir:
            self.watchdog.checkpoint = f"no checkpoint written yet in {config.ckpt_dir}"
        try:
            self._build(model, optimizer)
        except BaseException:
            # Free DDP now, while the group is open: dropped later with the traceback, its
            # reducer's gloo threads deadlock on the GIL (seen as a rank hung at exit).
            self.close()
            raise

    def _build(self, model: torch.nn.Module, optimizer: OptimizerFactory | type | None) -> None:
        """Everything a run needs, in order: the preflight, then model, DDP, loader,
        optimizer and schedule, then the resume, the logs and the stop agreement."""
        config, launch, device = self.config, self.launch, self.device
        preflight.check_data(self.train_set, self.eval_set, config, launch)
        snapshot, self.resumed_from = self._check_files()
        self._rotate = self.resumed_from is None or self.resumed_from == self.ckpt_file  # never keep a bad last.pt
        seed_everything(config.seed + launch.rank)
        _refuse_wrapped(model)
        if snapshot is not None:
            ckpt.check_model_shape(snapshot, model, self.resumed_from)
            model.load_state_dict(snapshot["model"])  # before DDP: it broadcasts rank 0's weights
        model = model.to(device)
        self._dry_run(model)
        self._check_disk_space(model)
        if config.sync_batchnorm:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.ddp = wrap_model(model, device, launch.world_size, find_unused_parameters=config.find_unused_parameters)
        self.clock.startup["ddp_unix"] = time.time()
        if launch.world_size > 1 and self.comm == "mpi":
            register_mpi_hook(self.ddp, self.watchdog)
        # torch.compile last, over the DDP-wrapped model, as Accelerate's prepare does: Dynamo's
        # DDPOptimizer then breaks the graph at DDP's bucket boundaries and the all-reduce still
        # overlaps backward; compiled first, one fused backward makes every gradient ready at
        # once (torch 2.13, _dynamo/backends/distributed.py, Note [DDPOptimizer]).
        self.model = compile_model(self.ddp, device) if config.compile else self.ddp
        self.pin = device.type == "cuda" if config.pin_memory is None else config.pin_memory
        self.loader = build_loader(self.train_set, launch, config.global_batch, seed=config.seed, split=config.split,
                                   drop_last=config.drop_last, workers=config.workers, pin_memory=self.pin,
                                   persistent_workers=config.persistent_workers, collate_fn=self.collate_fn,
                                   batched=config.batched_fetch)
        self.sampler = self.loader.sampler
        self.batches_per_epoch = len(self.sampler)  # micro-batches; --accum of them make a step
        self.optimizer = make_optimizer(optimizer or seed_optimizer(config.lr, config.betas, config.fused_adam),
                                        self.model, config.lr)
        self.scaler = make_scaler(self.precision, device)
        self.total_steps = config.max_steps or config.epochs * -(-self.batches_per_epoch // config.accum)
        self.scheduler = build_schedule(self.optimizer, config.schedule, config.warmup_steps, self.total_steps)
        if snapshot is not None:
            self._load_snapshot(snapshot)
        fp16 = self.precision == "fp16"  # there GradScaler skips inf/nan steps by design: count them instead
        self.agreement = StopAgreement(self.stop, config.stop_check_every, self.comm, device, launch.world_size,
                                       guard_finite=not fp16, max_fp16_skips=config.max_skipped_steps if fp16 else 0,
                                       stop_after_s=config.stop_after_s, expected_save_s=self._expected_save_s(),
                                       step=self.step)
        self.trackers = self._open_trackers()

    # -- the preflight's collectives -------------------------------------------------

    @collective("preflight: rank 0's verdict on the files")
    def _check_files(self) -> tuple[dict | None, Path | None]:
        """Collective: rank 0 checks the outputs and the checkpoint to resume; all obey."""
        here = None
        if self.launch.is_main:
            with self.watchdog.working("checking the files and the checkpoint"):
                here = preflight.check_files_here(self.config, self.ckpt_file, len(self.train_set))
        return preflight.share_file_check(self.launch, here, self.config, self.ckpt_file)

    @collective("preflight: the dry run's verdict")
    def _dry_run(self, model: torch.nn.Module) -> None:
        """Collective: every rank runs loss_fn once; a failure on any stops all."""
        with self.watchdog.working("the dry run of loss_fn"):
            error = preflight.dry_run(model, self.train_set, self.loss_fn, self.precision, self.device,
                                      self.per_rank_batch, collate_fn=self.collate_fn,
                                      find_unused=self.config.find_unused_parameters, eval_set=self.eval_set,
                                      metrics=self.eval_metrics if self.eval_every else None,
                                      last_batch=self._short_last_batch())
        preflight.share_dry_run(error)

    def _short_last_batch(self) -> int:
        """Items each rank gets in the epoch's last batch when it is shorter than the rest, else 0."""
        if self.config.drop_last:
            return 0
        world = self.launch.world_size
        padded = -(-len(self.train_set) // world) * world  # DistributedSampler pads to a multiple of the world
        return padded % self.config.global_batch // world

    @collective("preflight: the free-space verdict")
    def _check_disk_space(self, model: torch.nn.Module) -> None:
        """Collective: rank 0 checks --ckpt-dir has room for two checkpoints."""
        preflight.share_disk_check(self.launch, self.ckpt_file.parent if self.ckpt_file else None, model)

    @collective("opening the logs")
    def _open_trackers(self) -> RunTrackers:
        """Collective: rank 0 opens the logs; a failure stops every rank."""
        return RunTrackers(self.config, self.launch, self.step, self.total_steps, self.agreement.deadline)

    # -- life cycle: `with Trainer(...) as trainer:` frees what holds the process group ------

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release DDP, its hooks and the optimizer, so that the process group can really be
        freed when it is closed: gloo joins its worker threads only when the last reference
        goes (see parallel/process_group.close_process_group). Safe to call twice."""
        if self.trackers is not None:
            self.trackers.close()
        self.model = self.ddp = self.optimizer = self.scheduler = self.loader = self.sampler = None
        gc.collect()  # DDP's reducer sits in reference cycles
        self.watchdog.stop()

    # -- checkpoints -------------------------------------------------------------------

    @property
    def ckpt_file(self) -> Path | None:
        return ckpt.checkpoint_path(self.config.ckpt_dir) if self.config.ckpt_dir else None

    def _load_snapshot(self, snapshot: dict) -> None:
        changed = snap.load_optimizer_keeping_hyperparameters(self.optimizer, snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])
        self.epoch, self.batch_in_epoch, self.step = snapshot["epoch"], snapshot["batch_in_epoch"], snapshot["step"]
        self.watchdog.step = self.step
        self.watchdog.note_checkpoint(self.step, self.resumed_from)
        snap.load_schedule(self.scheduler, snapshot.get("scheduler"), self.step)
        changed += snap.changed_run_settings(snapshot.get("config", {}), self.config)
        per_rank = snapshot.get("rng_per_rank")
        same_world = snapshot["world_size"] == self.launch.world_size
        ckpt.restore_rng(per_rank[self.launch.rank] if per_rank and same_world else snapshot["rng"])
        note = f"; this run's settings win: {', '.join(changed)}" if changed else ""
        if not same_world:
            note += (f"; world size changed {snapshot['world_size']} -> {self.launch.world_size}, "
                     f"global batch {self.config.global_batch} kept, so each rank now takes {self.per_rank_batch}")
        print_main(self.launch, f"resume: {self.resumed_from} at epoch {self.epoch}, batch {self.batch_in_epoch}, "
                                f"step {self.step}{note}")
        if self.batch_in_epoch >= self.batches_per_epoch:  # an empty epoch would never end: refuse it
            raise UsageError(f"resume position batch {self.batch_in_epoch} lies past the epoch's "
                             f"{self.batches_per_epoch} batches; resume with the dataset and --bs the checkpoint "
                             "was made with")

    @collective("checkpoint save")
    def _save_snapshot(self) -> None:
        """Collective (skipped without --ckpt-dir): rank 0 keeps last.pt as prev.pt and writes
        the new one atomically; the others wait for its verdict, so that a failed write
        stops every rank at this step, together."""
        if self.ckpt_file is None:
            return
        began = time.monotonic()
        rng_per_rank = all_ranks(ckpt.rng_state())  # every rank's generators, for an exact resume
        error = None
        if self.launch.is_main:
            with self.watchdog.working("writing the checkpoint"):
                try:
                    if self._rotate:
                        ckpt.keep_previous(self.ckpt_file)
                    ckpt.save_atomic(snap.make_snapshot(self, rng_per_rank), self.ckpt_file)
                    self._rotate = True
                    self.watchdog.note_checkpoint(self.step, self.ckpt_file)
                except Exception as e:  # disk full, quota, folder gone or read-only: all one line
                    error = ckpt.save_failure(e, self.ckpt_file) + f" (step {self.step})"
        broadcast_error(self.launch, error, SaveFailed)
        if not self.launch.is_main:
            self.watchdog.note_checkpoint(self.step, self.ckpt_file)
        self.agreement.saved(time.monotonic() - began)  # the --stop-after reserve grows with it

    def _expected_save_s(self) -> float:
        """Before the first save, its time at a modest 100 MB/s (a busy shared file system)."""
        return ckpt.estimated_bytes(unwrap(self.model)) / 100e6 if self.ckpt_file else 0.0

    # -- one step ----------------------------------------------------------------------

    def train_step(self, micro_batches: list[Any]) -> StepResult:
        """One optimizer step over the micro-batches (--accum of them; one by default)."""
        self.optimizer.zero_grad(set_to_none=True)
        count, loss_sum, samples = len(micro_batches), None, 0
        for i, batch in enumerate(micro_batches):
            last = i == count - 1
            with self._grad_sync(last):
                with autocast(self.precision, self.device), self.watchdog.working("loss_fn"):
                    loss = self._guarded("loss_fn raised", batch, self.loss_fn, self.model, batch)
                # / count: the accumulated gradient is that of the micro-batch losses' mean
                # (skipped for one: x / 1 is x, and the division is an op and a backward node
                # a step). DDP all-reduces gradient buckets during the last micro-batch's backward.
                with self._backward_phase(last):
                    self._guarded("the backward pass failed", batch,
                                  self.scaler.scale(loss / count if count > 1 else loss).backward)
            loss = loss.detach().float()  # summed in float32 whatever autocast returned (a no-op in fp32)
            loss_sum = loss if loss_sum is None else loss_sum + loss
            samples += batch_len(batch)
        grad_norm = None
        if self.config.clip_norm:
            self.scaler.unscale_(self.optimizer)  # clip true gradients, not scaled ones
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm).item()
        skipped = self._optimizer_step()
        if self.scheduler is not None and not skipped:
            self.scheduler.step()  # a step the scaler skipped did not happen for the schedule either
        return StepResult(loss_sum / count if count > 1 else loss_sum, skipped, grad_norm,
                          samples * self.launch.world_size)

    def _backward_phase(self, last: bool) -> contextlib.AbstractContextManager:
        """What the watchdog sees during backward: through MPI the hook marks its own wait;
        through gloo or NCCL the syncing backward holds the all-reduce, so it is timed."""
        if last and self.launch.world_size > 1 and self.comm != "mpi":
            return self.watchdog.waiting("backward with the gradient all-reduce")
        return self.watchdog.working("backward")

    def _guarded(self, what: str, batch: Any, call: Callable, *args: Any) -> Any:
        """This rank's own failure as one line naming rank, host and the fix (fit() then ends
        every rank at once): the preflight's dry run passed, so this batch is what differs."""
        try:
            return call(*args)
        except Exception as e:
            if timed_out(e) or peer_lost(e):
                raise  # a collective's timeout, another rank's end: not this batch's fault
            text = " ".join(str(e).split()) or type(e).__name__
            raise RankFailed(f"{self._here()}: {what} {type(e).__name__}: {text} at step {self.step + 1}; "
                             f"{self._advice(text, batch_len(batch))}") from None

    def _advice(self, text: str, items: int) -> str:
        if "Expected to have finished reduction" in text or "find_unused_parameters" in text:
            return preflight.UNUSED_ADVICE
        if "Expected more than 1 value per channel" in text:
            return (f"the batch held {items} item(s) on this rank (an epoch's short last batch?): set "
                    f"{turn_on('drop_last')} to drop it")
        again = ", then rerun with resume=True (--resume)" if self.ckpt_file else ""
        return f"fix loss_fn or the model for this batch{again}"

    def _here(self) -> str:
        return f"rank {self.launch.rank} (host {self.host})"

    def _grad_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """DDP's no_sync() around all but the last micro-batch's forward and backward: it
        toggles require_backward_grad_sync, which DDP reads in forward, so the gradients
        only accumulate locally and K micro-batches cost one all-reduce."""
        if last or not isinstance(self.ddp, torch.nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def _optimizer_step(self) -> bool:
        """optimizer.step through the GradScaler; True when fp16 overflow skipped it."""
        if not self.scaler.is_enabled():
            self.optimizer.step()
            return False
        # GradScaler skips optimizer.step on inf/NaN gradients and then lowers the scale,
        # so a lower scale means a skipped step (Accelerate 1.16 patches optimizer.step to tell).
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < before

    # -- the loop ----------------------------------------------------------------------

    def run(self) -> int:
        """Train until --epochs or --max-steps, or until a stop signal; returns the exit status
        and, with --ckpt-dir, records it in DIR/status (rank 0; a rank's own failure: that rank)."""
        try:
            status, line = self._train()
        except RunError as e:
            if self.launch.is_main or not e.same_on_every_rank:  # said once: by rank 0, or by the failing rank
                self._record(e.exit_status, f"error: {e}")
            raise
        self._record(status, line)
        return status

    def _record(self, status: int, line: str) -> None:
        if self.config.ckpt_dir:
            ckpt.write_status(self.config.ckpt_dir, status, finished=status == 0 and self._finished(), step=self.step,
                              line=line, rank=self.launch.rank, host=self.host)

    def _train(self) -> tuple[int, str]:
        """The loop. Every return of _run_epoch is a save point (an epoch's end, an agreed
        stop, the run's last step): the checkpoint is written there, and only there."""
        cfg = self.config
        accum = f", {cfg.accum} micro-batches a step" if cfg.accum > 1 else ""
        print_main(self.launch, f"training: {cfg.epochs} epochs of {self.batches_per_epoch} batches{accum}, global "
                                f"batch {cfg.global_batch} ({self.per_rank_batch} per rank), precision "
                                f"{self.precision}, checkpoints {self.ckpt_file or 'off'}")
        if self.agreement.deadline is not None:
            print_main(self.launch, self.agreement.deadline_line())
        stopped_by, last_loss, steps_before = 0, math.nan, self.step
        with self.watchdog.working("training"):
            while not self._finished() and not stopped_by:
                last_loss, stopped_by = self._run_epoch()
                epoch_done = self._epoch_done()
                if epoch_done:
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                self._sync_buffers()
                self._save_snapshot()
                if self.eval_every and (self.epoch % self.eval_every == 0 if epoch_done else self._finished()):
                    self._evaluate()  # a run that ends on --max-steps mid-epoch is evaluated at its end
        self.trackers.close()
        self._check_replicas()
        self._write_summary(last_loss, stopped_by)
        self._save_model()
        return self._report_end(stopped_by, last_loss, steps_before)

    def _epoch_done(self) -> bool:
        return self.batch_in_epoch == self.batches_per_epoch

    def _finished(self) -> bool:
        max_steps = self.config.max_steps
        return self.epoch >= self.config.epochs or (bool(max_steps) and self.step >= max_steps)

    def _at_save_point(self) -> bool:
        """The one rule for both the stop agreement and the saves: an epoch's last batch, or
        the run's last step. The ranks always agree there, so a diverged state is never saved."""
        return self._epoch_done() or self._finished()

    def _micro_batch_groups(self) -> Iterator[list[Any]]:
        """The rest of the epoch's micro-batches in groups of --accum (a shorter last group)."""
        batches = iterate(self.loader, direct=self.config.direct_loader)
        while True:
            try:
                group = list(itertools.islice(batches, self.config.accum))
            except CollateFailed as e:
                raise RankFailed(f"{self._here()}: {e}") from None
            except Exception as e:  # the dataset's __getitem__, a worker
                raise RankFailed(f"{self._here()}: reading a batch of step {self.step + 1} failed "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:300]}); fix the dataset") from None
            if not group:
                return
            yield [to_device(b, self.device, non_blocking=self.pin) for b in group]

    def _run_epoch(self) -> tuple[float, int]:
        """Train the rest of the current epoch, up to a save point or an agreed stop;
        returns (the epoch's mean loss over all ranks, the stop signal or 0)."""
        self.sampler.start_epoch(self.epoch, skip_batches=self.batch_in_epoch)
        self.tally, stopped_by = EpochTally(self.device), 0
        self.trackers.epoch_started(self.step)
        for group in self._micro_batch_groups():
            result = self.train_step(group)
            self.tally.add(result)
            self.batch_in_epoch, self.step = self.batch_in_epoch + len(group), self.step + 1
            self.watchdog.step = self.step
            now = time.perf_counter()
            self.clock.step_done(now, result.samples)
            if self.trackers.recording:  # only then: under fp16 get_scale() is a host sync
                self.trackers.step(self.step, self.epoch, result.samples, result.loss,
                                   self.optimizer.param_groups[0]["lr"], result.grad_norm,
                                   self.scaler.get_scale() if self.scaler.is_enabled() else None)
            if self.trackers.progress_due(now):
                self.trackers.progress(now, self.step, f"epoch {self.epoch + 1}/{self.config.epochs} "
                                       f"[{self.batch_in_epoch}/{self.batches_per_epoch}]", self.tally.loss_sum,
                                       self.clock.samples_per_s())
            self.agreement.watch(result.grad_norm, result.skipped)
            if self.agreement.due(self.step) or self._at_save_point():
                stopped_by = self._agree()
            if stopped_by or self._at_save_point():
                break
        mean = self._epoch_report()
        self.trackers.scalars(self.step, {"epoch_loss": mean})
        return mean, stopped_by

    # -- the loop's collectives ----------------------------------------------------------

    @collective("stop agreement")
    def _agree(self) -> int:
        """Collective: the stop signal, deadline and divergence that every rank agrees on."""
        since = self.agreement.checked_step
        verdict = self.agreement.agree(self.step, self.tally.loss_sum)
        if verdict.diverged:
            kept = (f"{self.ckpt_file} from before it was kept, the diverged state was not saved" if self.ckpt_file
                    else "nothing was saved (no --ckpt-dir)")
            last = self.tally.last.loss.item() if self.tally.last is not None else math.nan
            raise Diverged(f"{self.agreement.describe(verdict.diverged, since, self.step, last)}; {kept}; "
                           f"try a lower {name('lr')} (this run: {self.config.lr:g}) or {name('clip_norm')}, "
                           "then resume")
        return verdict.signal

    @collective("epoch loss reduce")
    def _epoch_report(self) -> float:
        """Collective: the epoch's loss averaged over every rank's steps (not rank 0's own), logged."""
        tally = self.tally
        totals = reduce(torch.stack([tally.loss_sum.float(), torch.tensor(float(tally.steps), device=self.device)]),
                        "sum")
        mean = (totals[0] / totals[1].clamp(min=1)).item()
        elapsed = time.perf_counter() - tally.started
        extra = f", {tally.skipped} steps skipped by fp16 overflow" if tally.skipped else ""
        if tally.norms:
            extra += (f", grad norm before clipping mean {sum(tally.norms) / len(tally.norms):.3g} "
                      f"max {max(tally.norms):.3g}")
        part = "" if self._epoch_done() else f" [{self.batch_in_epoch}/{self.batches_per_epoch} batches]"
        print_main(self.launch, f"epoch {self.epoch + 1}/{self.config.epochs}{part}: loss {mean:.4f}, "
                                f"{tally.samples / max(elapsed, 1e-9):,.0f} samples/s, {elapsed:.2f}s{extra}")
        return mean

    @collective("buffer broadcast")
    def _sync_buffers(self) -> None:
        """Collective (nothing to do for a model without buffers): rank 0's BatchNorm
        statistics on every rank before each save and evaluation (with sync_batchnorm they
        agree already)."""
        broadcast_buffers(self.model)

    @collective("evaluation")
    def _evaluate(self) -> None:
        """Collective (skipped without an eval set): each rank evaluates its share, then the
        exact figures over every held-out item are combined."""
        with self.watchdog.working("evaluating its share"):
            shard = evaluate_shard(unwrap(self.model), self.eval_set, self.loss_fn, self.launch, self.device,
                                   self.precision, self.per_rank_batch, self.eval_metrics, self.collate_fn)
        results, count = combine(shard, self.device)
        figures = ", ".join(f"{metric} {value:.4f}" for metric, value in results.items())
        print_main(self.launch, f"eval after epoch {self.epoch} (step {self.step}): {figures} "
                                f"over {count} held-out items")
        self.trackers.scalars(self.step, {f"eval/{metric}": value for metric, value in results.items()})
        if self.on_eval is not None and self.launch.is_main:
            self.on_eval(dict(results, epoch=self.epoch, step=self.step))

    @collective("replica check")
    def _check_replicas(self) -> None:
        """Collective: proves every rank ends with the same weights and buffers."""
        check_replicas_agree(self.model, self.launch)

    @collective("summary gather")
    def _write_summary(self, last_loss: float, stopped_by: int) -> None:
        """Collective (skipped without --summary-json): every rank's peak memory, written by rank 0."""
        if not self.config.summary_json:
            return
        peak, kind = peak_memory_mib(self.device)
        peaks = all_ranks(peak)
        if self.launch.is_main:
            write_summary(self.config.summary_json, run_summary(
                self.launch.world_size, self.config.global_batch, self.precision, self.step, last_loss, self.clock,
                peaks, kind, signal_name(stopped_by) if stopped_by else None, self.device))

    @collective("model save")
    def _save_model(self) -> None:
        """Collective (skipped without --save-model, or with work left): the trained weights
        alone (unwrapped state_dict), as accelerator.save does; rank 0 writes, all share its verdict."""
        if not self.config.save_model or not self._finished():
            return
        error = None
        if self.launch.is_main:
            with self.watchdog.working("writing the model"):
                try:
                    ckpt.save_atomic(unwrap(self.model).state_dict(), self.config.save_model)
                except Exception as e:  # the run's checkpoint is already saved: say so, exit 74
                    error = ckpt.save_failure(e, Path(self.config.save_model))
        broadcast_error(self.launch, error, SaveFailed)

    def _report_end(self, stopped_by: int, last_loss: float, steps_before: int) -> tuple[int, str]:
        """The exit status and the last line. 75 only when work is left: a stop agreed on the
        very last step completed the run."""
        if stopped_by and not self._finished():
            status, line = EXIT_STOPPED, (f"stopped on {signal_name(stopped_by)} at epoch {self.epoch + 1} batch "
                                          f"{self.batch_in_epoch} (step {self.step}); checkpoint "
                                          f"{self.ckpt_file or 'off (no --ckpt-dir)'}; resume with --resume; "
                                          f"exit {EXIT_STOPPED}")
        elif self.step == steps_before:
            status, line = 0, f"nothing to train: already at epoch {self.epoch}, step {self.step}"
        else:
            late = f" ({signal_name(stopped_by)} arrived at the last step: the run is complete)" if stopped_by else ""
            status, line = 0, f"done: {self.step} steps, last epoch loss {last_loss:.4f}{late}"
        print_main(self.launch, line)
        return status, line


def _refuse_wrapped(model: torch.nn.Module) -> None:
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        raise UsageError(f"the model is already wrapped in {type(model).__name__}; pass the bare model "
                         "(model.module): the trainer wraps it in DDP itself")
