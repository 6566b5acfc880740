"""What a checkpoint holds for the Trainer, and how a resume puts it back.

On resume the run's position, weights, optimizer state (Adam's moments and step counts),
GradScaler, schedule position and RNG come from the checkpoint; the hyper-parameters come
from this run (the command line or your optimizer factory), because lowering --lr after a
divergence is exactly what a user resumes for. Each one that changed is named.
"""
from __future__ import annotations

from typing import Any

import torch

from . import checkpoint as ckpt
from .model import unwrap

HYPER = ("lr", "betas", "momentum", "weight_decay", "eps")  # named in the resume line when changed
RUN_HYPER = (("clip_norm", "--clip-norm"), ("schedule", "--schedule"), ("warmup_steps", "--warmup-steps"),
             ("epochs", "--epochs"), ("max_steps", "--max-steps"))


def make_snapshot(trainer: Any, rng_per_rank: list[dict]) -> dict[str, Any]:
    """The checkpoint's keys (documented in checkpoint.py; other tools read them)."""
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
        "config": trainer.config.to_dict(),
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
