"""--zero: the optimizer's state sharded over the ranks (ZeRO stage 1), with torch's own
torch.distributed.optim.ZeroRedundancyOptimizer: what Accelerate's DeepSpeed plugin does with
`zero_stage=1`, in raw form.

With plain DDP every rank holds the weights (4 bytes a parameter in fp32), their gradients (4)
and Adam's two moments (8). ZeRO-1 keeps the first two whole (DDP still all-reduces every
gradient) and gives each rank the moments of 1/world of the parameters: it steps its own shard,
then broadcasts the updated parameters to the others. So a rank holds 8 + 8/world bytes a
parameter, and each step moves the parameters once more over the network.

The user's optimizer is kept as it is: built once over the parameters (no state yet: Adam's
comes at its first step), its class, defaults and parameter groups (a decay/no-decay split)
are handed to ZeroRedundancyOptimizer, which builds one of the same class over each rank's
shard. A checkpoint holds the whole state, as without --zero: before a save every rank sends
its shard to rank 0 (consolidate, a collective), so a checkpoint resumes at any world size, with
or without --zero, and one made without it resumes with it.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


def shard(optimizer: torch.optim.Optimizer) -> ZeroRedundancyOptimizer:
    """The same optimizer (class, defaults, parameter groups) over the default process group,
    each rank holding the state of its shard of the parameters. Call on every rank, after the
    model is on its device. Raises: UsageError-free: make_optimizer has checked the groups."""
    groups = [{k: v for k, v in group.items() if k != "initial_lr"} for group in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **optimizer.defaults)


def is_sharded(optimizer: Any) -> bool:
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def consolidate(optimizer: Any) -> None:
    """Collective where the state is sharded (a no-op otherwise): every rank's shard sent to rank 0,
    whose state_dict() then holds the whole state, in the format of the unsharded optimizer."""
    if is_sharded(optimizer):
        optimizer.consolidate_state_dict(to=0)


def release(optimizer: Any) -> None:
    """Rank 0's consolidated copy dropped once the checkpoint is serialised: torch 2.13 keeps it
    (`_all_state_dicts`) until the next consolidation, a whole state's memory held for nothing."""
    if is_sharded(optimizer):
        optimizer._all_state_dicts = []


def state_bytes(optimizer: Any) -> int:
    """The bytes of optimizer state this rank holds (its shard's, with --zero)."""
    local = optimizer.optim if is_sharded(optimizer) else optimizer
    return sum(v.numel() * v.element_size() for state in local.state.values() for v in state.values()
               if torch.is_tensor(v))
