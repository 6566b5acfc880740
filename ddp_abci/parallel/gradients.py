"""The paths the gradient all-reduce can take, one object each: what DDP is given (a
communication hook, or none), and how the trainer's small control all-reduce goes the same
way. plan.resolve_comm chooses the path by name; the loop only asks the object.

    nccl   GPUs: DDP's own all-reduce over NCCL
    gloo   the CPU without MPI: DDP's own all-reduce over gloo
    mpi    the CPU under mpirun with mpi4py: each bucket through MPI (mpi_hook.py)
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .mpi_hook import mpi_max_vector, register_mpi_hook


class GradientPath:
    """DDP's own all-reduce through the process group's backend (gloo or NCCL)."""

    # Whether the path marks its own waits for the watchdog (the MPI hook does, per bucket);
    # otherwise the syncing backward is timed as a whole.
    marks_its_waits = False

    def __init__(self, name: str) -> None:
        self.name = name

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        """Give DDP this path's hook (nothing: DDP's own all-reduce)."""

    def max_vector(self, values: list[int], device: torch.device) -> list[int]:
        """Element-wise MAX of a few ints over all ranks (the stop agreement)."""
        flags = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [int(v) for v in flags.tolist()]

    def __repr__(self) -> str:
        return f"GradientPath({self.name!r})"


class MPIGradients(GradientPath):
    """Each gradient bucket through MPI: on the CPU, Open MPI's all-reduce through shared
    memory costs a fraction of gloo's (docs/benchmark.md)."""

    marks_its_waits = True

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        register_mpi_hook(ddp, watchdog)

    def max_vector(self, values: list[int], device: torch.device) -> list[int]:
        return mpi_max_vector(values)


def gradient_path(name: str) -> GradientPath:
    """The path object for resolve_comm's choice."""
    return MPIGradients(name) if name == "mpi" else GradientPath(name)
