"""Small distributed helpers: Accelerate's main-process and gather/reduce calls, in raw form.

    accelerator.is_main_process        launch.is_main
    accelerator.is_local_main_process  launch.is_local_main
    accelerator.print                  print_per_node(launch, ...): once per node, as Accelerate does;
                                       print_main(launch, ...): once per job
    accelerator.wait_for_everyone()    wait_for_everyone()
    accelerator.main_process_first()   main_process_first(launch)
    accelerator.gather(t)              gather(t)
    accelerator.gather_for_metrics(t)  gather_for_metrics(t, indices)
    accelerator.reduce(t, "mean")      reduce(t, "mean")
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from ..errors import RunError, UsageError, one_line
from .launch import Launch

T = TypeVar("T")


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def print_main(launch: Launch, *args: object) -> None:
    """Print on rank 0 only: every rank printing repeats each line world-size times."""
    if launch.is_main:
        print(*args, flush=True)


def print_per_node(launch: Launch, *args: object) -> None:
    """Print on each node's first rank (local rank 0): once per node, what accelerator.print
    does (its docstring: "only print once per server"); print_main prints once per job."""
    if launch.is_local_main:
        print(*args, flush=True)


def wait_for_everyone() -> None:
    """A barrier: no rank passes until all have reached it."""
    if _world() > 1:
        dist.barrier()


@contextlib.contextmanager
def main_process_first(launch: Launch) -> Iterator[None]:
    """Rank 0 runs the block first (say, to download or cache data); the others run it after."""
    if not launch.is_main:
        wait_for_everyone()
    try:
        yield
    finally:
        if launch.is_main:
            wait_for_everyone()


def broadcast_object(launch: Launch, value: object) -> object:
    """Rank 0's `value` (any picklable object) on every rank."""
    box = [value]
    if _world() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def broadcast_error(launch: Launch, error: str | None, kind: type[RunError] = UsageError) -> None:
    """Raise rank 0's verdict on every rank, so that all stop together with one message."""
    error = broadcast_object(launch, error)
    if error:
        raise kind(error)


def all_ranks(obj: object) -> list:
    """Every rank's `obj` (any picklable value), in rank order, on every rank."""
    if _world() == 1:
        return [obj]
    out = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def gather_to_main(obj: object) -> list | None:
    """Every rank's `obj`, in rank order, on rank 0 (None elsewhere): what only rank 0 writes."""
    if _world() == 1:
        return [obj]
    out = [None] * _world() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def rank0_decides(launch: Launch, decide: Callable[[], T], kind: type[RunError] = UsageError) -> T:
    """Collective: rank 0 runs `decide()`; every rank gets its result, or raises `kind` with
    its failure's one line (the others are waiting for the verdict, so rank 0 must answer
    whatever happens). The one form of "rank 0 decides, every rank obeys"."""
    outcome: tuple[Any, str | None] = (None, None)
    if launch.is_main:
        try:
            outcome = (decide(), None)
        except RunError as e:
            outcome = (None, str(e))
        except Exception as e:
            outcome = (None, f"rank 0 failed: {type(e).__name__}: {one_line(e)}")
    value, error = broadcast_object(launch, outcome)
    if error:
        raise kind(error)
    return value


def raise_if_any_rank_failed(error: str | None) -> None:
    """Each rank's own verdict (None: fine), shared: if any rank failed, all raise the
    first failing rank's message together, instead of the others waiting in a collective."""
    first = next((e for e in all_ranks(error) if e), None)
    if first:
        raise UsageError(first)


def check_replicas_agree(model: torch.nn.Module, launch: Launch) -> None:
    """Every rank must end with the same weights and buffers (BatchNorm's statistics); DDP
    guarantees the weights, the trainer's broadcast before each save the buffers, and this
    proves both once per run: a float64 checksum, compared by MIN and MAX."""
    if _world() == 1:
        return
    tensors = [*model.parameters(), *model.buffers()]
    checksum = sum(t.detach().double().sum() for t in tensors).reshape(1)
    low, high = checksum.clone(), checksum.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if low.item() != high.item():
        raise RuntimeError(f"replicas diverged: weight and buffer checksums range {low.item()!r} to {high.item()!r}")
    print_main(launch, f"replicas agree: identical weights on all {_world()} ranks (checksum {high.item():.6f})")


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank. DDP broadcasts them
    before each training forward, and each rank's own batch then moves them again: after
    the last step the ranks differ, so evaluation and checkpoints take rank 0's."""
    if _world() > 1:
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's tensor, concatenated along dim 0 in rank order (same shape on all ranks)."""
    if _world() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(_world())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def gather_for_metrics(values: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather per-sample values with their dataset indices and keep each index once.

    DistributedSampler pads the last shard by repeating items, so a plain gather counts
    those twice; carrying the indices makes the count exact (N items count N), without
    assuming how the sampler padded. Returns (values, indices) sorted by index.
    """
    all_values, all_indices = gather(values), gather(indices.to(values.device))
    unique, first = _first_occurrence(all_indices)
    return all_values[first], unique


def _first_occurrence(indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.argsort(indices, stable=True)
    sorted_idx = indices[order]
    keep = torch.ones_like(sorted_idx, dtype=torch.bool)
    keep[1:] = sorted_idx[1:] != sorted_idx[:-1]
    return sorted_idx[keep], order[keep]


def reduce(tensor: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Sum or mean of a tensor over all ranks, returned on every rank (the input is not changed)."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', not {reduction!r}")
    out = tensor.clone()
    if _world() > 1:
        dist.all_reduce(out)
    return out / _world() if reduction == "mean" else out
