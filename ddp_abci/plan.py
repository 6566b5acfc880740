"""The resolved run: what a TrainConfig means on this launch, this machine and these parts,
worked out once (before the process group opens, so a bad choice costs nothing) and the one
thing a Trainer is built from. Each question has one answer here: the device, the precision,
the gradient path, each rank's batch, and what is trained on (training_set.py: a stream or not,
its items, pin memory, workers)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import COMM_CHOICES, COMPRESSION_CHOICES, TrainConfig, name
from .data import per_rank_batch
from .errors import UsageError
from .options import check_choice
from .parallel.gradients import Compression, GradientPath, gradient_path
from .parallel.launch import Launch
from .parts import Parts
from .precision import resolve_precision
from .training_set import TrainingSet, training_set


@dataclass(frozen=True)
class RunPlan:
    """What fit() resolves once, before the group opens, and the Trainer is built from."""

    config: TrainConfig
    launch: Launch
    parts: Parts           # what is trained (the plug-in's where the caller left them out)
    device: torch.device   # cuda:<local rank>, or the CPU
    precision: str         # "no" (fp32), "fp16" or "bf16": --amp auto resolved
    comm: str              # the gradient all-reduce: nccl, mpi, gloo, or "measure" (MPI or gloo, by measurement)
    per_rank_batch: int    # --bs split over the ranks
    data: TrainingSet      # what is trained on, and how it is read

    compression: Compression | None = None  # --grad-compression's hook and state, or None

    def gradients(self) -> GradientPath | None:
        """The chosen path as the loop uses it (DDP's hook, the control all-reduce); None
        while it is to be measured (parallel/comm_choice.measure_and_choose)."""
        return None if self.comm == "measure" else gradient_path(self.comm, self.compression)


def plan_run(config: TrainConfig, launch: Launch, device: torch.device, parts: Parts) -> RunPlan:
    """Each choice checked by its own function; a UsageError names the fix. `parts.train_set`:
    a Dataset, an IterableDataset or a DataLoader (training_set.py)."""
    if config.sync_batchnorm and device.type != "cuda":
        # torch 2.13's SyncBatchNorm.forward raises for CPU tensors whenever a process group
        # is open (nn/modules/batchnorm.py), even on one rank.
        raise UsageError(f"{name('sync_batchnorm')} needs GPUs: torch's SyncBatchNorm refuses CPU tensors; on the "
                         "CPU leave it off (rank 0's BatchNorm statistics are shared before each evaluation and save)")
    check_choice(name("grad_compression"), config.grad_compression, COMPRESSION_CHOICES)
    compressed = config.grad_compression != "none"
    return RunPlan(config=config, launch=launch, parts=parts, device=device,
                   precision=resolve_precision(config.amp, device),
                   comm=resolve_comm(config.comm, launch, device, compressed),
                   compression=Compression(config.grad_compression, config.powersgd_rank,
                                           config.powersgd_warmup_steps) if compressed else None,
                   per_rank_batch=per_rank_batch(config.global_batch, launch.world_size),
                   data=training_set(parts.train_set, config, parts.collate_fn, device, launch.world_size))


def resolve_comm(comm: str, launch: Launch, device: torch.device, compressed: bool = False) -> str:
    """auto: NCCL on GPUs; on the CPU, gloo, or when MPI joins the ranks too (mpirun with
    mpi4py), "measure": MPI, or gloo where it all-reduces the model's gradient clearly faster.
    Compressed gradients go through the backend's hooks: gloo or NCCL."""
    check_choice(name("comm"), comm, COMM_CHOICES)
    if compressed and comm == "mpi":
        raise UsageError(f"{name('grad_compression')} runs on torch's DDP communication hooks, which MPI's path "
                         "replaces: use comm='gloo' (--comm gloo) on the CPU, or 'nccl' (--comm nccl) on GPUs")
    if comm == "auto":
        if device.type == "cuda":
            return "nccl"
        return "measure" if launch.mpi and launch.world_size > 1 and not compressed else "gloo"
    if comm == "mpi" and (device.type != "cpu" or not launch.mpi):
        raise UsageError(f"{name('comm')} mpi needs a CPU job started by mpirun with mpi4py; use comm='auto'")
    if comm == "nccl" and device.type != "cuda":
        raise UsageError(f"{name('comm')} nccl needs CUDA GPUs; use comm='auto' on the CPU")
    if comm == "gloo" and device.type == "cuda":
        raise UsageError(f"{name('comm')}: gradients on GPUs go through NCCL here; use comm='auto'")
    return comm
