"""ShardedFiles: a corpus in shard files, streamed, each file read by one rank and worker only.

    def read_jsonl(path):                       # yields the items of one file
        with open(path) as f:
            for line in f:
                yield torch.tensor(json.loads(line)["x"])

    train_set = ShardedFiles(sorted(glob("shards/*.jsonl")), read_jsonl, shuffle_seed=0)
    fit(model, train_set, loss_fn, config)

Each epoch shuffles the file order from (shuffle_seed, epoch) and deals the files out:
shard(index, count) keeps the files at positions p with p % count == index of that order,
and the trainer asks for shard(rank, world_size), then each worker for its share of that,
so no file is read twice in an epoch. state_dict() is where the share stands (the epoch,
its file, the items read of it), so a resume opens no file it had finished and reads the
current one up to the saved item. torch and numpy only.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from torch.utils.data import IterableDataset


class ShardedFiles(IterableDataset):
    """The items of a list of files, `read(path)` yielding one file's items: each epoch the
    files are shuffled from (shuffle_seed, epoch) and dealt out whole to (rank, worker) by
    shard(); state_dict() is the epoch, the file of this share being read and the items read
    of it, so a resume opens no finished file. Raises ValueError for an empty list."""

    def __init__(self, paths: Sequence[Any], read: Callable[[Any], Iterable[Any]], shuffle_seed: int = 0) -> None:
        self.paths, self.read, self.shuffle_seed = list(paths), read, shuffle_seed
        if not self.paths:
            raise ValueError("ShardedFiles needs at least one file")
        self.epoch, self.index, self.count = 0, 0, 1
        self.file = self.item = 0  # the position: this share's file being read, items read of it

    def set_epoch(self, epoch: int) -> None:
        """A new order of the files; the position goes back to the epoch's start."""
        if epoch != self.epoch:
            self.epoch, self.file, self.item = epoch, 0, 0

    def shard(self, index: int, count: int) -> "ShardedFiles":
        """Share `index` of `count`: a share of a share composes (rank r of W, then worker k of K
        keeps the positions p % (W * K) == r + W * k)."""
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} is not in 0..{count - 1}")
        view = ShardedFiles(self.paths, self.read, self.shuffle_seed)
        view.epoch, view.index, view.count = self.epoch, self.index + self.count * index, self.count * count
        return view

    def files(self) -> list[Any]:
        """This share's files in this epoch's order."""
        order = np.random.default_rng([self.shuffle_seed, self.epoch]).permutation(len(self.paths))
        return [self.paths[i] for i in order[self.index::self.count]]

    def __iter__(self) -> Iterator[Any]:
        files, end = self.files(), object()
        while self.file < len(files):
            current, items = self.file, iter(self.read(files[self.file]))
            for _ in range(self.item):  # resumed inside this file: read up to where it stood
                next(items, None)
            upcoming = next(items, end)
            while upcoming is not end:
                # One item read ahead: the position moves past a file with its last item, so
                # that a resume there never opens it again.
                item, upcoming = upcoming, next(items, end)
                self.file, self.item = (self.file + 1, 0) if upcoming is end else (self.file, self.item + 1)
                yield item
            if self.file == current:  # an empty file, or one that ended while resuming inside it
                self.file, self.item = current + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "file": self.file, "item": self.item}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.file, self.item = int(state["epoch"]), int(state["file"]), int(state["item"])
