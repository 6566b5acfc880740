"""The paths the gradient all-reduce can take, one object each: what DDP is given (a
communication hook, or none), and how the trainer's small control all-reduce goes the same
way. plan.resolve_comm chooses the path by name, or leaves the CPU's choice between MPI and
gloo to measure_and_choose, once the model's size is known; the loop only asks the object.

    nccl   GPUs: DDP's own all-reduce over NCCL
    gloo   the CPU: torch's allreduce hook over gloo, timed
    mpi    the CPU under mpirun with mpi4py: each bucket through MPI (mpi_hook.py)
"""
# No `from __future__ import annotations` here: DDP checks a hook's annotations as objects.
import math
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from .mpi_hook import mpi_max_vector, register_mpi_hook


class GradientPath:
    """DDP's own all-reduce through the process group's backend (gloo or NCCL)."""

    # Whether the path marks its own waits for the watchdog (the MPI hook does, per bucket);
    # otherwise the syncing backward is timed as a whole.
    marks_its_waits = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.measured_ms: dict[str, float] | None = None  # what --comm auto chose it on (measure_and_choose)

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        """Give DDP this path's hook (nothing: DDP's own all-reduce)."""

    def ready_at(self) -> float:
        """When the last gradient bucket of the latest backward was ready (0: not known)."""
        return 0.0

    def max_vector(self, values: list[int], device: torch.device) -> list[int]:
        """Element-wise MAX of a few ints over all ranks (the stop agreement)."""
        flags = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [int(v) for v in flags.tolist()]

    def __repr__(self) -> str:
        return f"GradientPath({self.name!r})"


class GlooGradients(GradientPath):
    """DDP's all-reduce over gloo, through torch's own allreduce hook (the same division and
    sum as DDP's built-in one), which notes when the last bucket became ready: backward's
    compute ends there, and the rest of backward is the wait for the all-reduce (the straggler
    clock counts only the compute)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.last_ready = 0.0

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        ddp.register_comm_hook(self, timed_allreduce_hook)

    def ready_at(self) -> float:
        return self.last_ready


def timed_allreduce_hook(state: GlooGradients, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.last_ready = time.monotonic()
    return default_hooks.allreduce_hook(None, bucket)


class MPIGradients(GradientPath):
    """Each gradient bucket through MPI: on the CPU, Open MPI's all-reduce through shared
    memory costs a fraction of gloo's (docs/benchmark.md)."""

    marks_its_waits = True

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        register_mpi_hook(ddp, watchdog)

    def max_vector(self, values: list[int], device: torch.device) -> list[int]:
        return mpi_max_vector(values)


def gradient_path(name: str) -> "GradientPath":
    """The path object for resolve_comm's choice."""
    return {"mpi": MPIGradients, "gloo": GlooGradients}.get(name, GradientPath)(name)


# DDP's largest gradient bucket (bucket_cap_mb's default): the biggest all-reduce a step makes.
BUCKET_BYTES = 25 * 2**20
GLOO_MARGIN = 0.8  # gloo is taken where it all-reduces in under 0.8 of MPI's time


def measure_and_choose(gradient_bytes: int, watchdog: object = None) -> tuple[GradientPath, str]:
    """--comm auto on the CPU under mpirun: MPI's all-reduce, or gloo's where it is clearly faster
    for this model's gradient over these ranks' links, and the line that says so. Neither
    wins everywhere (measured, docs/benchmark.md): on one host Open MPI's shared memory beats
    gloo's loopback TCP; across a 100 Mbit/s link gloo's all-reduce took half Open MPI's
    time. Every rank takes the same verdict: the times' maximum over the ranks."""
    from mpi4py import MPI  # noqa: PLC0415  (only under mpirun: importing it starts MPI)

    nbytes = max(4, min(gradient_bytes, BUCKET_BYTES))
    buffer = torch.zeros(nbytes // 4)
    comm = MPI.COMM_WORLD
    timed = watchdog.waiting("measuring the gradient all-reduce, MPI against gloo") if watchdog else nullcontext()
    with timed:
        times = np.array([_best_of(lambda: comm.Allreduce(MPI.IN_PLACE, buffer.numpy(), op=MPI.SUM)),
                          _best_of(lambda: dist.all_reduce(buffer))])
        comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    # gloo only when clearly faster: near a tie, a measurement's noise would pick either path,
    # and two runs of one seed would then not end bit for bit alike (the paths sum differently).
    name = "gloo" if times[1] < GLOO_MARGIN * times[0] else "mpi"
    chosen = gradient_path(name)
    chosen.measured_ms = {"mpi": float(times[0] * 1e3), "gloo": float(times[1] * 1e3)}
    return chosen, (f"gradients: an all-reduce of {nbytes / 1e6:.2f} MB took {times[0] * 1e3:.2f} ms "
                                 f"through MPI, {times[1] * 1e3:.2f} ms through gloo: via {name} (--comm auto)")


def _best_of(call, tries: int = 3) -> float:
    """The fastest of `tries` timed calls, after one untimed (connections, buffers)."""
    call()
    best = math.inf
    for _ in range(tries):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best
