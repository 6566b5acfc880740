"""Gradient all-reduce through MPI: a DDP communication hook for CPU jobs started by mpirun.

On the CPU, gloo's all-reduce of the seed model's gradients costs more than the step's
arithmetic, and Open MPI's, through shared memory, a fraction of it (the figures and how
they were taken: docs/benchmark.md). DDP keeps doing everything else (bucketing, overlap
with backward, the initial broadcast on gloo); only each bucket's all-reduce goes through
mpi4py, marked for the watchdog, since an MPI collective has no timeout of its own.
"""
# No `from __future__ import annotations` here: DDP checks the hook's annotations as objects.
import contextlib

import numpy as np
import torch
import torch.distributed as dist

from ..errors import UsageError


class HookState:
    """What the hook needs: the communicator, and the watchdog's marker for its wait."""

    def __init__(self, comm, watchdog=None) -> None:
        self.comm, self.size = comm, comm.Get_size()
        self.waiting = (lambda: watchdog.waiting("gradient all-reduce")) if watchdog else contextlib.nullcontext


def mpi_allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average one gradient bucket over all ranks, in place, as DDP's default hook does
    (divide by the world size, sum). DDP hands buckets to the hook in the same order on
    every rank, so the blocking Allreduce calls pair up."""
    from mpi4py import MPI

    buffer = bucket.buffer()
    buffer.div_(state.size)
    with state.waiting():
        state.comm.Allreduce(MPI.IN_PLACE, buffer.numpy(), op=MPI.SUM)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def mpi_max_vector(values: list[int]) -> list[int]:
    """Element-wise MAX of a few ints over all ranks, through MPI: the trainer's stop
    agreement, far cheaper than gloo's (docs/benchmark.md). mpi4py's lower-case allreduce
    would compare Python lists as wholes."""
    from mpi4py import MPI

    buffer = np.asarray(values, dtype=np.int64)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer, op=MPI.MAX)
    return buffer.tolist()


def mpi_sum_vector(values: list[float], comm=None) -> list[float]:
    """Element-wise sum of a few float64 numbers over all ranks of `comm` (COMM_WORLD when
    None), through MPI: the epoch's loss report (gloo's all-reduce of its 4 numbers held each
    epoch's end 4.4 ms here, docs/benchmark.md)."""
    from mpi4py import MPI

    buffer = np.asarray(values, dtype=np.float64)
    (comm or MPI.COMM_WORLD).Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
    return buffer.tolist()


def register_mpi_hook(ddp_model: torch.nn.parallel.DistributedDataParallel, watchdog=None) -> None:
    """Route ddp_model's gradient all-reduce through MPI.COMM_WORLD."""
    from mpi4py import MPI

    for p in ddp_model.parameters():
        if p.dtype not in (torch.float32, torch.float64):
            raise UsageError(f"comm (--comm) mpi all-reduces float32/float64 gradients only, not {p.dtype}; "
                             "use comm='gloo' (--comm gloo)")
    # A communicator of its own (Dup is collective: every rank registers at the same point).
    # MPI pairs a communicator's collectives in call order, so a rank that skipped a control
    # collective on COMM_WORLD would otherwise pair it with a gradient all-reduce; apart, it waits,
    # and the watchdog names the mismatch.
    ddp_model.register_comm_hook(HookState(MPI.COMM_WORLD.Dup(), watchdog), mpi_allreduce_hook)
