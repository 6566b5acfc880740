"""Everything one run trains with, built in order before its first step: the checks that
need nothing built (data, files, the checkpoint to resume), the model (its resumed weights
loaded before DDP broadcasts rank 0's), the dry run of loss_fn, DDP and its gradient path,
torch.compile, the loader, the optimizer, GradScaler and the schedule; then the checkpoint's
parts, registered and (on resume) restored, the save points, the stop agreement and the logs.

The preflight's verdicts are collectives: every rank calls them, marked for the watchdog.
What is decided once for the run (device, precision, gradient path, the training set's kind
and size) comes in the RunPlan; nothing here decides it again.
"""
from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from . import preflight
from .checkpointing import checkpoint as ckpt
from .checkpointing import choice, resume
from .checkpointing.manager import CheckpointManager
from .checkpointing.resume import Position
from .checkpointing.save_points import ASSUMED_COPY_BYTES_PER_S, SavePoints
from .config import TrainConfig, name
from .data import EpochBatches, build_loader
from .errors import UsageError
from .model import adam, compile_model, make_optimizer, wrap_model
from .parallel import zero
from .parallel.agreement import Agreement
from .parallel.collectives import all_ranks, print_main
from .parallel.comm_choice import measure_and_choose
from .parallel.gradients import GradientPath, gradient_path
from .parallel.launch import Launch
from .parallel.signals import StopRequest
from .plan import RunPlan
from .precision import make_scaler
from .schedule import build_schedule
from .stragglers import StragglerWatch
from .stream_readers import Reader, reader_for
from .streams import Stream
from .throughput import plan_throughput
from .tracking import Clock, RunTrackers


@dataclass
class Assembly:
    """Everything the loop trains with, built once by assemble() in the order a run needs it."""

    model: torch.nn.Module            # what the loop calls: DDP-wrapped (and compiled) on several ranks
    ddp: torch.nn.Module              # DDP itself (no_sync), or the bare model on one rank
    gradients: GradientPath           # the gradient all-reduce's path (its hook, the control all-reduce)
    batches: Any                      # data.EpochBatches (a map-style set) or streams.Stream
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    scheduler: Any                    # the built-in LambdaLR, the user's scheduler, or None
    total_steps: int | None           # None: a stream without a length and no --max-steps
    checkpoints: CheckpointManager
    save_points: SavePoints
    agreement: Agreement
    stragglers: StragglerWatch | None  # rank 0's, with --straggler-threshold
    trackers: RunTrackers


def assemble(plan: RunPlan, watchdog: Any, stop: StopRequest, position: Position, *, eval_metrics: dict,
             clock: Clock) -> Assembly:
    """Every part, in the order a run needs them; a bad one is one line before any training.
    `eval_metrics`: the metrics the dry run checks (none where the run never evaluates);
    `clock`: the run's (tracking.Clock), whose start-up milestones this adds to."""
    config, launch, job = plan.config, plan.launch, plan.parts
    device, data, model = plan.device, plan.data, job.model
    scheduler, state = job.scheduler, dict(job.state or {})
    reader = reader_for(data.dataset, launch.rank, launch.world_size, plan.per_rank_batch, data.workers) \
        if data.stream else None
    preflight.check_data(data, reader, job.eval_set, config, launch)
    _refuse_both_schedules(config, scheduler)
    ckpt_file = ckpt.checkpoint_path(config.ckpt_dir) if config.ckpt_dir else None
    with watchdog.waiting("preflight: rank 0's verdict on the files"):
        snapshot, resumed_from = choice.share(launch, config, ckpt_file, data.items,
                                              first=lambda: preflight.check_outputs(config))
    if reader is not None:
        with watchdog.waiting("preflight: the stream's order on every rank"):
            preflight.share_stream_order(launch, reader)
    seed_everything(config.seed + launch.rank)
    _refuse_wrapped(model)
    if snapshot is not None:
        ckpt.check_model_shape(snapshot, model, resumed_from)
        model.load_state_dict(snapshot["model"])  # before DDP: it broadcasts rank 0's weights
    model = model.to(device)
    gradients = _gradient_path(plan, launch, device, model, watchdog, snapshot)
    with watchdog.waiting("preflight: the dry run's verdict"):
        with watchdog.working("the dry run of loss_fn"):
            error = preflight.dry_run(model, data, reader, job.loss_fn, plan.precision, device, plan.per_rank_batch,
                                      find_unused=config.find_unused_parameters, eval_set=job.eval_set,
                                      metrics=eval_metrics or None,
                                      last_batch=preflight.short_last_batch(data, config, launch.world_size))
        preflight.share_dry_run(error)
    with watchdog.waiting("preflight: the free-space verdict"):
        preflight.share_disk_check(launch, ckpt_file.parent if ckpt_file else None, model)
    if config.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ddp = wrap_model(model, device, launch.world_size, find_unused_parameters=config.find_unused_parameters)
    clock.startup["ddp_unix"] = time.time()
    if launch.world_size > 1:
        gradients.register(ddp, watchdog)
    # torch.compile last, over the DDP-wrapped model, as Accelerate's prepare does: Dynamo's
    # DDPOptimizer then breaks the graph at DDP's bucket boundaries and the all-reduce still
    # overlaps backward; compiled first, one fused backward makes every gradient ready at
    # once (torch 2.13, _dynamo/backends/distributed.py, Note [DDPOptimizer]).
    wrapped = compile_model(ddp, device) if config.compile else ddp
    batches = _batches(config, launch, plan, reader)
    factory = job.optimizer or adam(config.lr, config.betas, config.fused_adam)
    built = make_optimizer(factory, wrapped, config.lr)
    if config.zero and launch.world_size > 1:
        built = zero.shard(built)  # before the schedule, which must step the optimizer the loop steps
    total = _total_steps(config, batches)
    schedule = _user_scheduler(scheduler, built) if scheduler is not None else \
        build_schedule(built, config.schedule, config.warmup_steps, _schedule_steps(config, total))
    scaler = make_scaler(plan.precision, device)
    header = {"format": ckpt.FORMAT, "global_batch": config.global_batch, "world_size": launch.world_size,
              "train_items": data.items, "config": {**config.to_dict(), **job.settings}, "gradients": gradients.name}
    checkpoints = CheckpointManager(config.ckpt_dir, launch, watchdog, keep=config.keep, background=config.async_save,
                                    header=header)
    parts = resume.Parts(model=resume.ModelWeights(model), scaler=scaler,
                         optimizer=resume.OptimizerState(built, this_runs_win=scheduler is None),
                         scheduler=resume.UserScheduler(schedule) if scheduler is not None else
                         resume.ScheduleState(schedule, position, replan=bool(config.schedule_steps)),
                         position=position, state=state,
                         data=batches if isinstance(batches, Stream) else None,
                         compression=plan.compression if plan.compression and plan.compression.state else None)
    parts.register(checkpoints)
    if snapshot is not None:
        choice.restore(snapshot, resumed_from, checkpoints, parts, config, launch, plan.per_rank_batch, watchdog,
                       len(batches) if isinstance(batches, EpochBatches) else None)
    size = ckpt.estimated_bytes(model) if config.ckpt_dir else 0
    save_points = SavePoints(config.save_every_steps, config.save_every_minutes, config.mtbf_hours,
                             bool(config.ckpt_dir), size / ASSUMED_COPY_BYTES_PER_S)
    fp16 = plan.precision == "fp16"  # there GradScaler skips inf/nan steps by design: count them instead
    agreement = Agreement(stop, config.stop_check_every, gradients, device, launch.rank, launch.world_size,
                              guard_finite=not fp16, max_fp16_skips=config.max_skipped_steps if fp16 else 0,
                              stop_after_s=config.stop_after_s, expected_save_s=size / 100e6, step=position.step,
                              stop_at=config.stop_at)
    checkpoints.on_written = agreement.saved
    with watchdog.waiting("opening the logs"):
        stragglers, trackers = _trackers(plan, model, position.step, total, agreement.deadline, clock)
    return Assembly(wrapped, ddp, gradients, batches, built, scaler, schedule, total, checkpoints, save_points,
                    agreement, stragglers, trackers)


def _gradient_path(plan: RunPlan, launch: Launch, device: torch.device, model: torch.nn.Module,
                   watchdog: Any, snapshot: dict | None) -> GradientPath:
    """The gradient all-reduce's path (measured, where --comm auto leaves MPI or gloo open),
    and the run's first line, which names it. A resumed run keeps the path its checkpoint
    was made with: the two sum in different orders, and the resume would not be exact."""
    gradients, measured = plan.gradients(), ""
    kept = (snapshot or {}).get("gradients") if (snapshot or {}).get("world_size") == launch.world_size else None
    if gradients is None and kept in ("mpi", "gloo"):
        gradients, measured = gradient_path(kept), f"gradients: via {kept}, as the checkpoint's run chose (--comm auto)"
    elif gradients is None:
        gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        gradients, measured = measure_and_choose(gradient_bytes, watchdog)
    backend = dist.get_backend() if dist.is_initialized() else "none"
    print_main(launch, f"ddp_abci: world size {launch.world_size} (local {launch.local_world_size}), backend "
                       f"{backend}, gradients via {gradients.name}, device {device}, rendezvous "
                       f"{launch.master_addr}:{launch.master_port} (from {launch.source})")
    if measured:
        print_main(launch, measured)
    return gradients


def _trackers(plan: RunPlan, model: torch.nn.Module, step: int, total: int | None, deadline: float | None,
              clock: Clock) -> tuple[StragglerWatch | None, RunTrackers]:
    """Collective: every rank's host (the straggler report names them); rank 0 opens the
    logs and trackers, and a failure there stops every rank before training."""
    config, launch = plan.config, plan.launch
    hosts = all_ranks(socket.gethostname()) if config.straggler_threshold else []
    watch = StragglerWatch(config.straggler_threshold, hosts, config.log_every_s,
                           config.ckpt_dir) if hosts and launch.is_main else None
    throughput, line = plan_throughput(config, model, plan.device, plan.precision, launch.world_size,
                                       plan.parts.count_tokens is not None)
    if line:
        print_main(launch, line)
    settings = dict(config.to_dict(), job=plan.parts.settings) if plan.parts.settings else config.to_dict()
    return watch, RunTrackers(config, launch, step, total, deadline, clock, throughput, settings)


def seed_everything(seed: int) -> None:
    """torch, random and numpy, as accelerate.utils.set_seed does. Each rank is seeded with
    seed + rank (nanoGPT's seed offset): dropout and augmentations differ between ranks,
    while DDP's broadcast at wrapping makes the starting weights rank 0's on all."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _batches(config: TrainConfig, launch: Launch, plan: RunPlan, reader: Reader | None) -> Any:
    data = plan.data
    if reader is not None:
        return Stream(data.dataset, launch.rank, launch.world_size, plan.per_rank_batch, workers=data.workers,
                      pin_memory=data.pin_memory, collate_fn=data.collate_fn, reader=reader)
    loader = build_loader(data.dataset, launch, config.global_batch, seed=config.seed, shuffle=data.shuffle,
                          split=config.split, drop_last=data.drop_last, workers=data.workers,
                          pin_memory=data.pin_memory, persistent_workers=data.persistent_workers,
                          collate_fn=data.collate_fn, batched=config.batched_fetch)
    return EpochBatches(loader, direct=config.direct_loader)


def _total_steps(config: TrainConfig, batches: Any) -> int | None:
    if config.max_steps:
        return config.max_steps
    if getattr(batches, "sized", True):
        return config.epochs * -(-len(batches) // config.accum)
    return None


def _schedule_steps(config: TrainConfig, total: int | None) -> int:
    """The built-in schedule's length: --schedule-steps, else the run's own length."""
    if config.schedule_steps:
        return config.schedule_steps
    if total is None and config.schedule != "constant":
        raise UsageError(f"{name('schedule')} {config.schedule} needs the run's length, and a stream without one "
                         f"gives none: pass {name('max_steps')} or {name('schedule_steps')}")
    return total or 0


def _user_scheduler(factory: Callable, optimizer: torch.optim.Optimizer) -> Any:
    try:
        scheduler = factory(optimizer)
    except Exception as e:
        raise UsageError(f"the scheduler factory raised {type(e).__name__}: {' '.join(str(e).split())[:200]}; it "
                         "gets the optimizer and returns a torch.optim.lr_scheduler.LRScheduler over it") from None
    if not (callable(getattr(scheduler, "step", None)) and callable(getattr(scheduler, "state_dict", None))):
        raise UsageError(f"the scheduler factory returned a {type(scheduler).__name__}, not a learning-rate "
                         "scheduler; return e.g. torch.optim.lr_scheduler.OneCycleLR(optimizer, ...)")
    return scheduler


def _refuse_both_schedules(config: TrainConfig, scheduler: Callable | None) -> None:
    if scheduler is not None and (config.schedule != "constant" or config.warmup_steps or config.schedule_steps):
        raise UsageError(f"fit(scheduler=...) and the built-in {name('schedule')}/{name('warmup_steps')} both set "
                         "the learning rate; use one: leave schedule='constant' and warmup_steps=0 with your own")


def _refuse_wrapped(model: torch.nn.Module) -> None:
    if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        raise UsageError(f"the model is already wrapped in {type(model).__name__}; pass the bare model "
                         "(model.module): the trainer wraps it in DDP itself")
