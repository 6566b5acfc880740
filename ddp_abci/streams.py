"""Streamed data: any IterableDataset, each rank reading its own share, resumed at the exact item.

Sharing out. A dataset with `shard(index, count) -> dataset` is asked for its own share,
so that nothing is read twice (ShardedFiles deals its files that way); rank r of W asks for
shard(r, W), and its DataLoader worker k of K asks that share for shard(k, K). Without it,
every rank reads the whole stream and keeps the items i with i % W == r, and its workers
split those the same way (as Accelerate's IterableDatasetShard does): no item trained twice
in an epoch, none skipped. A dataset with `set_epoch(epoch)` hears each epoch first.

Batches. Each worker batches its own items (`collate_fn`, default torch's) and yields only
whole batches: a short last one is dropped and counted. DataLoader takes batches from its
workers in turn, so a rank's order is fixed by the workers' own orders.

Position. With every batch comes where its worker stands: items read from its source,
batches made, and the source's state_dict() when it has one. The trainer keeps the position
after the last batch it trained (not the ones read ahead), and a checkpoint holds every
rank's. A resume then loads each source's state (reading nothing twice) or, without
state_dict(), replays it: reads and drops the items already read, saying how many and how
long. The workers take up their turns where they left them. A resume mid-epoch needs the
same world size and worker count (refused in one line otherwise); at an epoch's end any will do.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from .errors import UsageError


def is_stream(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset)


def has_length(dataset: Any) -> bool:
    try:
        len(dataset)
    except TypeError:
        return False
    return True


def share(dataset: Any, index: int, count: int) -> tuple[Any, bool]:
    """(the share, whether the dataset made it itself): index of count equal shares."""
    if count == 1:
        return dataset, True
    if callable(getattr(dataset, "shard", None)):
        return dataset.shard(index, count), True
    return dataset, False


class RankShare(IterableDataset):
    """One rank's share of a stream, split among its DataLoader workers, as (batch, where) pairs."""

    def __init__(self, dataset: Any, rank: int, world_size: int, batch_size: int, collate_fn: Callable | None,
                 epoch: int, resume: dict | None) -> None:
        self.dataset, self.rank, self.world_size, self.batch_size = dataset, rank, world_size, batch_size
        self.collate_fn, self.epoch = collate_fn or default_collate, epoch
        self.resume = resume or {}  # this rank's saved position (Stream.position), for this epoch

    def __iter__(self) -> Iterator[tuple[Any, dict]]:
        info = get_worker_info()
        own, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker = (own + self.resume.get("turn", 0)) % workers  # the worker next in turn goes first
        saved = self.resume.get("workers", {}).get(worker)
        source, items = self._items(worker, workers, saved)
        read, made = (saved["read"], saved["made"]) if saved else (0, 0)
        replayed, began = 0, time.monotonic()
        if saved and "state" not in saved:  # no state_dict(): read the saved position's items again, dropped
            replayed = sum(1 for _ in itertools.islice(items, read))
        replay_s, first = time.monotonic() - began, saved is not None
        while True:
            batch = list(itertools.islice(items, self.batch_size))
            read += len(batch)
            if len(batch) < self.batch_size:
                if batch:  # a short last batch: not trained, counted as dropped
                    yield None, {"worker": worker, "dropped": len(batch)}
                return
            made += 1
            where = {"worker": worker, "read": read, "made": made}
            if callable(getattr(source, "state_dict", None)):
                where["state"] = source.state_dict()
            if first:
                where.update(replayed=replayed, replay_s=replay_s, resumed=True)
                first = False
            yield self.collate_fn(batch), where

    def _items(self, worker: int, workers: int, saved: dict | None) -> tuple[Any, Iterator[Any]]:
        """The object this worker reads (its share, or the whole stream) and its items."""
        dataset = self.dataset
        if callable(getattr(dataset, "set_epoch", None)):
            dataset.set_epoch(self.epoch)
        rank_share, own = share(dataset, self.rank, self.world_size)
        source, own_too = share(rank_share, worker, workers) if own else (rank_share, False)
        # Items kept from what `source` yields: every one (the dataset shared itself out), every
        # K-th (it gave the rank its share only), or items i % (W*K) == r + W*k of the whole stream.
        stride, offset = (1, 0) if own_too else (workers, worker) if own else \
            (self.world_size * workers, self.rank + self.world_size * worker)
        if saved and "state" in saved and callable(getattr(source, "load_state_dict", None)):
            source.load_state_dict(saved["state"])
            if saved["read"]:
                offset = stride - 1  # the source stands right after this worker's last item
        return source, itertools.islice(iter(source), offset, None, stride)


def rank_batches(dataset: Any, rank: int, world_size: int, batch_size: int,
                 collate_fn: Callable | None = None) -> Iterator[Any]:
    """Rank r's share of a stream in batches, the short last one included, in this process
    (the evaluation's reading: every held-out item counts once)."""
    source, own = share(dataset, rank, world_size)
    items = iter(source) if own else itertools.islice(iter(source), rank, None, world_size)
    collate = collate_fn or default_collate
    while batch := list(itertools.islice(items, batch_size)):
        yield collate(batch)


class Stream:
    """The trainer's view of a streamed training set: epochs of batches with their positions."""

    def __init__(self, dataset: Any, rank: int, world_size: int, batch_size: int, *, workers: int = 0,
                 pin_memory: bool = False, collate_fn: Callable | None = None) -> None:
        self.dataset, self.rank, self.world_size, self.batch_size = dataset, rank, world_size, batch_size
        self.workers, self.pin_memory, self.collate_fn = workers, pin_memory, collate_fn
        self.epoch, self.trained, self.dropped = 0, 0, 0
        self.turn, self.taken = 0, 0  # the workers' rotation this epoch (re)started with; turns taken since
        self.where: dict[int, dict] = {}      # each worker's position after the last trained batch
        self.resume_at: dict | None = None    # the saved position to begin the next epoch from

    def __len__(self) -> int:
        """Batches an epoch holds on each rank, where the dataset has a length (an estimate:
        the shortest share decides)."""
        if not has_length(self.dataset):
            raise TypeError("the stream has no length")
        return len(self.dataset) // (self.batch_size * self.world_size)

    @property
    def sized(self) -> bool:
        return has_length(self.dataset)

    def begin(self, epoch: int) -> Iterator[tuple[Any, dict]]:
        """The epoch's batches, from the saved position when resuming inside it."""
        resume = self.resume_at if self.resume_at and self.resume_at["epoch"] == epoch else None
        self.resume_at = None
        self.epoch, self.dropped = epoch, 0
        self.trained = resume["trained"] if resume else 0
        self.where = {int(k): v for k, v in resume["workers"].items()} if resume else {}
        self.turn, self.taken = (resume["turn"] if resume else 0), 0
        start = {"turn": self.turn, "workers": self.where} if resume else None
        # A generator of its own: DataLoader draws its workers' seeds from it, not from the
        # global RNG, which an exact resume restores.
        loader = DataLoader(RankShare(self.dataset, self.rank, self.world_size, self.batch_size, self.collate_fn,
                                      epoch, start),
                            batch_size=None, num_workers=self.workers, pin_memory=self.pin_memory,
                            generator=torch.Generator().manual_seed(epoch))
        return self._batches(iter(loader))

    def _batches(self, loader: Iterator[tuple[Any, dict]]) -> Iterator[tuple[Any, dict]]:
        """The batches; a worker's short last one is counted as dropped, and the turn it took noted."""
        turns = 0
        for batch, where in loader:
            turns += 1
            if batch is None:
                self.dropped += where["dropped"]
                continue
            yield batch, dict(where, turns=turns)
            turns = 0

    def trained_one(self, where: dict) -> None:
        """A batch from this position was trained."""
        self.trained += 1
        self.taken += where["turns"]
        self.where[where["worker"]] = {k: where[k] for k in ("read", "made", "state") if k in where}
        if where.get("resumed") and self.rank == 0:  # rank 0 says how each of its workers took up the stream
            how = (f"read {where['replayed']:,} items again in {where['replay_s']:.2f} s (the stream has no "
                   "state_dict(): replayed to its saved position)" if "state" not in where else
                   "went on from its stream's state_dict(), reading nothing again")
            print(f"resume: rank 0's stream, worker {where['worker']}: {how}", flush=True)

    # -- the checkpoint part ----------------------------------------------------------------

    def state_dict(self) -> dict:
        # DataLoader takes its workers' batches in turn: the one after the last trained is next.
        turn = (self.turn + self.taken) % max(self.workers, 1)
        return {"epoch": self.epoch, "trained": self.trained, "workers": {str(k): v for k, v in self.where.items()},
                "turn": turn, "world_size": self.world_size, "worker_count": max(self.workers, 1)}

    def load_state_dict(self, state: dict) -> None:
        if state["trained"] and (state["world_size"], state["worker_count"]) != (self.world_size,
                                                                                 max(self.workers, 1)):
            raise UsageError(f"the checkpoint's stream position is mid-epoch for {state['world_size']} rank(s) x "
                             f"{state['worker_count']} worker(s), this run has {self.world_size} x "
                             f"{max(self.workers, 1)}: resume with those (workers, --workers), or from a "
                             "checkpoint at an epoch's end")
        self.resume_at = state
