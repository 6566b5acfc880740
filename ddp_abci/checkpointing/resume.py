"""What a checkpoint holds for the Trainer, part by part, and the resume contract.

Each part is an object with state_dict() and load_state_dict() (torch's Stateful), saved
under its checkpoint key by manager.CheckpointManager. Most are torch's own (the
GradScaler, your scheduler, your EMA); the adapters here add what a resume must keep:

    OptimizerState   the optimizer's state (Adam's moments, step counts); on resume this
                     run's hyper-parameters (lr, betas, ...) win, and each change is named
    ScheduleState    the built-in schedule's position and length; its warm-up and base rate from this run
    Position         epoch, batch_in_epoch, step: where the run is
    RNGState         torch's, Python's and numpy's generators (saved for every rank)

On resume the run's position, weights, optimizer state, GradScaler, schedule position and
RNG come from the checkpoint; the hyper-parameters come from this run (the command line or
your optimizer factory), because lowering --lr after a divergence is exactly what a user
resumes for.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import TrainConfig, name
from ..parallel import zero
from . import checkpoint as ckpt

HYPER = ("lr", "betas", "momentum", "weight_decay", "eps")  # named in the resume line when changed
RUN_HYPER = (("clip_norm", "--clip-norm"), ("schedule", "--schedule"), ("warmup_steps", "--warmup-steps"),
             ("epochs", "--epochs"), ("max_steps", "--max-steps"), ("grad_compression", "--grad-compression"))


class OptimizerState:
    """The optimizer as a checkpoint part. optimizer.load_state_dict restores the saved
    param_groups' lr, betas, ...: this run's are put back (the state, i.e. moments and step
    counts, stays loaded), and `changed` lists 'lr 0.0001 -> 1e-05' for each that differs.
    'initial_lr' is the schedule's base rate. With a scheduler of the user's own, which sets
    the rate (and OneCycleLR the momentum) at each step, the checkpoint's values stay: they
    are where that scheduler left them. A sharded optimizer (--zero, parallel/zero.py) saves
    and loads the whole state, in the unsharded optimizer's format: any world size, either way."""

    def __init__(self, optimizer: torch.optim.Optimizer, this_runs_win: bool = True) -> None:
        self.optimizer, self.this_runs_win, self.changed = optimizer, this_runs_win, []

    def consolidate(self) -> None:
        """Collective before a save: a sharded state gathered to rank 0 (a no-op otherwise)."""
        zero.consolidate(self.optimizer)

    def state_dict(self) -> dict:
        """The whole state (rank 0's, after consolidate() where it is sharded)."""
        state = self.optimizer.state_dict()
        zero.release(self.optimizer)
        return state

    def load_state_dict(self, state: dict) -> None:
        current = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        # ZeroRedundancyOptimizer blanks the entries of other ranks' shards in what it is given
        self.optimizer.load_state_dict(dict(state, state=dict(state["state"])) if zero.is_sharded(self.optimizer)
                                       else state)
        if not self.this_runs_win:
            return
        for group, now, saved in zip(self.optimizer.param_groups, current, state["param_groups"], strict=True):
            group.update(now)
            for key in HYPER:
                base = "initial_lr" if key == "lr" and "initial_lr" in now else key
                before, after = saved.get(base), now.get(base)
                if before is not None and _plain(before) != _plain(after):
                    change = f"{key} {_show(before)} -> {_show(after)}"
                    if change not in self.changed:
                        self.changed.append(change)


class ScheduleState:
    """The built-in schedule (schedule.build_schedule; None for a constant rate) as a part: its
    position and its length (the curve the run's first job planned) come from the checkpoint,
    its warm-up and base rate from this run, and the current rate is recomputed at that
    position. `replan`: --schedule-steps given, whose length wins. After a resume, `note` says
    what became of the length when it is not simply kept ("" otherwise). A checkpoint written
    with a constant rate joins this run's schedule at the saved step."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LambdaLR | None, position: "Position",
                 replan: bool = False) -> None:
        self.scheduler, self.position, self.replan, self.note = scheduler, position, replan, ""

    def state_dict(self) -> dict | None:
        return self.scheduler.state_dict() if self.scheduler is not None else None

    def load_state_dict(self, state: dict | None) -> None:
        scheduler = self.scheduler
        if scheduler is None:
            return
        shape = [dict(f.__dict__) for f in scheduler.lr_lambdas]
        base_lrs = [group["initial_lr"] for group in scheduler.optimizer.param_groups]
        if state:
            scheduler.load_state_dict(state)  # also restores the saved lambdas' fields: this run's put back below
            saved = [f.total for f in scheduler.lr_lambdas]
            for f, fields in zip(scheduler.lr_lambdas, shape, strict=True):
                f.__dict__.update(fields)
            self._length(saved[0], shape[0]["total"])
        else:
            scheduler.last_epoch = self.position.step
        scheduler.base_lrs = base_lrs
        for group, base, f in zip(scheduler.optimizer.param_groups, base_lrs, scheduler.lr_lambdas, strict=True):
            group["lr"] = base * f(scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]

    def _length(self, saved: int, planned: int) -> None:
        """The saved length kept (this run's would jump to another curve mid-run), unless re-planned."""
        if saved == planned:
            return
        if self.replan:
            self.note = f"the schedule re-planned to {planned:,} steps (--schedule-steps), from {saved:,}"
            return
        for f in self.scheduler.lr_lambdas:
            f.total = saved
        self.note = (f"the schedule keeps its length, {saved:,} steps, as the run's first job planned it (this run "
                     f"would make it {planned:,}: to re-plan the curve, pass --schedule-steps {planned}); steps past "
                     "it train at the schedule's last rate")


class UserScheduler:
    """fit(scheduler=factory)'s scheduler as a part: torch's own state_dict, whole."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


class Position:
    """Where the run is: epochs completed (the epoch in progress, 0-based), the global
    batches of that epoch already trained, and the optimizer steps taken (fp16's skipped
    steps included). Its keys sit at the checkpoint's top level (other tools read them)."""

    KEYS = ("epoch", "batch_in_epoch", "step")

    def __init__(self) -> None:
        self.epoch = self.batch_in_epoch = self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in self.KEYS}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in self.KEYS:
            setattr(self, key, int(state[key]))

    def advance(self, batches: int) -> None:
        """One optimizer step over `batches` global batches (--accum of them)."""
        self.batch_in_epoch, self.step = self.batch_in_epoch + batches, self.step + 1

    def label(self, epochs: int, epoch_batches: int | None, global_batch: int) -> str:
        """The progress line's place: `epoch 3/10 [120/500]`, or a stream's batches and items."""
        done = self.batch_in_epoch
        where = f"{done}/{epoch_batches}" if epoch_batches else f"{done} batches, {done * global_batch:,} items"
        return f"epoch {self.epoch + 1}/{epochs} [{where}]"


class RNGState:
    """This process's generators (checkpoint.rng_state): saved for every rank, restored
    per rank when the world size is the same, else rank 0's on all."""

    def state_dict(self) -> dict:
        return ckpt.rng_state()

    def load_state_dict(self, state: dict) -> None:
        ckpt.restore_rng(state)


class ModelWeights:
    """The model as a part: the unwrapped state_dict (rank 0's: DDP keeps every rank's
    equal). A resume puts it back before DDP wraps the model (assembly.py), not through this."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state)


@dataclass
class Parts:
    """What a Trainer's checkpoint holds (their keys: checkpoint.KEYS)."""

    model: ModelWeights
    optimizer: OptimizerState
    scaler: Any
    scheduler: Any
    position: Position
    state: dict[str, Any]      # fit(state=...): each object's own state_dict
    data: Any = None           # a stream's position (streams.Stream), per rank
    compression: Any = None    # --grad-compression powersgd's state (gradients.Compression), per rank

    def register(self, manager: Any) -> None:
        """One part a line."""
        manager.add("model", self.model)
        manager.add("optimizer", self.optimizer)
        manager.add("scaler", self.scaler)
        manager.add("scheduler", self.scheduler)
        manager.add("position", self.position, spread=True)
        manager.add("rng", RNGState(), per_rank=True)
        for key, obj in self.state.items():
            manager.add(f"state/{key}", obj, per_rank="auto")
        if self.data is not None:
            manager.add("data", self.data, per_rank=True)
        if self.compression is not None:
            manager.add("grad_compression", self.compression, per_rank=True)


def changed_run_settings(saved_config: dict, config: Any) -> list[str]:
    """The loop's own hyper-parameters that this run sets differently from the checkpoint's."""
    changes = []
    for field, flag in RUN_HYPER:
        if field in saved_config and saved_config[field] != getattr(config, field):
            changes.append(f"{flag} {saved_config[field]} -> {getattr(config, field)}")
    return changes


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return f"({', '.join(_show(v) for v in value)})"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def check_contract(snapshot: dict, config: TrainConfig, train_items: int | None, ckpt_file: Path) -> None:
    """The resume contract: what must not change for the continuation to be exact (the
    world size, epochs, --max-steps, hyper-parameters and logging may). `train_items` is
    None for a stream without a length."""
    saved = snapshot.get("config", {})
    fixed = [("global_batch", snapshot["global_batch"], "an exact resume needs the same global batch"),
             ("seed", saved.get("seed", config.seed), "the rest of the epoch must be shuffled alike"),
             ("split", saved.get("split", "strided"), "each rank must see the batches it would have"),
             ("drop_last", saved.get("drop_last", False), "the epoch must hold the same batches")]
    for field, before, why in fixed:
        now = getattr(config, field)
        if before != now:
            raise ckpt.CheckpointError(f"{ckpt_file} was written with {name(field)} {before}, this run has {now}: "
                                       f"{why}; resume with {before}, or use another --ckpt-dir")
    before = snapshot.get("train_items", train_items)
    if before != train_items:
        seed_data = (f"--num-items {saved['num_items']} --eval-every {saved.get('eval_every', 0)}"
                     if "num_items" in saved else "the same training set")
        raise ckpt.CheckpointError(f"{ckpt_file} was written with {before} training items, this run has {train_items}: "
                                   f"the epoch must be the same; resume with {seed_data}, or use another --ckpt-dir")
