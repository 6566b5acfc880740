"""Data: the seed's toy dataset and the per-rank loader built on DistributedSampler."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .errors import UsageError
from .launch import Launch


class LinspaceDataset(Dataset):
    """Item i is linspace(0, i, dim) as float32 (the seed's DummyDataset), for i in [start, stop)."""

    def __init__(self, dim: int = 1000, num_items: int = 10000, start: int = 0) -> None:
        self.dim = dim
        self.start = start
        self.num_items = num_items

    def __len__(self) -> int:
        return self.num_items

    def __getitem__(self, idx: int) -> torch.Tensor:
        return torch.from_numpy(np.linspace(0, self.start + idx, self.dim).astype(np.float32))

    def __getitems__(self, indices: Sequence[int]) -> torch.Tensor:
        """A whole batch as one contiguous tensor, equal row by row to __getitem__.

        The DataLoader calls this instead of __getitem__ per index; one vectorised
        linspace replaces a Python loop and a torch.stack copy.
        """
        stops = np.asarray(indices, dtype=np.float64) + self.start
        return torch.from_numpy(np.linspace(0, stops, self.dim, axis=1).astype(np.float32, order="C"))


def as_batch(batch: torch.Tensor) -> torch.Tensor:
    """collate_fn for __getitems__: the batch is already one tensor."""
    return batch


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """--bs is the global batch (the seed's split_batches=True intent); each rank takes its share."""
    if global_batch < 1 or global_batch % world_size:
        raise UsageError(
            f"global batch {global_batch} does not divide by world size {world_size}; "
            f"use a multiple of {world_size}, e.g. --bs {max(1, global_batch // world_size) * world_size}"
        )
    return global_batch // world_size


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can begin an epoch part-way through, for exact resume.

    Rank r takes positions r, r+W, r+2W, ... of the epoch's shuffled order, so after k
    global batches of B the first k*B positions are consumed on every world size W
    that divides B: skipping k*B/W of this rank's share resumes exactly.
    """

    def __init__(self, dataset: Dataset, launch: Launch, *, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=launch.world_size, rank=launch.rank, shuffle=shuffle, seed=seed)
        self.skip = 0

    def start_epoch(self, epoch: int, skip: int = 0) -> None:
        """set_epoch (a new shuffle each epoch), then skip this rank's first `skip` samples."""
        self.set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        return iter(list(super().__iter__())[self.skip:])

    def __len__(self) -> int:
        return self.num_samples - self.skip


def build_loader(
    dataset: Dataset,
    launch: Launch,
    global_batch: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = True,
) -> DataLoader:
    """Each rank's DataLoader: bs/world per step, a disjoint shard through ResumableSampler.

    Call `loader.sampler.start_epoch(e)` before every epoch, or every epoch repeats epoch 0's order.
    """
    batch = per_rank_batch(global_batch, launch.world_size)
    sampler = ResumableSampler(dataset, launch, shuffle=shuffle, seed=seed)
    return DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        collate_fn=as_batch if hasattr(dataset, "__getitems__") else None,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
    )
