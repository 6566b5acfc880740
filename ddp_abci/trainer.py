"""Training loop: the whole DDP life cycle of one run, read top to bottom in Trainer.run."""
from __future__ import annotations

import contextlib
import itertools
import json
import resource
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import checkpoint as ckpt
from .collectives import broadcast_error, print_main, reduce, wait_for_everyone
from .comm_hook import mpi_max, register_mpi_hook, resolve_comm
from .config import TrainConfig
from .data import LinspaceDataset, build_loader, per_rank_batch
from .errors import UsageError
from .evaluation import evaluate
from .launch import Launch
from .metrics import Clock, MetricsLog
from .model import LOSSES, build_model, build_optimizer, compile_model, unwrap, wrap_model
from .precision import autocast, make_scaler, resolve_precision
from .schedule import build_schedule
from .signals import EXIT_STOPPED, StopRequest, signal_name


class StepResult(NamedTuple):
    loss: torch.Tensor         # mean of the micro-batch losses, detached
    skipped: bool              # fp16 overflow: GradScaler skipped optimizer.step
    grad_norm: float | None    # total gradient norm before clipping (with --clip-norm)


class Trainer:
    def __init__(self, config: TrainConfig, launch: Launch, device: torch.device) -> None:
        self.config, self.launch, self.device = config, launch, device
        self.precision = resolve_precision(config.amp, device)
        self.per_rank_batch = per_rank_batch(config.global_batch, launch.world_size)
        self.epoch = 0           # epochs completed, i.e. the epoch in progress (0-based)
        self.batch_in_epoch = 0  # global batches of that epoch already trained
        self.step = 0            # optimizer steps taken (skipped fp16 steps included)
        self.clock = Clock()
        snapshot = self._preflight()

        train_items = config.num_items - config.eval_items
        self.eval_set = LinspaceDataset(config.dim_in, config.eval_items, start=train_items) if config.eval_items else None
        pin = device.type == "cuda" if config.pin_memory is None else config.pin_memory
        self.loader = build_loader(LinspaceDataset(config.dim_in, train_items), launch, config.global_batch,
                                   seed=config.seed, workers=config.workers, pin_memory=pin,
                                   persistent_workers=config.persistent_workers)
        self.batches_per_epoch = len(self.loader.sampler)  # micro-batches; --accum of them make a step
        self.loss_fn = LOSSES[config.loss]
        model = build_model(config.seed, config.dim_in, config.dim_hidden)
        if snapshot is not None:
            ckpt.check_model_shape(snapshot, model, self.ckpt_file)
            model.load_state_dict(snapshot["model"])  # before DDP: it broadcasts rank 0's weights
        if config.compile:
            model = compile_model(model, device)  # before DDP, so DDP sees the compiled graph
        self.model = wrap_model(model, device, launch.world_size)
        self.comm = resolve_comm(config.comm, launch, device)
        if launch.world_size > 1 and self.comm == "mpi":
            register_mpi_hook(self.model)
        self.optimizer = build_optimizer(self.model, config.lr, config.betas)
        self.scaler = make_scaler(self.precision, device)
        steps_per_epoch = -(-self.batches_per_epoch // config.accum)
        self.scheduler = build_schedule(self.optimizer, config.schedule, config.warmup_steps,
                                        config.max_steps or config.epochs * steps_per_epoch)
        self.metrics = (MetricsLog(config.metrics_jsonl, config.global_batch * config.accum)
                        if config.metrics_jsonl and launch.is_main else None)
        if snapshot is not None:
            self._load_snapshot(snapshot)

    # -- checkpoints -------------------------------------------------------------------

    @property
    def ckpt_file(self) -> Path | None:
        return ckpt.checkpoint_path(self.config.ckpt_dir) if self.config.ckpt_dir else None

    def _preflight(self) -> dict | None:
        """Check the files this run writes before any work: rank 0 decides, all ranks obey.
        Returns the snapshot to resume from, loaded (weights_only) on every rank."""
        path, error, checked = self.ckpt_file, None, None
        if self.launch.is_main and self.config.metrics_jsonl:
            try:
                open(self.config.metrics_jsonl, "a").close()
            except OSError as e:
                error = f"--metrics-jsonl {self.config.metrics_jsonl} cannot be written ({e.strerror}); choose a writable path"
        if path is not None and self.launch.is_main and error is None:
            try:
                ckpt.check_writable(path.parent)
                if path.exists() and not self.config.resume:
                    raise ckpt.CheckpointError(
                        f"{path} exists and would be overwritten; pass --resume to continue it, "
                        "or choose another --ckpt-dir")
                if path.exists():
                    checked = ckpt.load_checkpoint(path)
                    self._check_resumable(checked)
            except UsageError as e:
                error = str(e)
            except Exception as e:  # anything else too: the other ranks wait in the broadcast
                error = f"checking {path} failed: {e!r}"
        broadcast_error(self.launch, error)
        if path is None or not self.config.resume:
            return None
        if not path.exists():
            print_main(self.launch, f"resume: no checkpoint at {path}; starting fresh")
            return None
        return checked if checked is not None else ckpt.load_checkpoint(path)  # rank 0 has it already

    def _check_resumable(self, snapshot: dict) -> None:
        if snapshot["global_batch"] != self.config.global_batch:
            raise ckpt.CheckpointError(
                f"{self.ckpt_file} was written with global batch {snapshot['global_batch']}; "
                f"resume with --bs {snapshot['global_batch']} (an exact resume needs the same batch)")

    def _load_snapshot(self, snapshot: dict) -> None:
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])
        if self.scheduler is not None and snapshot.get("scheduler"):
            self.scheduler.load_state_dict(snapshot["scheduler"])
        ckpt.restore_rng(snapshot["rng"])
        self.epoch, self.batch_in_epoch, self.step = snapshot["epoch"], snapshot["batch_in_epoch"], snapshot["step"]
        note = ""
        if snapshot["world_size"] != self.launch.world_size:
            note = (f"; world size changed {snapshot['world_size']} -> {self.launch.world_size}, "
                    f"global batch {self.config.global_batch} kept, so each rank now takes {self.per_rank_batch}")
        print_main(self.launch, f"resume: {self.ckpt_file} at epoch {self.epoch}, batch {self.batch_in_epoch}, step {self.step}{note}")

    def _save_snapshot(self) -> None:
        """Rank 0 writes atomically; the others wait so that nobody runs ahead of a checkpoint
        that may still fail (or exits while rank 0 is writing)."""
        if self.ckpt_file is None:
            return
        if self.launch.is_main:
            ckpt.save_atomic({
                "format": ckpt.FORMAT,
                "model": unwrap(self.model).state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "sampler_epoch": self.loader.sampler.epoch,
                "step": self.step,
                "global_batch": self.config.global_batch,
                "world_size": self.launch.world_size,
                "config": self.config.to_dict(),
                "rng": ckpt.rng_state(),
            }, self.ckpt_file)
        wait_for_everyone()

    # -- the loop ----------------------------------------------------------------------

    def train_step(self, micro_batches: list[torch.Tensor]) -> StepResult:
        """One optimizer step over the micro-batches (--accum of them; one by default)."""
        self.optimizer.zero_grad(set_to_none=True)
        count, loss_sum = len(micro_batches), torch.zeros((), device=self.device)
        for i, x in enumerate(micro_batches):
            with self._grad_sync(last=i == count - 1):
                with autocast(self.precision, self.device):
                    loss = self.loss_fn(x, self.model(x))
                # / count: the accumulated gradient is that of the micro-batch losses' mean.
                # DDP all-reduces gradient buckets during the last micro-batch's backward.
                self.scaler.scale(loss / count).backward()
            loss_sum += loss.detach()
        grad_norm = None
        if self.config.clip_norm:
            self.scaler.unscale_(self.optimizer)  # clip true gradients, not scaled ones
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_norm).item()
        skipped = self._optimizer_step()
        if self.scheduler is not None and not skipped:
            self.scheduler.step()  # a step the scaler skipped did not happen for the schedule either
        return StepResult(loss_sum / count, skipped, grad_norm)

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

    def run(self, stop: StopRequest | None = None) -> int:
        """Train until --epochs or --max-steps, or until a stop signal; returns the exit status.

        Pass an entered StopRequest to act on SIGTERM/SIGUSR1 (the command line does)."""
        cfg, launch = self.config, self.launch
        accum = f", {cfg.accum} micro-batches a step" if cfg.accum > 1 else ""
        print_main(launch, f"training: {cfg.epochs} epochs of {self.batches_per_epoch} batches{accum}, global batch "
                           f"{cfg.global_batch} ({self.per_rank_batch} per rank), precision {self.precision}, "
                           f"loss {cfg.loss}, checkpoints {self.ckpt_file or 'off'}")
        stopped_by, last_loss, steps_before = 0, float("nan"), self.step
        stop = stop or StopRequest()
        while self.epoch < cfg.epochs and not self._max_steps_reached() and not stopped_by:
            self.loader.sampler.start_epoch(self.epoch, skip_batches=self.batch_in_epoch)
            last_loss, stopped_by = self._run_epoch(stop)
            if self.batch_in_epoch == self.batches_per_epoch:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                self._save_snapshot()
                if cfg.eval_every and self.epoch % cfg.eval_every == 0:
                    self._evaluate()
        if self.batch_in_epoch:
            self._save_snapshot()  # stopped mid-epoch, by a signal or --max-steps
        if self.metrics is not None:
            self.metrics.close()
        self._check_replicas_agree()
        self._write_summary(last_loss, stopped_by)
        if stopped_by:
            print_main(launch, f"stopped on {signal_name(stopped_by)} at epoch {self.epoch + 1} batch {self.batch_in_epoch} "
                               f"(step {self.step}); checkpoint {self.ckpt_file or 'off (no --ckpt-dir)'}; "
                               f"resume with --resume; exit {EXIT_STOPPED}")
            return EXIT_STOPPED
        if self.step == steps_before:
            print_main(launch, f"nothing to train: already at epoch {self.epoch}, step {self.step}")
        else:
            print_main(launch, f"done: {self.step} steps, last epoch loss {last_loss:.4f}")
        return 0

    def _evaluate(self) -> None:
        mean, count = evaluate(unwrap(self.model), self.eval_set, self.launch, self.device, self.precision,
                               self.per_rank_batch)
        print_main(self.launch, f"eval after epoch {self.epoch}: mean RMSE {mean:.4f} over {count} held-out items")

    def _check_replicas_agree(self) -> None:
        """Every rank must end with the same weights; DDP guarantees it, this proves it once
        per run (a float64 checksum of the parameters, compared by MIN and MAX)."""
        if self.launch.world_size == 1:
            return
        checksum = sum(p.detach().double().sum() for p in self.model.parameters()).reshape(1)
        low, high = checksum.clone(), checksum.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if low.item() != high.item():
            raise RuntimeError(f"replicas diverged: weight checksums range {low.item()!r} to {high.item()!r}")
        print_main(self.launch, f"replicas agree: identical weights on all {self.launch.world_size} ranks "
                                f"(checksum {high.item():.6f})")

    def _max_steps_reached(self) -> bool:
        return bool(self.config.max_steps) and self.step >= self.config.max_steps

    def _micro_batch_groups(self):
        """The rest of the epoch's micro-batches in groups of --accum (a shorter last group)."""
        batches = (x.to(self.device, non_blocking=True) for x in self.loader)
        while group := list(itertools.islice(batches, self.config.accum)):
            yield group

    def _run_epoch(self, stop: StopRequest) -> tuple[float, int]:
        """Train the rest of the current epoch; returns (mean loss over all ranks, signal or 0)."""
        loss_sum = torch.zeros((), device=self.device)
        steps = micro = skipped = stopped_by = 0
        norms: list[float] = []
        started = last_log = time.perf_counter()
        for group in self._micro_batch_groups():
            result = self.train_step(group)
            loss_sum += result.loss
            steps, micro, skipped = steps + 1, micro + len(group), skipped + result.skipped
            if result.grad_norm is not None:
                norms.append(result.grad_norm)
            self.batch_in_epoch, self.step = self.batch_in_epoch + len(group), self.step + 1
            now = time.perf_counter()
            self.clock.step_done(now, self.config.global_batch * len(group))
            if self.metrics is not None:
                self._log_metrics(result)
            if self.launch.is_main and now - last_log >= self.config.log_every_s:
                last_log = now
                print(f"  epoch {self.epoch + 1} [{self.batch_in_epoch}/{self.batches_per_epoch}] "
                      f"rank-0 loss {result.loss.item():.4f}", flush=True)
            stopped_by = self._stop_agreed(stop)
            if stopped_by or self._max_steps_reached():
                break
        if self.metrics is not None:
            self.metrics.flush()
        return self._epoch_report(loss_sum, steps, micro, skipped, norms, time.perf_counter() - started), stopped_by

    def _log_metrics(self, result: StepResult) -> None:
        self.metrics.step(step=self.step, epoch=self.epoch, loss=result.loss.item(),
                          lr=self.optimizer.param_groups[0]["lr"], grad_norm=result.grad_norm,
                          scale=self.scaler.get_scale() if self.scaler.is_enabled() else None)

    def _stop_agreed(self, stop: StopRequest) -> int:
        """The stop signal some rank received, once every rank knows it; else 0.

        Ranks get a signal at slightly different moments, so the decision is an all-reduce
        (MAX of the signal number) taken at the same step on every rank. Every
        --stop-check-every steps, not every step, keeps its cost off the throughput.
        """
        if self.step % self.config.stop_check_every:
            return 0
        if self.launch.world_size == 1:
            return stop.received
        if self.comm == "mpi":
            return mpi_max(stop.received)
        flag = torch.tensor([stop.received], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def _epoch_report(self, loss_sum: torch.Tensor, steps: int, micro_batches: int, skipped: int,
                      norms: list[float], elapsed: float) -> float:
        """The epoch's loss averaged over every rank's steps (not rank 0's own), logged."""
        totals = reduce(torch.stack([loss_sum.float(), torch.tensor(float(steps), device=self.device)]), "sum")
        mean = (totals[0] / totals[1].clamp(min=1)).item()
        rate = micro_batches * self.config.global_batch / max(elapsed, 1e-9)
        extra = f", {skipped} steps skipped by fp16 overflow" if skipped else ""
        if norms:
            extra += f", grad norm before clipping mean {sum(norms) / len(norms):.3g} max {max(norms):.3g}"
        part = "" if self.batch_in_epoch == self.batches_per_epoch else f" [{self.batch_in_epoch}/{self.batches_per_epoch} batches]"
        print_main(self.launch, f"epoch {self.epoch + 1}/{self.config.epochs}{part}: loss {mean:.4f}, "
                                f"{rate:,.0f} samples/s, {elapsed:.2f}s{extra}")
        return mean

    def _write_summary(self, last_loss: float, stopped_by: int) -> None:
        """Rank 0 writes the run's figures as JSON: peak memory is gathered from every rank."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        peaks = [peak] * self.launch.world_size
        if self.launch.world_size > 1:
            dist.all_gather_object(peaks, peak)
        if not (self.config.summary_json and self.launch.is_main):
            return
        summary = {
            "side": "raw", "world_size": self.launch.world_size, "global_batch": self.config.global_batch,
            "precision": self.precision, "steps": self.step, "final_loss": last_loss,
            "samples_per_s": self.clock.samples_per_s(),
            "start_unix": self.clock.start_unix, "first_step_unix": self.clock.first_step_unix,
            "peak_mem_mib_per_rank": peaks, "memory_kind": "cuda_max_allocated" if self.device.type == "cuda" else "max_rss",
            "stopped_by": signal_name(stopped_by) if stopped_by else None,
            "device": str(self.device), "torch": torch.__version__, "python": sys.version.split()[0],
        }
        Path(self.config.summary_json).write_text(json.dumps(summary, indent=1) + "\n")
