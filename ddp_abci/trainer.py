"""Training loop: the whole DDP life cycle of one run, read top to bottom in Trainer.run.

The Trainer trains any model: pass `model`, `train_set`, `loss_fn(model, batch)` and an
`optimizer` factory, or leave them out for the seed's job (its autoencoder on
LinspaceDataset, RMSE, Adam with betas (0, 0.99)).
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from . import checkpoint as ckpt
from . import preflight
from . import snapshot as snap
from .collectives import all_ranks, broadcast_error, check_replicas_agree, print_main, reduce
from .comm_hook import register_mpi_hook
from .config import TrainConfig
from .data import batch_len, build_loader, iterate, seed_datasets, to_device
from .errors import Diverged, SaveFailed, UsageError
from .evaluation import MetricFn, default_metrics, evaluate
from .launch import Launch
from .metrics import Clock, peak_memory_mib, run_summary, write_summary
from .model import (
    AutoencoderLoss,
    LossFn,
    OptimizerFactory,
    build_model,
    compile_model,
    seed_optimizer,
    unwrap,
    wrap_model,
)
from .plan import RunPlan, plan_run
from .precision import autocast, make_scaler
from .schedule import build_schedule
from .signals import EXIT_STOPPED, StopRequest, signal_name
from .stopping import StopAgreement
from .tracking import RunTrackers


class StepResult(NamedTuple):
    loss: torch.Tensor         # mean of the micro-batch losses, detached
    skipped: bool              # fp16 overflow: GradScaler skipped optimizer.step
    grad_norm: float | None    # total gradient norm before clipping (with --clip-norm)
    samples: int               # items trained in this step, over all ranks


class LossFnFailed(UsageError):
    """loss_fn raised during training: this rank's own failure, printed by this rank."""

    same_on_every_rank = False


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
                 optimizer: OptimizerFactory | None = None, metrics: Mapping[str, MetricFn] | None = None,
                 on_eval: Callable[[dict[str, float]], None] | None = None, plan: RunPlan | None = None,
                 startup: dict[str, float] | None = None) -> None:
        self.config, self.launch, self.device = config, launch, device
        self.plan = plan or plan_run(config, launch, device)  # fit() passes the one it checked before the group
        self.precision, self.per_rank_batch, self.comm = self.plan.precision, self.plan.per_rank_batch, self.plan.comm
        self.epoch = 0           # epochs completed, i.e. the epoch in progress (0-based)
        self.batch_in_epoch = 0  # global batches of that epoch already trained
        self.step = 0            # optimizer steps taken (skipped fp16 steps included)
        self.clock = Clock(startup)
        if train_set is None:
            train_set, default_eval = seed_datasets(config.dim_in, config.num_items, config.eval_items)
            eval_set = default_eval if eval_set is None else eval_set
        self.train_set, self.eval_set, self.on_eval = train_set, eval_set, on_eval
        self.loss_fn = loss_fn or AutoencoderLoss(config.loss)
        self.eval_metrics = dict(metrics) if metrics is not None else default_metrics(self.loss_fn)
        self.eval_every = (config.eval_every or 1) if eval_set is not None else 0

        self.model = self.optimizer = self.scheduler = self.loader = self.sampler = self.trackers = None
        try:
            self._build(model, optimizer)
        except BaseException:
            # Free DDP now, while the group is open: dropped later with the traceback, its
            # reducer's gloo threads deadlock on the GIL (seen as a rank hung at exit).
            self.close()
            raise

    def _build(self, model: torch.nn.Module | None, optimizer: OptimizerFactory | None) -> None:
        """The preflight, then model, DDP, loader, optimizer and schedule, then the resume."""
        config, launch, device = self.config, self.launch, self.device
        preflight.check_data(self.train_set, self.eval_set, config, launch)
        snapshot, self.resumed_from = preflight.check_files(config, launch, self.ckpt_file, len(self.train_set))
        self._rotate = self.resumed_from is None or self.resumed_from == self.ckpt_file  # never keep a bad last.pt
        seed_everything(config.seed + launch.rank)
        model = build_model(config.seed, config.dim_in, config.dim_hidden) if model is None else model
        if snapshot is not None:
            ckpt.check_model_shape(snapshot, model, self.resumed_from)
            model.load_state_dict(snapshot["model"])  # before DDP: it broadcasts rank 0's weights
        preflight.dry_run(model.to(device), self.train_set, self.loss_fn, self.precision, device, self.per_rank_batch)
        preflight.check_disk_space(launch, self.ckpt_file.parent if self.ckpt_file else None, model)
        if config.compile:
            model = compile_model(model, device)  # before DDP, so DDP sees the compiled graph
        self.model = wrap_model(model, device, launch.world_size)
        self.clock.startup["ddp_unix"] = time.time()
        if launch.world_size > 1 and self.comm == "mpi":
            register_mpi_hook(self.model)

        self.pin = device.type == "cuda" if config.pin_memory is None else config.pin_memory
        self.loader = build_loader(self.train_set, launch, config.global_batch, seed=config.seed, split=config.split,
                                   workers=config.workers, pin_memory=self.pin,
                                   persistent_workers=config.persistent_workers)
        self.sampler = self.loader.sampler
        self.batches_per_epoch = len(self.sampler)  # micro-batches; --accum of them make a step
        factory = optimizer or seed_optimizer(config.lr, config.betas, config.fused_adam)
        self.optimizer = factory(self.model.parameters())
        self.scaler = make_scaler(self.precision, device)
        steps_per_epoch = -(-self.batches_per_epoch // config.accum)
        self.total_steps = config.max_steps or config.epochs * steps_per_epoch
        self.scheduler = build_schedule(self.optimizer, config.schedule, config.warmup_steps, self.total_steps)
        if snapshot is not None:
            self._load_snapshot(snapshot)
        self.trackers = RunTrackers(config, launch, self.step, self.total_steps)

    # -- life cycle: `with Trainer(...) as trainer:` frees what holds the process group ------

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release DDP, its hooks and the optimizer, so that the process group can really be
        freed when it is closed: gloo joins its worker threads only when the last reference
        goes (see process_group.close_process_group). Safe to call twice."""
        if self.trackers is not None:
            self.trackers.close()
        self.model = self.optimizer = self.scheduler = self.loader = self.sampler = None
        gc.collect()  # DDP's reducer sits in reference cycles

    # -- checkpoints -------------------------------------------------------------------

    @property
    def ckpt_file(self) -> Path | None:
        return ckpt.checkpoint_path(self.config.ckpt_dir) if self.config.ckpt_dir else None

    def _load_snapshot(self, snapshot: dict) -> None:
        changed = snap.load_optimizer_keeping_hyperparameters(self.optimizer, snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])
        self.epoch, self.batch_in_epoch, self.step = snapshot["epoch"], snapshot["batch_in_epoch"], snapshot["step"]
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

    def _save_snapshot(self) -> None:
        """Rank 0 keeps last.pt as prev.pt and writes the new one atomically; the others wait
        for its verdict, so that a failed write stops every rank at this step, together."""
        if self.ckpt_file is None:
            return
        began = time.monotonic()
        rng_per_rank = all_ranks(ckpt.rng_state())  # every rank's generators, for an exact resume
        error = None
        if self.launch.is_main:
            try:
                if self._rotate:
                    ckpt.keep_previous(self.ckpt_file)
                ckpt.save_atomic(snap.make_snapshot(self, rng_per_rank), self.ckpt_file)
                self._rotate = True
            except Exception as e:  # disk full, quota, folder gone or read-only: all one line
                error = ckpt.save_failure(e, self.ckpt_file) + f" (step {self.step})"
        broadcast_error(self.launch, error, SaveFailed)
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
            with self._grad_sync(last=i == count - 1):
                with autocast(self.precision, self.device):
                    loss = self._loss(batch)
                # / count: the accumulated gradient is that of the micro-batch losses' mean
                # (skipped for one: x / 1 is x, and the division is an op and a backward node
                # a step). DDP all-reduces gradient buckets during the last micro-batch's backward.
                self.scaler.scale(loss / count if count > 1 else loss).backward()
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

    def _loss(self, batch: Any) -> torch.Tensor:
        try:
            return self.loss_fn(self.model, batch)
        except Exception as e:  # the preflight's dry run passed: this batch is what differs
            raise LossFnFailed(f"loss_fn raised {type(e).__name__}: {str(e).strip()[:200]} at step {self.step + 1} "
                               f"on rank {self.launch.rank}; fix the loss function for this batch, then resume "
                               "with --resume") from None

    def _grad_sync(self, last: bool) -> contextlib.AbstractContextManager:
        """DDP's no_sync() around all but the last micro-batch's forward and backward: it
        toggles require_backward_grad_sync, which DDP reads in forward, so the gradients
        only accumulate locally and K micro-batches cost one all-reduce."""
        if last or not isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext()
        return self.model.no_sync()

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

    def run(self, stop: StopRequest | None = None) -> int:
        """Train until --epochs or --max-steps, or until a stop signal; returns the exit status.

        Pass an entered StopRequest to act on SIGTERM/SIGUSR1 (the command line does)."""
        cfg, launch = self.config, self.launch
        accum = f", {cfg.accum} micro-batches a step" if cfg.accum > 1 else ""
        print_main(launch, f"training: {cfg.epochs} epochs of {self.batches_per_epoch} batches{accum}, global batch "
                           f"{cfg.global_batch} ({self.per_rank_batch} per rank), precision {self.precision}, "
                           f"checkpoints {self.ckpt_file or 'off'}")
        stopped_by, last_loss, steps_before = 0, float("nan"), self.step
        fp16 = self.precision == "fp16"  # there GradScaler skips inf/nan steps by design: count them instead
        self.agreement = StopAgreement(stop or StopRequest(), cfg.stop_check_every, self.comm, self.device,
                                       launch.world_size, guard_finite=not fp16,
                                       max_fp16_skips=cfg.max_skipped_steps if fp16 else 0,
                                       stop_after_s=cfg.stop_after_s, expected_save_s=self._expected_save_s(),
                                       step=self.step)
        if self.agreement.deadline is not None:
            print_main(launch, self.agreement.deadline_line())
        self.trackers.start(cfg.log_every_s, self.step, self.agreement.deadline)
        while not self._finished() and not stopped_by:
            self.sampler.start_epoch(self.epoch, skip_batches=self.batch_in_epoch)
            last_loss, stopped_by = self._run_epoch()
            if self.batch_in_epoch == self.batches_per_epoch:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                self._save_snapshot()
                if self.eval_every and self.epoch % self.eval_every == 0:
                    self._evaluate()
        if self.batch_in_epoch:
            self._save_snapshot()  # stopped mid-epoch, by a signal or --max-steps
            if self.eval_every and self._finished():
                self._evaluate()  # a run that ends on --max-steps is evaluated at its end
        self.trackers.close()
        check_replicas_agree(self.model, launch)
        self._write_summary(last_loss, stopped_by)
        if self._finished():
            self._save_model()
        return self._report_end(stopped_by, last_loss, steps_before)

    def _report_end(self, stopped_by: int, last_loss: float, steps_before: int) -> int:
        """Exit 75 only when work is left: a stop agreed on the very last step completed the run."""
        launch = self.launch
        if stopped_by and not self._finished():
            print_main(launch, f"stopped on {signal_name(stopped_by)} at epoch {self.epoch + 1} batch "
                               f"{self.batch_in_epoch} (step {self.step}); checkpoint "
                               f"{self.ckpt_file or 'off (no --ckpt-dir)'}; resume with --resume; exit {EXIT_STOPPED}")
            return EXIT_STOPPED
        if self.step == steps_before:
            print_main(launch, f"nothing to train: already at epoch {self.epoch}, step {self.step}")
        else:
            late = f" ({signal_name(stopped_by)} arrived at the last step: the run is complete)" if stopped_by else ""
            print_main(launch, f"done: {self.step} steps, last epoch loss {last_loss:.4f}{late}")
        return 0

    def _save_model(self) -> None:
        """--save-model: the trained weights alone (unwrapped state_dict), as accelerator.save does."""
        error = None
        if self.config.save_model and self.launch.is_main:
            try:
                ckpt.save_atomic(unwrap(self.model).state_dict(), self.config.save_model)
            except Exception as e:  # the run's checkpoint is already saved: say so, exit 74
                error = ckpt.save_failure(e, Path(self.config.save_model))
        broadcast_error(self.launch, error, SaveFailed)

    def _finished(self) -> bool:
        max_steps = self.config.max_steps
        return self.epoch >= self.config.epochs or (bool(max_steps) and self.step >= max_steps)

    def _evaluate(self) -> None:
        results, count = evaluate(unwrap(self.model), self.eval_set, self.loss_fn, self.launch, self.device,
                                  self.precision, self.per_rank_batch, self.eval_metrics)
        figures = ", ".join(f"{name} {value:.4f}" for name, value in results.items())
        print_main(self.launch, f"eval after epoch {self.epoch} (step {self.step}): {figures} "
                                f"over {count} held-out items")
        self.trackers.scalars(self.step, {f"eval/{name}": value for name, value in results.items()})
        if self.on_eval is not None and self.launch.is_main:
            self.on_eval(dict(results, epoch=self.epoch, step=self.step))

    def _micro_batch_groups(self) -> Iterator[list[Any]]:
        """The rest of the epoch's micro-batches in groups of --accum (a shorter last group)."""
        batches = (to_device(b, self.device, non_blocking=self.pin) for b in iterate(self.loader))
        while group := list(itertools.islice(batches, self.config.accum)):
            yield group

    def _run_epoch(self) -> tuple[float, int]:
        """Train the rest of the current epoch; returns (mean loss over all ranks, signal or 0)."""
        loss_sum = torch.zeros((), device=self.device)
        steps = samples = skipped = stopped_by = 0
        norms: list[float] = []
        started = time.perf_counter()
        self.trackers.epoch_started(self.step)
        for group in self._micro_batch_groups():
            result = self.train_step(group)
            loss_sum += result.loss
            steps, samples, skipped = steps + 1, samples + result.samples, skipped + result.skipped
            if result.grad_norm is not None:
                norms.append(result.grad_norm)
            self.batch_in_epoch, self.step = self.batch_in_epoch + len(group), self.step + 1
            now = time.perf_counter()
            self.clock.step_done(now, result.samples)
            if self.trackers.recording:  # only then: under fp16 get_scale() is a host sync
                self.trackers.step(self.step, self.epoch, result.samples, result.loss,
                                   self.optimizer.param_groups[0]["lr"], result.grad_norm,
                                   self.scaler.get_scale() if self.scaler.is_enabled() else None)
            if self.trackers.progress_due(now):
                self.trackers.progress(now, self.step, f"epoch {self.epoch + 1}/{self.config.epochs} "
                                       f"[{self.batch_in_epoch}/{self.batches_per_epoch}]", loss_sum,
                                       self.clock.samples_per_s())
            self.agreement.watch(result.grad_norm, result.skipped)
            # Agree at every check step and always before a save (epoch end, run end), so that
            # a diverged state is never written over the last good checkpoint.
            if self.agreement.due(self.step, boundary=self.batch_in_epoch >= self.batches_per_epoch
                                  or self._finished()):
                since = self.agreement.checked_step
                verdict = self.agreement.agree(self.step, loss_sum)
                if verdict.diverged:
                    raise self._divergence(verdict.diverged, since, result.loss.item())
                stopped_by = verdict.signal
            if stopped_by or self._finished():
                break
        mean = self._epoch_report(loss_sum, steps, samples, skipped, norms, time.perf_counter() - started)
        self.trackers.scalars(self.step, {"epoch_loss": mean})
        return mean, stopped_by

    def _divergence(self, verdict_kind: int, since_step: int, last_loss: float) -> Diverged:
        kept = (f"{self.ckpt_file} from before it was kept, the diverged state was not saved" if self.ckpt_file
                else "nothing was saved (no --ckpt-dir)")
        return Diverged(f"{self.agreement.describe(verdict_kind, since_step, self.step, last_loss)}; {kept}; "
                        f"try a lower --lr (this run: {self.config.lr:g}) or --clip-norm, then --resume")

    def _epoch_report(self, loss_sum: torch.Tensor, steps: int, samples: int, skipped: int,
                      norms: list[float], elapsed: float) -> float:
        """The epoch's loss averaged over every rank's steps (not rank 0's own), logged."""
        totals = reduce(torch.stack([loss_sum.float(), torch.tensor(float(steps), device=self.device)]), "sum")
        mean = (totals[0] / totals[1].clamp(min=1)).item()
        extra = f", {skipped} steps skipped by fp16 overflow" if skipped else ""
        if norms:
            extra += f", grad norm before clipping mean {sum(norms) / len(norms):.3g} max {max(norms):.3g}"
        part = ("" if self.batch_in_epoch == self.batches_per_epoch
                else f" [{self.batch_in_epoch}/{self.batches_per_epoch} batches]")
        print_main(self.launch, f"epoch {self.epoch + 1}/{self.config.epochs}{part}: loss {mean:.4f}, "
                                f"{samples / max(elapsed, 1e-9):,.0f} samples/s, {elapsed:.2f}s{extra}")
        return mean

    def _write_summary(self, last_loss: float, stopped_by: int) -> None:
        """Rank 0 writes the run's figures as JSON: peak memory is gathered from every rank."""
        peak, kind = peak_memory_mib(self.device)
        peaks = all_ranks(peak)
        if self.config.summary_json and self.launch.is_main:
            write_summary(self.config.summary_json, run_summary(
                self.launch.world_size, self.config.global_batch, self.precision, self.step, last_loss, self.clock,
                peaks, kind, signal_name(stopped_by) if stopped_by else None, self.device))

