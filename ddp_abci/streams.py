"""Streamed data: any IterableDataset, each rank reading its own share, resumed at the exact item.

Sharing out. Who splits the stream by rank and by DataLoader worker depends on its kind
(stream_readers.py): a library that splits itself (Hugging Face datasets, WebDataset, litdata,
MosaicML) is given this rank and does it, and is never split again; a dataset with
`shard(index, count)` is asked for its share (rank r of W, then worker k of K of that); any
other stream is read whole by every rank, which keeps the items i with i % (W*K) == r + W*k
(as Accelerate's IterableDatasetShard does). No item is trained twice in an epoch, none skipped.

Batches. Each worker batches its own items (`collate_fn`, default torch's) and yields only
whole batches: a short last one is dropped and counted. DataLoader takes batches from its
workers in turn, so a rank's order is fixed by the workers' own orders.

Position. With every batch comes where its worker stands: items read, batches made, and the
source's state_dict() when it has one; a library whose position is the rank's samples consumed
(litdata, MosaicML) is asked for it from the batches trained. The trainer keeps the position
after the last batch it trained (not the ones read ahead), and a checkpoint holds every rank's.
A resume then loads each source's state (reading nothing twice) or, without one, replays it:
reads and drops the items already read, saying how many and how long. The workers take up their
turns where they left them: a worker before the one next in turn first yields a skip, so that
DataLoader's round asks the right one first. A resume mid-epoch needs the same world size and
worker count (refused in one line otherwise); at an epoch's end any will do.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from .data import settle_before_fork
from .errors import UsageError
from .stream_readers import Reader, has_length, reader_for

SKIP = "skip"  # a worker's first answer when it is not its turn yet (a resumed rotation)


def is_stream(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset)


__all__ = ["RankShare", "Stream", "has_length", "is_stream", "rank_batches"]


class RankShare(IterableDataset):
    """One rank's share of a stream, split among its DataLoader workers, as (batch, where) pairs."""

    def __init__(self, reader: Reader, share: Any, own: bool, collate_fn: Callable | None,
                 resume: dict | None) -> None:
        self.reader, self.share, self.own = reader, share, own
        self.collate_fn = collate_fn or default_collate
        self.resume = resume or {}  # this rank's saved position (Stream.position), for this epoch

    def __iter__(self) -> Iterator[tuple[Any, dict]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if worker < self.resume.get("turn", 0):
            yield None, {"worker": worker, SKIP: True}  # DataLoader's round reaches the worker next in turn first
        saved = None if self.reader.rank_position else self.resume.get("workers", {}).get(worker)
        source, items = self.reader.worker_items(self.share, self.own, worker, workers, saved)
        read, made = (saved["read"], saved["made"]) if saved else (0, 0)
        replayed, began = 0, time.monotonic()
        if saved and "state" not in saved:  # no usable state_dict(): the saved position's items read again, dropped
            replayed = sum(1 for _ in itertools.islice(items, read))
        replay_s, first = time.monotonic() - began, bool(self.resume)
        size = self.reader.batch_size
        while True:
            batch = list(itertools.islice(items, size))
            read += len(batch)
            if len(batch) < size:
                if batch:  # a short last batch: not trained, counted as dropped
                    yield None, {"worker": worker, "dropped": len(batch)}
                return
            made += 1
            where = {"worker": worker, "read": read, "made": made}
            state = self.reader.worker_state(source)
            if state is not None:
                where["state"] = state
            if first:
                where.update(replayed=replayed, replay_s=replay_s, resumed=True, how=self._how(saved))
                first = False
            yield self.collate_fn(batch), where

    def _how(self, saved: dict | None) -> str:
        if self.reader.rank_position:
            return f"went on from {self.reader.kind}'s own state (its samples consumed), reading nothing again"
        if saved is None or "state" in saved:
            return "went on from its stream's state_dict(), reading nothing again"
        return "replay"


def rank_batches(dataset: Any, rank: int, world_size: int, batch_size: int,
                 collate_fn: Callable | None = None) -> Iterator[Any]:
    """Rank r's share of a stream in batches, the short last one included, in this process
    (the evaluation's reading: every held-out item counts once)."""
    reader = reader_for(dataset, rank, world_size, batch_size, 0)
    share, own = reader.rank_share(0)
    _, items = reader.worker_items(share, own, 0, 1, None)
    collate = collate_fn or default_collate
    while batch := list(itertools.islice(items, batch_size)):
        yield collate(batch)


class Stream:
    """The trainer's view of a streamed training set: epochs of batches with their positions."""

    def __init__(self, dataset: Any, rank: int, world_size: int, batch_size: int, *, workers: int = 0,
                 pin_memory: bool = False, collate_fn: Callable | None = None, reader: Reader | None = None) -> None:
        self.reader = reader or reader_for(dataset, rank, world_size, batch_size, workers)
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.workers, self.pin_memory, self.collate_fn = workers, pin_memory, collate_fn
        self.epoch, self.trained, self.dropped = 0, 0, 0
        self.turn, self.taken = 0, 0  # the workers' rotation this epoch (re)started with; turns taken since
        self.where: dict[int, dict] = {}      # each worker's position after the last trained batch
        self.resume_at: dict | None = None    # the saved position to begin the next epoch from

    def __len__(self) -> int:
        """Batches an epoch holds on each rank, where the stream's length is known."""
        batches = self.reader.batches_per_epoch()
        if batches is None:
            raise TypeError("the stream has no length")
        return batches

    @property
    def sized(self) -> bool:
        return self.reader.batches_per_epoch() is not None

    def begin(self, epoch: int) -> Iterator[tuple[Any, dict]]:
        """The epoch's batches, from the saved position when resuming inside it."""
        resume = self.resume_at if self.resume_at and self.resume_at["epoch"] == epoch else None
        self.resume_at = None
        self.epoch, self.dropped = epoch, 0
        self.trained = resume["trained"] if resume else 0
        self.where = {int(k): v for k, v in resume["workers"].items()} if resume else {}
        turn = resume["turn"] if resume and not self.reader.restarts_at_first_worker else 0
        self.turn, self.taken = 0, 0  # the skips of the turns before `turn` are turns taken too
        share, own = self.reader.rank_share(epoch, resume.get("rank_state") if resume and self.trained else None)
        start = {"turn": turn, "workers": self.where, "trained": self.trained} if resume else None
        # A generator of its own: DataLoader draws its workers' seeds from it, not from the
        # global RNG, which an exact resume restores.
        loader = DataLoader(RankShare(self.reader, share, own, self.collate_fn, start), batch_size=None,
                            num_workers=self.workers, pin_memory=self.pin_memory,
                            generator=torch.Generator().manual_seed(epoch))
        settle_before_fork(self.workers)
        return self._batches(iter(loader))

    def _batches(self, loader: Iterator[tuple[Any, dict]]) -> Iterator[tuple[Any, dict]]:
        """The batches; a worker's short last one is counted as dropped, and the turn it took noted."""
        turns = 0
        for batch, where in loader:
            turns += 1
            if batch is None:
                self.dropped += where.get("dropped", 0)
                continue
            yield batch, dict(where, turns=turns)
            turns = 0

    def trained_one(self, where: dict) -> None:
        """A batch from this position was trained."""
        self.trained += 1
        self.taken += where["turns"]
        self.where[where["worker"]] = {k: where[k] for k in ("read", "made", "state") if k in where}
        if where.get("resumed") and self.rank == 0:  # rank 0 says how each of its workers took up the stream
            how = where["how"] if where["how"] != "replay" else (
                f"read {where['replayed']:,} items again in {where['replay_s']:.2f} s ({self.reader.replay_why}: "
                "replayed to its saved position)")
            print(f"resume: rank 0's stream, worker {where['worker']}: {how}", flush=True)

    # -- the checkpoint part ----------------------------------------------------------------

    def state_dict(self) -> dict:
        # DataLoader takes its workers' batches in turn: the one after the last trained is next.
        turn = (self.turn + self.taken) % max(self.workers, 1)
        state = {"epoch": self.epoch, "trained": self.trained, "workers": {str(k): v for k, v in self.where.items()},
                 "turn": turn, "world_size": self.world_size, "worker_count": max(self.workers, 1)}
        rank_state = self.reader.rank_state(self.trained, self.epoch) if self.trained else None
        if rank_state is not None:
            state["rank_state"] = rank_state
        key = self.reader.order_key()
        if key is not None:
            state["order_key"] = key
        return state

    def load_state_dict(self, state: dict) -> None:
        if state["trained"] and (state["world_size"], state["worker_count"]) != (self.world_size,
                                                                                 max(self.workers, 1)):
            raise UsageError(f"the checkpoint's stream position is mid-epoch for {state['world_size']} rank(s) x "
                             f"{state['worker_count']} worker(s), this run has {self.world_size} x "
                             f"{max(self.workers, 1)}: resume with those (workers, --workers), or from a "
                             "checkpoint at an epoch's end")
        key = self.reader.order_key()
        if state["trained"] and state.get("order_key", key) != key:
            raise UsageError(f"the checkpoint's stream position is mid-epoch in an order drawn from seed(s) "
                             f"{state['order_key']!r}, this run's {self.reader.kind} draws {key!r} (no seed was "
                             "given, so each process draws its own): the resume would replay other items; pass "
                             "seed= to it (and resume from an epoch's end), or start afresh")
        self.resume_at = state
