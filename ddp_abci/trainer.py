"""Training loop: the whole DDP life cycle of one run, read top to bottom in Trainer.run."""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint as ckpt
from .comm_hook import mpi_max, register_mpi_hook, resolve_comm
from .config import TrainConfig
from .data import LinspaceDataset, build_loader, per_rank_batch
from .errors import UsageError
from .launch import Launch
from .model import build_model, build_optimizer, rmse_loss, unwrap, wrap_model
from .precision import autocast, make_scaler, resolve_precision
from .signals import EXIT_STOPPED, StopRequest, signal_name


def log(launch: Launch, message: str) -> None:
    """Print on rank 0 only; every rank printing would repeat each line world_size times."""
    if launch.is_main:
        print(message, flush=True)


def broadcast_error(launch: Launch, error: str | None) -> None:
    """Raise rank 0's verdict on every rank, so that all stop together with one message."""
    box = [error]
    if launch.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise UsageError(box[0])


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

        dataset = LinspaceDataset(config.dim_in, config.num_items)
        pin = device.type == "cuda" if config.pin_memory is None else config.pin_memory
        self.loader = build_loader(dataset, launch, config.global_batch, seed=config.seed,
                                   workers=config.workers, pin_memory=pin,
                                   persistent_workers=config.persistent_workers)
        self.batches_per_epoch = len(self.loader.sampler)
        model = build_model(config.seed, config.dim_in, config.dim_hidden)
        if snapshot is not None:
            ckpt.check_model_shape(snapshot, model, self.ckpt_file)
            model.load_state_dict(snapshot["model"])  # before DDP: it broadcasts rank 0's weights
        self.model = wrap_model(model, device, launch.world_size)
        self.comm = resolve_comm(config.comm, launch, device)
        if launch.world_size > 1 and self.comm == "mpi":
            register_mpi_hook(self.model)
        self.optimizer = build_optimizer(self.model, config.lr, config.betas)
        self.scaler = make_scaler(self.precision, device)
        if snapshot is not None:
            self._load_snapshot(snapshot)

    # -- checkpoints -------------------------------------------------------------------

    @property
    def ckpt_file(self) -> Path | None:
        return ckpt.checkpoint_path(self.config.ckpt_dir) if self.config.ckpt_dir else None

    def _preflight(self) -> dict | None:
        """Check the checkpoint folder before any work: rank 0 decides, all ranks obey.
        Returns the snapshot to resume from, loaded (weights_only) on every rank."""
        path, error = self.ckpt_file, None
        if path is not None and self.launch.is_main:
            try:
                ckpt.check_writable(path.parent)
                if path.exists() and not self.config.resume:
                    raise ckpt.CheckpointError(
                        f"{path} exists and would be overwritten; pass --resume to continue it, "
                        "or choose another --ckpt-dir")
                if path.exists():
                    self._check_resumable(ckpt.load_checkpoint(path))
            except UsageError as e:
                error = str(e)
            except Exception as e:  # anything else too: the other ranks wait in the broadcast
                error = f"checking {path} failed: {e!r}"
        broadcast_error(self.launch, error)
        if path is None or not self.config.resume:
            return None
        if not path.exists():
            log(self.launch, f"resume: no checkpoint at {path}; starting fresh")
            return None
        return ckpt.load_checkpoint(path)

    def _check_resumable(self, snapshot: dict) -> None:
        if snapshot["global_batch"] != self.config.global_batch:
            raise ckpt.CheckpointError(
                f"{self.ckpt_file} was written with global batch {snapshot['global_batch']}; "
                f"resume with --bs {snapshot['global_batch']} (an exact resume needs the same batch)")

    def _load_snapshot(self, snapshot: dict) -> None:
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scaler.load_state_dict(snapshot["scaler"])
        ckpt.restore_rng(snapshot["rng"])
        self.epoch, self.batch_in_epoch, self.step = snapshot["epoch"], snapshot["batch_in_epoch"], snapshot["step"]
        note = ""
        if snapshot["world_size"] != self.launch.world_size:
            note = (f"; world size changed {snapshot['world_size']} -> {self.launch.world_size}, "
                    f"global batch {self.config.global_batch} kept, so each rank now takes {self.per_rank_batch}")
        log(self.launch, f"resume: {self.ckpt_file} at epoch {self.epoch}, batch {self.batch_in_epoch}, step {self.step}{note}")

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
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "sampler_epoch": self.loader.sampler.epoch,
                "step": self.step,
                "global_batch": self.config.global_batch,
                "world_size": self.launch.world_size,
                "config": self.config.to_dict(),
                "rng": ckpt.rng_state(),
            }, self.ckpt_file)
        if self.launch.world_size > 1:
            dist.barrier()

    # -- the loop ----------------------------------------------------------------------

    def train_step(self, x: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """One optimizer step. Returns the loss and whether fp16 overflow skipped the step."""
        with autocast(self.precision, self.device):
            loss = rmse_loss(x, self.model(x))
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()  # DDP all-reduces gradient buckets during backward
        if not self.scaler.is_enabled():
            self.optimizer.step()
            return loss.detach(), False
        # GradScaler skips optimizer.step when gradients overflowed and then lowers the
        # scale; comparing scales is how Accelerate's step_was_skipped detects it too.
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach(), self.scaler.get_scale() < before

    def run(self, stop: StopRequest | None = None) -> int:
        """Train until --epochs or --max-steps, or until a stop signal; returns the exit status.

        Pass an entered StopRequest to act on SIGTERM/SIGUSR1 (the command line does)."""
        cfg, launch = self.config, self.launch
        log(launch, f"training: {cfg.epochs} epochs of {self.batches_per_epoch} steps, global batch "
                    f"{cfg.global_batch} ({self.per_rank_batch} per rank), precision {self.precision}, "
                    f"checkpoints {self.ckpt_file or 'off'}")
        stopped_by, last_loss, steps_before = 0, float("nan"), self.step
        stop = stop or StopRequest()
        while self.epoch < cfg.epochs and not self._max_steps_reached() and not stopped_by:
            self.loader.sampler.start_epoch(self.epoch, skip_batches=self.batch_in_epoch)
            last_loss, stopped_by = self._run_epoch(stop)
            if self.batch_in_epoch == self.batches_per_epoch:
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0
                self._save_snapshot()
        if self.batch_in_epoch:
            self._save_snapshot()  # stopped mid-epoch, by a signal or --max-steps
        self._check_replicas_agree()
        self._write_summary(last_loss, stopped_by)
        if stopped_by:
            log(launch, f"stopped on {signal_name(stopped_by)} at epoch {self.epoch + 1} batch {self.batch_in_epoch} "
                        f"(step {self.step}); checkpoint {self.ckpt_file or 'off (no --ckpt-dir)'}; "
                        f"resume with --resume; exit {EXIT_STOPPED}")
            return EXIT_STOPPED
        if self.step == steps_before:
            log(launch, f"nothing to train: already at epoch {self.epoch}, step {self.step}")
        else:
            log(launch, f"done: {self.step} steps, last epoch loss {last_loss:.4f}")
        return 0

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
        log(self.launch, f"replicas agree: identical weights on all {self.launch.world_size} ranks "
                         f"(checksum {high.item():.6f})")

    def _max_steps_reached(self) -> bool:
        return bool(self.config.max_steps) and self.step >= self.config.max_steps

    def _run_epoch(self, stop: StopRequest) -> tuple[float, int]:
        """Train the rest of the current epoch; returns (mean loss over all ranks, signal or 0)."""
        loss_sum = torch.zeros((), device=self.device)
        batches = skipped = stopped_by = 0
        started = last_log = time.perf_counter()
        for x in self.loader:
            x = x.to(self.device, non_blocking=True)
            loss, was_skipped = self.train_step(x)
            loss_sum += loss
            batches, skipped = batches + 1, skipped + was_skipped
            self.batch_in_epoch, self.step = self.batch_in_epoch + 1, self.step + 1
            now = time.perf_counter()
            self.clock.step_done(now, self.config.global_batch)
            if self.launch.is_main and now - last_log >= self.config.log_every_s:
                last_log = now
                print(f"  epoch {self.epoch + 1} [{self.batch_in_epoch}/{self.batches_per_epoch}] "
                      f"rank-0 loss {loss.item():.4f}", flush=True)
            stopped_by = self._stop_agreed(stop)
            if stopped_by or self._max_steps_reached():
                break
        return self._epoch_report(loss_sum, batches, skipped, time.perf_counter() - started), stopped_by

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

    def _epoch_report(self, loss_sum: torch.Tensor, batches: int, skipped: int, elapsed: float) -> float:
        """The epoch's loss averaged over every rank's batches (not rank 0's own), logged."""
        totals = torch.stack([loss_sum.float(), torch.tensor(float(batches), device=self.device)])
        if self.launch.world_size > 1:
            dist.all_reduce(totals)
        mean = (totals[0] / totals[1].clamp(min=1)).item()
        rate = batches * self.config.global_batch / max(elapsed, 1e-9)
        extra = f", {skipped} steps skipped by fp16 overflow" if skipped else ""
        part = "" if self.batch_in_epoch == self.batches_per_epoch else f" [{self.batch_in_epoch}/{self.batches_per_epoch} batches]"
        log(self.launch, f"epoch {self.epoch + 1}/{self.config.epochs}{part}: loss {mean:.4f}, "
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
