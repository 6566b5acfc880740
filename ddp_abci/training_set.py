"""What a run trains on, worked out once: the dataset, whether it is a stream, how many items an
epoch holds, how it is batched and loaded. fit()'s `train_set` may be a map-style Dataset, an
IterableDataset (a stream), or a DataLoader over either (torch's, or torchdata's
StatefulDataLoader), which is taken apart here as Accelerate's prepare() does:

    kept       its dataset, collate_fn, num_workers, pin_memory, drop_last, persistent_workers,
               and its batch size (checked against global_batch, --bs: the global batch, or
               each rank's)
    replaced   its sampler: DistributedSampler's shuffle (when its own was a RandomSampler) or
               order (a SequentialSampler), each rank taking its share; its generator (seeded
               from seed + rank, for an exact resume)
    refused    a sampler or batch_sampler of its own (a weighted or bucketing sampler): it cannot
               be shared out by rank without changing what it draws
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, default_collate

from .config import TrainConfig, name
from .errors import UsageError
from .streams import has_length, is_stream

# Where the samplers a DataLoader makes itself live: torch's, and torchdata's StatefulDataLoader's.
SAMPLER_MODULES = ("torch.utils.data.sampler", "torchdata.stateful_dataloader.sampler")


@dataclass(frozen=True)
class TrainingSet:
    """The training set as the run reads it: training_set() makes it from what fit() was given."""

    dataset: Any                    # a map-style Dataset or an IterableDataset
    collate_fn: Callable | None     # makes a list of items into a batch (None: torch's default_collate)
    stream: bool                    # an IterableDataset: read in order, its position saved
    items: int | None               # items an epoch holds (a map-style set); None for a stream
    workers: int                    # DataLoader workers per rank
    pin_memory: bool
    drop_last: bool
    shuffle: bool                   # a map-style set is reshuffled each epoch
    persistent_workers: bool
    given: str                      # what the user passed: "a dataset", "a DataLoader", ...


def training_set(train_set: Any, config: TrainConfig, collate_fn: Callable | None, device: torch.device,
                 world_size: int) -> TrainingSet:
    """The training set as the run reads it; a DataLoader's settings checked against config's."""
    pin = device.type == "cuda" if config.pin_memory is None else config.pin_memory
    if not isinstance(train_set, DataLoader):
        stream = is_stream(train_set)
        return TrainingSet(train_set, collate_fn, stream, None if stream or not has_length(train_set) else len(
            train_set), config.workers, pin, config.drop_last, True, config.persistent_workers, "a dataset")
    return _from_loader(train_set, config, collate_fn, pin, world_size)


def _from_loader(loader: DataLoader, config: TrainConfig, collate_fn: Callable | None, pin: bool,
                 world_size: int) -> TrainingSet:
    given = f"a {type(loader).__name__}"
    stream = is_stream(loader.dataset)
    if loader.batch_size is None:
        raise UsageError(f"the training set is {given} with batch_size=None (it batches nothing, or its "
                         "batch_sampler does): give it a batch_size, or pass its dataset")
    _check_batch_size(loader.batch_size, config.global_batch, world_size, given)
    shuffle = _shuffle_of(loader, given) if not stream else False
    if collate_fn is not None and loader.collate_fn not in (default_collate, collate_fn):
        raise UsageError(f"collate_fn= and the training set's {given} collate_fn differ: pass one of them")
    own_collate = None if loader.collate_fn is default_collate else loader.collate_fn
    workers = _one_of("workers", config.workers, loader.num_workers, 0, given)
    pin = _one_of("pin_memory", config.pin_memory, loader.pin_memory, None, given) if config.pin_memory is not None \
        else loader.pin_memory or pin
    drop_last = _one_of("drop_last", config.drop_last, loader.drop_last, False, given)
    return TrainingSet(loader.dataset, collate_fn or own_collate, stream,
                       None if stream or not has_length(loader.dataset) else len(loader.dataset), workers, pin,
                       drop_last, shuffle, loader.persistent_workers or config.persistent_workers, given)


def _check_batch_size(batch: int, global_batch: int, world_size: int, given: str) -> None:
    """A loader's batch size is the global batch (split over the ranks, as --bs is) or each
    rank's (Accelerate's default, split_batches=False): global_batch tells which."""
    if batch in (global_batch, global_batch // world_size) and global_batch % world_size == 0:
        return
    raise UsageError(f"the training set is {given} of batch_size={batch}, and {name('global_batch')} is "
                     f"{global_batch} on {world_size} rank(s): set global_batch={batch} (its batch split over the "
                     f"ranks) or {batch * world_size} ({batch} per rank)")


def _shuffle_of(loader: DataLoader, given: str) -> bool:
    """Whether the loader shuffles: a RandomSampler (without replacement) or a SequentialSampler
    inside a BatchSampler, the ones torch's DataLoader or torchdata's StatefulDataLoader make."""
    batches, sampler = loader.batch_sampler, getattr(loader.batch_sampler, "sampler", None)
    if _made_by_loader(batches) != "BatchSampler" or _made_by_loader(sampler) not in ("RandomSampler",
                                                                                     "SequentialSampler"):
        own = sampler if _made_by_loader(batches) == "BatchSampler" else batches
        raise UsageError(f"the training set is {given} with a {type(own).__name__} of its own: it cannot be shared "
                         "out by rank without changing what it draws; pass its dataset (with collate_fn=), or split "
                         "it by rank yourself and pass a stream wrapped in ddp_abci.AlreadySplit")
    shuffles = _made_by_loader(sampler) == "RandomSampler"
    if shuffles and (getattr(sampler, "replacement", False) or getattr(sampler, "_num_samples", None) is not None):
        raise UsageError(f"the training set is {given} whose RandomSampler draws with replacement or a num_samples "
                         "of its own: pass its dataset, shuffled without replacement by DistributedSampler here")
    return shuffles


def _made_by_loader(sampler: Any) -> str | None:
    """The sampler's class name where it is one a DataLoader makes itself, else None."""
    kind = type(sampler)
    return kind.__name__ if kind.__module__ in SAMPLER_MODULES else None


def _one_of(field: str, ours: Any, theirs: Any, default: Any, given: str) -> Any:
    """The loader's setting, unless TrainConfig's was set to something else as well."""
    if ours not in (default, theirs):
        raise UsageError(f"{name(field)} is {ours!r} and the training set's {given} has {theirs!r}: set one of them")
    return theirs
