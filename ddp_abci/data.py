"""Data: batches of any structure, and the per-rank loader built on DistributedSampler.
(The seed's toy dataset: autoencoder.py.)"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, default_collate, default_convert

from .config import SPLIT_CHOICES as SPLITS
from .config import name
from .errors import UsageError
from .parallel.launch import Launch


class CollateFailed(UsageError):
    """The batch's items could not be made into one batch."""


class BatchedView(Dataset):
    """Any map-style dataset seen through `view[list_of_indices]` -> one collated batch.

    Items may be tensors, numbers, numpy arrays, or tuples, lists and dicts of them
    (nested); torch's default_collate stacks them into a batch of the same structure, or
    `collate_fn` (variable-length items: pad them there). A dataset that already answers a
    list of indices with a batch (`batched_getitem = True`, like LinspaceDataset) is used
    as it is.
    """

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list], Any] | None = None) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn or default_collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: Sequence[int]) -> Any:
        items = [self.dataset[i] for i in indices]
        try:
            return self.collate_fn(items)
        except Exception as e:
            raise CollateFailed(collate_failure(self.collate_fn, items, indices, e)) from None


def collate_failure(collate_fn: Callable, items: list, indices: Sequence[int], error: BaseException) -> str:
    """One line: which collate failed on which items, and the two items that differ."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    what = getattr(collate_fn, "__name__", type(collate_fn).__name__)
    k = next((k for k in range(1, len(items)) if _shape(items[k]) != _shape(items[0])), None)
    where = f"; item {indices[0]} is {_shape(items[0])}, item {indices[k]} is {_shape(items[k])}" if k else ""
    fix = ("pass collate_fn= (e.g. one that pads the items to one length) or make the items the same size"
           if k else "fix the collate function or the items it is given")
    return (f"collating items {list(indices)[:8]}{' ...' if len(indices) > 8 else ''} with {what} failed "
            f"({type(error).__name__}: {text}){where}; {fix}")


def _shape(item: Any) -> Any:
    if isinstance(item, (torch.Tensor, np.ndarray)):
        return tuple(item.shape)
    if isinstance(item, (tuple, list)):
        return tuple(_shape(part) for part in item)
    if isinstance(item, dict):
        return {k: _shape(v) for k, v in item.items()}
    return type(item).__name__


def batch_fetcher(dataset: Dataset, collate_fn: Callable[[list], Any] | None = None, batched: bool = True) -> Dataset:
    """What the loader indexes with each batch's list of indices: the dataset itself when it
    answers a list with the batch (and `batched`), else the items one by one, collated."""
    if batched and getattr(dataset, "batched_getitem", False):
        return dataset
    return BatchedView(dataset, collate_fn)


def describe(item: Any) -> str:
    """An item's structure in a few words: 'a dict of x: tensor (3,), id: int'."""
    if isinstance(item, (torch.Tensor, np.ndarray)):
        return f"{type(item).__name__} {tuple(item.shape)}"
    if isinstance(item, Mapping):
        return "a dict of " + ", ".join(f"{k}: {describe(v)}" for k, v in list(item.items())[:6])
    if isinstance(item, (tuple, list)):
        return f"a {type(item).__name__} of " + ", ".join(describe(v) for v in item[:6])
    return type(item).__name__


def first_batch(items: list[Any], collate_fn: Callable[[list], Any] | None = None) -> Any:
    """The batch training makes of these items (for the dry run)."""
    collate = collate_fn or default_collate
    try:
        return collate(items)
    except Exception as e:
        raise CollateFailed(collate_failure(collate, items, range(len(items)), e)) from None


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """The batch on `device`, same structure (tensors inside tuples, lists and dicts, nested)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device, non_blocking) for b in batch)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


def batch_len(batch: Any) -> int:
    """Items in a batch: the first dimension of its first tensor (depth first), else the
    length of its first list (default_collate makes a list of a batch's strings)."""
    if isinstance(batch, torch.Tensor):  # the common batch, without the search
        return batch.shape[0] if batch.dim() else 1
    found = _first_tensor(batch)
    if found is not None:
        return found.shape[0] if found.dim() else 1
    parts = list(batch.values()) if isinstance(batch, Mapping) else batch
    first_list = next((p for p in parts if isinstance(p, list)), parts)
    return len(first_list)


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    parts = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    return next((t for t in map(_first_tensor, parts) if t is not None), None)


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """--bs is the global batch (the seed's split_batches=True intent); each rank takes its share."""
    if global_batch < 1 or global_batch % world_size:
        fits = max(1, global_batch // world_size) * world_size
        raise UsageError(f"{name('global_batch')} {global_batch} does not divide by world size {world_size}; "
                         f"use a multiple of {world_size}, e.g. global_batch={fits} (--bs {fits})")
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
    size W that divides B: skipping k batches on each rank resumes exactly. With drop_last
    the epoch ends after its last full global batch (nothing is padded then).
    """

    def __init__(self, dataset: Dataset, launch: Launch, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, split: str = "strided", drop_last: bool = False) -> None:
        if split not in SPLITS:
            raise UsageError(f"unknown split {split!r}; use {' or '.join(SPLITS)}")
        super().__init__(dataset, num_replicas=launch.world_size, rank=launch.rank, shuffle=shuffle, seed=seed)
        self.batch_size = batch_size
        self.split = split
        self.skip_batches = 0
        if drop_last:  # whole global batches only: a multiple of the world too, so no padding
            global_batch = batch_size * launch.world_size
            self.total_size = len(dataset) // global_batch * global_batch
            self.num_samples = self.total_size // launch.world_size

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
        return order[:self.total_size]

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
    drop_last: bool = False,
    workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = True,
    collate_fn: Callable[[list], Any] | None = None,
    batched: bool = True,
) -> DataLoader:
    """Each rank's DataLoader: global_batch/world items a step from a disjoint shard.

    The sampler hands out whole batches of indices (batch_size=None tells the DataLoader
    not to batch again) and `batch_fetcher` turns each into one batch (with `collate_fn`
    for datasets of items). Call
    `loader.sampler.start_epoch(e)` (or `set_epoch(e)`) before every epoch.
    """
    sampler = ShardBatchSampler(dataset, launch, per_rank_batch(global_batch, launch.world_size),
                                shuffle=shuffle, seed=seed, split=split, drop_last=drop_last)
    return DataLoader(
        batch_fetcher(dataset, collate_fn, batched),
        batch_size=None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and workers > 0,
        # Its own generator: DataLoader draws its workers' seeds from it when an epoch's
        # iterator starts, not from the global RNG, which an exact resume restores.
        generator=torch.Generator().manual_seed(seed + launch.rank),
    )


class EpochBatches:
    """A map-style training set's epochs for the trainer: each begins part-way through
    when resumed (the sampler skips the batches already trained)."""

    sized = True

    def __init__(self, loader: DataLoader, direct: bool = True) -> None:
        self.loader, self.sampler, self.direct = loader, loader.sampler, direct

    def __len__(self) -> int:
        """Batches (micro-batches) in a whole epoch on each rank."""
        return -(-self.sampler.num_samples // self.sampler.batch_size)

    def begin(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        self.sampler.start_epoch(epoch, skip_batches=skip)
        return iterate(self.loader, direct=self.direct)


# CPython up to 3.11.7 deadlocks a child forked while another thread creates a thread state
# (gh-112275: its interpreter lock is taken before it is reset in the child). gloo's threads
# create one to drop a collective's tensors as it ends, and the loop forks DataLoader workers
# right after collectives: 2 of 4 runs of 12 two-worker fits hung here, 0 of 3 with a pause.
FORK_SAFE = sys.version_info >= (3, 11, 8)
SETTLE_S = 0.02


def settle_before_fork(workers: int) -> None:
    """Before a DataLoader forks `workers` workers: on an affected Python, give other threads
    the GIL for a moment to finish what they started (the watchdog ends a worker that still
    never starts: exit 69 after --timeout)."""
    if workers and not FORK_SAFE:
        time.sleep(SETTLE_S)


def iterate(loader: DataLoader, direct: bool = True) -> Iterator[Any]:
    """The loader's batches. Without workers or pinned memory, read from its sampler and
    dataset directly, as its single-process iterator does (fetch, then default_convert)
    minus its per-batch bookkeeping, which costs as much as making the seed's batch, most
    of it a profiler range (docs/benchmark.md)."""
    if not direct or loader.num_workers or loader.pin_memory or loader.batch_size is not None:
        settle_before_fork(loader.num_workers)
        return iter(loader)
    return (default_convert(loader.dataset[indices]) for indices in loader.sampler)
