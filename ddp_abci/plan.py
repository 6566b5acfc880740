"""The resolved run: what a TrainConfig means on this launch and this machine, worked out
once (before the process group opens, so a bad choice costs nothing) and passed in."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .comm_hook import resolve_comm
from .config import TrainConfig
from .data import per_rank_batch
from .launch import Launch
from .precision import resolve_precision


@dataclass(frozen=True)
class RunPlan:
    device: torch.device   # cuda:<local rank>, or the CPU
    precision: str         # "no" (fp32), "fp16" or "bf16": --amp auto resolved
    comm: str              # the gradient all-reduce: nccl, mpi or gloo
    per_rank_batch: int    # --bs split over the ranks


def plan_run(config: TrainConfig, launch: Launch, device: torch.device) -> RunPlan:
    """Each choice checked by its own module; a UsageError names the fix."""
    return RunPlan(device=device, precision=resolve_precision(config.amp, device),
                   comm=resolve_comm(config.comm, launch, device),
                   per_rank_batch=per_rank_batch(config.global_batch, launch.world_size))
