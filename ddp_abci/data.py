"""Data: the seed's toy dataset, batches of any structure, and the per-rank loader built on DistributedSampler."""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate, default_convert

from .config import SPLIT_CHOICES as SPLITS
from .errors import UsageError
from .launch import Launch


class LinspaceDataset(Dataset):
    """Item i is linspace(0, i, dim) as float32 (the seed's DummyDataset), for i in [start, start + num_items).

    Indexed with a list of indices it returns the whole batch as one contiguous tensor,
    equal bit for bit to the items (`batched_getitem`): build_loader then fetches each batch
    with one vectorised product instead of a Python loop and a collate copy.
    """

    batched_getitem = True

    def __init__(self, dim: int = 1000, num_items: int = 10000, start: int = 0) -> None:
        self.dim = dim
        self.start = start
        self.num_items = num_items

    def __len__(self) -> int:
        return self.num_items

    def __getitem__(self, idx: int | Sequence[int]) -> torch.Tensor:
        if isinstance(idx, (int, np.integer)):
            return torch.from_numpy(np.linspace(0, self.start + idx, self.dim).astype(np.float32))
        return torch.from_numpy(linspace_rows(np.asarray(idx, dtype=np.float64) + self.start, self.dim))


def linspace_rows(stops: np.ndarray, dim: int) -> np.ndarray:
    """Row i is np.linspace(0, stops[i], dim) as float32, bit for bit, with numpy's arithmetic
    (k * (stop / (dim - 1)) in float64, the last point set to stop exactly), written straight
    into the float32 batch. Faster than numpy's batched linspace (24 against 38 us for 25
    items of 1000, in a loop of fetches), which also switches every row of a batch holding a
    0 stop to another rounding (its gh-5437 branch), so that rows there could differ from the
    items; here each row is its item.

    numpy, not torch: between training steps each torch op here cost about 15 us (as_tensor
    of 25 ints alone: 33 us, against 3 us in a loop of fetches), and this is 0.077 ms a batch
    of 25 against 0.10 ms for the same arithmetic in torch (2 ranks, each fetch timed between
    two training steps; 2-core Intel Xeon VM, torch 2.13.0 CPU, 2026-12)."""
    rows = np.empty((len(stops), dim), dtype=np.float32)
    if dim == 1:
        rows[:] = 0  # np.linspace(0, s, 1) is [0.]
        return rows
    np.multiply((stops / (dim - 1))[:, None], np.arange(dim, dtype=np.float64), out=rows, casting="same_kind")
    rows[:, -1] = stops
    return rows


def seed_datasets(dim_in: int, num_items: int, eval_items: int) -> tuple[LinspaceDataset, LinspaceDataset | None]:
    """The seed's data: LinspaceDataset, its last `eval_items` held out (10% with --eval-every)."""
    train_items = num_items - eval_items
    eval_set = LinspaceDataset(dim_in, eval_items, start=train_items) if eval_items else None
    return LinspaceDataset(dim_in, train_items), eval_set


class BatchedView(Dataset):
    """Any map-style dataset seen through `view[list_of_indices]` -> one collated batch.

    Items may be tensors, numbers, numpy arrays, or tuples, lists and dicts of them
    (nested); torch's default_collate stacks them into a batch of the same structure.
    A dataset that already answers a list of indices with a batch (`batched_getitem =
    True`, like LinspaceDataset) is used as it is.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: Sequence[int]) -> Any:
        return default_collate([self.dataset[i] for i in indices])


def batch_fetcher(dataset: Dataset) -> Dataset:
    """What the loader indexes with each batch's list of indices."""
    return dataset if getattr(dataset, "batched_getitem", False) else BatchedView(dataset)


def check_item(item: Any, where: str = "item 0") -> None:
    """Refuse, naming the fix, an item that default_collate cannot batch the same way each time."""
    if isinstance(item, (torch.Tensor, np.ndarray, int, float, bool)):
        return
    if isinstance(item, (tuple, list)):
        for i, part in enumerate(item):
            check_item(part, f"{where}[{i}]")
        return
    if isinstance(item, dict):
        for key, part in item.items():
            check_item(part, f"{where}[{key!r}]")
        return
    raise UsageError(f"the dataset's {where} is a {type(item).__name__}; return tensors (or numbers), "
                     "or tuples, lists or dicts of them, from __getitem__")


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """The batch on `device`, same structure (tensors inside tuples, lists and dicts, nested)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


def batch_len(batch: Any) -> int:
    """Items in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else 1
    parts = batch.values() if isinstance(batch, dict) else batch
    return batch_len(next(iter(parts)))


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

    The epoch's shuffled order (DistributedSampler's: randperm seeded with seed + epoch,
    padded to a multiple of W) is cut into global batches of B = W * b; how each global
    batch is shared out is the only difference between the two splits:

    * strided (DistributedSampler's own): rank r takes positions r, r+W, r+2W, ...
    * contiguous (Accelerate's split_batches): rank r takes the r-th slice of b positions.

    Either way, after k global batches the first k*B positions are consumed on every world
    size W that divides B: skipping k batches on each rank resumes exactly.
    """

    def __init__(self, dataset: Dataset, launch: Launch, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, split: str = "strided") -> None:
        if split not in SPLITS:
            raise UsageError(f"unknown --split {split!r}; use {' or '.join(SPLITS)}")
        super().__init__(dataset, num_replicas=launch.world_size, rank=launch.rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.split = split
        self.skip_batches = 0

    def start_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """set_epoch (a new shuffle each epoch; forget it and every epoch repeats epoch 0's
        order), then skip the first `skip_batches` batches."""
        self.set_epoch(epoch)
        self.skip_batches = skip_batches

    def epoch_order(self) -> list[int]:
        """The epoch's order of all ranks' positions, as DistributedSampler makes it: a
        randperm seeded with seed + epoch (or 0..N-1), padded by repeating its start to a
        multiple of the world size so that every rank gets the same number of items."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            order = list(range(len(self.dataset)))
        while len(order) < self.total_size:
            order += order[:self.total_size - len(order)]
        return order

    def shard(self) -> list[int]:
        """This rank's positions of the epoch, in the order they are trained."""
        order, world, rank = self.epoch_order(), self.num_replicas, self.rank
        if self.split == "strided":
            return order[rank::world]
        shard, global_batch = [], self.batch_size * world
        for first in range(0, self.total_size, global_batch):
            chunk = order[first:first + global_batch]
            part = len(chunk) // world  # a shorter last batch is shared out evenly too
            shard += chunk[rank * part:(rank + 1) * part]
        return shard

    def __iter__(self) -> Iterator[list[int]]:
        indices = self.shard()
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
    split: str = "strided",
    workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = True,
) -> DataLoader:
    """Each rank's DataLoader: global_batch/world items a step from a disjoint shard.

    The sampler hands out whole batches of indices (batch_size=None tells the DataLoader
    not to batch again) and `batch_fetcher` turns each into one batch. Call
    `loader.sampler.start_epoch(e)` (or `set_epoch(e)`) before every epoch.
    """
    sampler = ShardBatchSampler(dataset, launch, per_rank_batch(global_batch, launch.world_size),
                                shuffle=shuffle, seed=seed, split=split)
    return DataLoader(
        batch_fetcher(dataset),
        batch_size=None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
    )


def iterate(loader: DataLoader) -> Iterator[Any]:
    """The loader's batches. Without workers or pinned memory, read from its sampler and
    dataset directly, as its single-process iterator does (fetch, then default_convert)
    minus its per-batch bookkeeping: 150-180 us a batch between training steps, as much as
    fetching the batch, most of it a profiler range (record_function, 134 us alone) (2-core
    AMD EPYC VM, torch 2.13.0 CPU, 2026-12; a step of the seed's job takes 2-3 ms there)."""
    if loader.num_workers or loader.pin_memory or loader.batch_size is not None:
        return iter(loader)
    return (default_convert(loader.dataset[indices]) for indices in loader.sampler)
