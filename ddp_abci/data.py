"""Data: the seed's toy dataset and the per-rank loader built on DistributedSampler."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .errors import UsageError
from .launch import Launch


class LinspaceDataset(Dataset):
    """Item i is linspace(0, i, dim) as float32 (the seed's DummyDataset), for i in [start, start + num_items).

    Indexed with a list of indices it returns the whole batch as one contiguous tensor,
    equal row by row to the items: build_loader fetches batches this way, with one
    vectorised linspace instead of a Python loop and a torch.stack copy.
    """

    def __init__(self, dim: int = 1000, num_items: int = 10000, start: int = 0) -> None:
        self.dim = dim
        self.start = start
        self.num_items = num_items

    def __len__(self) -> int:
        return self.num_items

    def __getitem__(self, idx: int | Sequence[int]) -> torch.Tensor:
        if isinstance(idx, (int, np.integer)):
            return torch.from_numpy(np.linspace(0, self.start + idx, self.dim).astype(np.float32))
        stops = np.asarray(idx, dtype=np.float64) + self.start
        return torch.from_numpy(np.linspace(0, stops, self.dim, axis=1).astype(np.float32, order="C"))


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """--bs is the global batch (the seed's split_batches=True intent); each rank takes its share."""
    if global_batch < 1 or global_batch % world_size:
        raise UsageError(
            f"global batch {global_batch} does not divide by world size {world_size}; "
            f"use a multiple of {world_size}, e.g. --bs {max(1, global_batch // world_size) * world_size}"
        )
    return global_batch // world_size


class ShardBatchSampler(DistributedSampler):
    """DistributedSampler that yields this rank's batches (lists of indices) and can begin
    an epoch part-way through, for exact resume.

    Rank r takes positions r, r+W, r+2W, ... of the epoch's shuffled order, so after k
    global batches of B the first k*B positions are consumed on every world size W that
    divides B: skipping k batches of B/W on each rank resumes exactly.
    """

    def __init__(self, dataset: Dataset, launch: Launch, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=launch.world_size, rank=launch.rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.skip_batches = 0

    def start_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """set_epoch (a new shuffle each epoch; forget it and every epoch repeats epoch 0's
        order), then skip the first `skip_batches` batches."""
        self.set_epoch(epoch)
        self.skip_batches = skip_batches

    def __iter__(self) -> Iterator[list[int]]:
        indices = list(super().__iter__())
        for first in range(self.skip_batches * self.batch_size, len(indices), self.batch_size):
            yield indices[first:first + self.batch_size]

    def __len__(self) -> int:
        return -(-self.num_samples // self.batch_size) - self.skip_batches


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
    """Each rank's DataLoader: global_batch/world items a step from a disjoint shard.

    The sampler hands out whole batches (batch_size=None tells the DataLoader not to batch
    again), so the dataset is indexed once per batch. Call `loader.sampler.start_epoch(e)`
    (or `set_epoch(e)`) before every epoch.
    """
    sampler = ShardBatchSampler(dataset, launch, per_rank_batch(global_batch, launch.world_size),
                                shuffle=shuffle, seed=seed)
    return DataLoader(
        dataset,
        batch_size=None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
    )
