"""What a checkpoint holds for the Trainer, what a resume must keep, and how it puts it back.

On resume the run's position, weights, optimizer state (Adam's moments and step counts),
GradScaler, schedule position and RNG come from the checkpoint; the hyper-parameters come
from this run (the command line or your optimizer factory), because lowering --lr after a
divergence is exactly what a user resumes for. Each one that changed is named.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from . import checkpoint as ckpt
from .config import TrainConfig, name
from .model import unwrap

HYPER = ("lr", "betas", "momentum", "weight_decay", "eps")  # named in the resume line when changed
RUN_HYPER = (("clip_norm", "--clip-norm"), ("schedule", "--schedule"), ("warmup_steps", "--warmup-steps"),
             ("epochs", "--epochs"), ("max_steps", "--max-steps"))


def make_snapshot(trainer: Any, rng_per_rank: list[dict]) -> dict[str, Any]:
    """The checkpoint's keys (documented in checkpoint.py; other tools read them). `config`
    holds TrainConfig's fields and, for the seed's job, its own (num_items, dim_in, ...)."""
    return {
        "format": ckpt.FORMAT,
        "model": unwrap(trainer.model).state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "epoch": trainer.epoch,
        "batch_in_epoch": trainer.batch_in_epoch,
        "step": trainer.step,
        "global_batch": trainer.config.global_batch,
        "train_items": len(trainer.train_set),
        "world_size": trainer.launch.world_size,
        "config": {**trainer.config.to_dict(), **trainer.job_settings},
        "rng": rng_per_rank[0],
        "rng_per_rank": rng_per_rank,
    }


def load_optimizer_keeping_hyperparameters(optimizer: torch.optim.Optimizer, state: dict) -> list[str]:
    """optimizer.load_state_dict restores the saved param_groups' lr, betas, ...: put this
    run's back (the state, i.e. moments and step counts, stays loaded). Returns 'lr 0.0001 -> 1e-05'
    for each hyper-parameter that differs. 'initial_lr' is the schedule's base rate."""
    current = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    changed = []
    for group, now, saved in zip(optimizer.param_groups, current, state["param_groups"]):
        group.update(now)
        for key in HYPER:
            base = "initial_lr" if key == "lr" and "initial_lr" in now else key
            before, after = saved.get(base), now.get(base)
            if before is not None and _plain(before) != _plain(after):
                change = f"{key} {_show(before)} -> {_show(after)}"
                if change not in changed:
                    changed.append(change)
    return changed


def load_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR | None, state: dict | None, step: int) -> None:
    """The schedule's position comes from the checkpoint, its shape (base rate, warm-up,
    length) from this run; the current rate is recomputed at that position."""
    if scheduler is None:
        return
    shape = [dict(f.__dict__) for f in scheduler.lr_lambdas]
    base_lrs = [group["initial_lr"] for group in scheduler.optimizer.param_groups]
    if state:
        scheduler.load_state_dict(state)  # also restores the saved lambdas' fields: undone below
        for f, fields in zip(scheduler.lr_lambdas, shape):
            f.__dict__.update(fields)
    else:
        scheduler.last_epoch = step  # the checkpoint had a constant rate: join the schedule at this step
    scheduler.base_lrs = base_lrs
    for group, base, f in zip(scheduler.optimizer.param_groups, base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * f(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


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


def check_contract(snapshot: dict, config: TrainConfig, train_items: int, ckpt_file: Path) -> None:
    """The resume contract: what must not change for the continuation to be exact (the
    world size, epochs, --max-steps, hyper-parameters and logging may)."""
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
