"""How each kind of stream is read on one rank: who splits it by rank and by DataLoader worker,
where its position is kept, and how its first items are read without disturbing it.

    Reader        a stream of unknown kind: every rank reads it whole and keeps its items (i mod
                  W*K == r + W*k), or asks `shard(index, count)` where the dataset has one
    AlreadySplit  your stream, wrapped to say it yields this rank's share (and, with
                  by_worker=True, each DataLoader worker's) already: never split again
    HuggingFace   datasets.IterableDataset: split_dataset_by_node (or the split you made), its own
                  worker split, resumed from its state_dict(), or by replay where it shuffles
                  through a buffer (.shuffle(seed, buffer_size): its state holds no buffer)
    WebDataset    webdataset's pipelines: its node splitter given this rank, its worker split,
                  resumed by replay; an unseeded shuffle is said before the first step
    LitData       litdata.StreamingDataset: its own splits, told this rank, the batch size and the
                  workers; resumed from the samples this rank consumed (its state_dict's arguments)
    MosaicML      streaming.StreamingDataset: its own splits from the world it was built for;
                  resumed from the samples every rank consumed, its epoch kept to the trainer's

reader_for() picks one from the dataset's class. None imports its library at import time: a
library's stream can only reach here from a process that has that library loaded already.
"""
from __future__ import annotations

import copy
import itertools
from typing import Any, Iterator

from torch.utils.data import IterableDataset

from .errors import UsageError


class AlreadySplit(IterableDataset):
    """Your stream, marked as this rank's share already (you split it by rank yourself): it is
    never split by rank again. by_worker=True: it also gives each DataLoader worker its own
    part (it reads get_worker_info()); otherwise each worker keeps every K-th of its items."""

    def __init__(self, dataset: Any, by_worker: bool = False) -> None:
        self.dataset, self.by_worker = dataset, by_worker

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)

    def __getattr__(self, name: str) -> Any:  # set_epoch, state_dict, __len__, ... of the stream inside
        if name in ("dataset", "by_worker"):
            raise AttributeError(name)
        return getattr(self.dataset, name)


def heard_epoch(dataset: Any, epoch: int) -> None:
    """A dataset with set_epoch(epoch) hears each epoch before it is read."""
    if callable(getattr(dataset, "set_epoch", None)):
        dataset.set_epoch(epoch)


def has_length(dataset: Any) -> bool:
    try:
        len(dataset)
    except TypeError:
        return False
    return True


class Reader:
    """A stream of unknown kind: the project's protocol. `shard(index, count)` returning the
    dataset's own share is asked for it (rank r of W, then worker k of K of that share);
    without it every rank reads the whole stream and keeps its items."""

    kind = "a stream"
    splits_workers = False           # the library gives each DataLoader worker its part itself
    rank_position = False            # its position is the rank's samples consumed (rank_state), not each worker's
    restarts_at_first_worker = False  # on resume it deals the rest of the epoch out from worker 0 again
    one_order_across_ranks = False   # its ranks split one shared order: seeds that differ lose items
    replay_why = "the stream has no state_dict()"  # why a resume reads its items again, where it does

    def __init__(self, dataset: Any, rank: int, world_size: int, batch_size: int, workers: int) -> None:
        self.dataset, self.rank, self.world_size = dataset, rank, world_size
        self.batch_size, self.workers = batch_size, max(workers, 1)

    # -- the main process ------------------------------------------------------------------

    def rank_share(self, epoch: int, state: dict | None = None) -> tuple[Any, bool]:
        """(what this rank reads in `epoch`, whether that is the rank's own share); `state`:
        the rank-level position to resume inside the epoch (rank_position readers only)."""
        heard_epoch(self.dataset, epoch)
        return _own_shard(self.dataset, self.rank, self.world_size)

    def rank_state(self, trained_batches: int, epoch: int) -> dict | None:
        """The rank's position after `trained_batches` batches of `epoch` (rank_position readers)."""
        return None

    def first_items(self, count: int) -> list[Any]:
        """The stream's first `count` items, read so that the library stays as it was."""
        share, _ = self.rank_share(0)
        return list(itertools.islice(iter(share), count))

    def batches_per_epoch(self) -> int | None:
        """Whole batches an epoch holds on this rank, where the length is known (an estimate:
        the shortest share decides). A length is the whole stream's here."""
        if not has_length(self.dataset):
            return None
        return len(self.dataset) // (self.batch_size * self.world_size)

    def order_warning(self) -> str | None:
        """Why the order cannot be read again alike by a resume, or None."""
        return None

    def order_key(self) -> Any:
        """What fixes the order (plain data: its seeds), kept in the checkpoint and compared on resume."""
        return None

    def resume_note(self) -> str | None:
        """How a resume mid-epoch will take the stream up, where that costs more than loading a state."""
        return None

    # -- a DataLoader worker (or the main process without workers) -------------------------

    def worker_items(self, share: Any, own: bool, worker: int, workers: int,
                     saved: dict | None) -> tuple[Any, Iterator[Any]]:
        """(the object this worker reads, its items), the worker's saved position loaded."""
        if self.splits_workers:
            source, stride, offset = share, 1, 0
        else:
            source, own_too = _own_shard(share, worker, workers) if own else (share, False)
            # Items kept from what `source` yields: every one (the dataset shared itself out), every
            # K-th (it gave the rank its share only), or items i % (W*K) == r + W*k of the whole stream.
            stride, offset = (1, 0) if own_too else (workers, worker) if own else \
                (self.world_size * workers, self.rank + self.world_size * worker)
        if saved and "state" in saved and callable(getattr(source, "load_state_dict", None)):
            source.load_state_dict(saved["state"])
            if saved["read"]:
                offset = stride - 1  # the source stands right after this worker's last item
        return source, itertools.islice(iter(source), offset, None, stride)

    def worker_state(self, source: Any) -> dict | None:
        """The worker's source position after its last item, where it keeps one."""
        return source.state_dict() if callable(getattr(source, "state_dict", None)) else None


def _own_shard(dataset: Any, index: int, count: int) -> tuple[Any, bool]:
    """(the share, whether the dataset made it itself): index of count equal shares."""
    if count == 1:
        return dataset, True
    if callable(getattr(dataset, "shard", None)):
        return dataset.shard(index, count), True
    return dataset, False


class AlreadySplitReader(Reader):
    kind = "a stream already split by rank (AlreadySplit)"

    def __init__(self, dataset: AlreadySplit, *args: Any) -> None:
        super().__init__(dataset.dataset, *args)
        self.splits_workers = dataset.by_worker

    def rank_share(self, epoch: int, state: dict | None = None) -> tuple[Any, bool]:
        heard_epoch(self.dataset, epoch)
        return self.dataset, True

    def batches_per_epoch(self) -> int | None:
        return len(self.dataset) // self.batch_size if has_length(self.dataset) else None


class HuggingFace(Reader):
    """datasets.IterableDataset: split_dataset_by_node (its shards dealt out when their number
    divides by the world, else every W-th example), unless you split it already; its own
    worker split (each worker iterates its shards); state_dict() per worker."""

    kind = "a Hugging Face datasets stream"
    splits_workers = True
    one_order_across_ranks = True
    replay_why = "its state_dict() holds no shuffle buffer"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        made = getattr(self.dataset, "_distributed", None)
        if made is not None and (made.rank, made.world_size) != (self.rank, self.world_size):
            raise UsageError(f"the Hugging Face stream was split with split_dataset_by_node for rank {made.rank} of "
                             f"{made.world_size}, this is rank {self.rank} of {self.world_size}: split it with "
                             "those, or pass it unsplit and it is split here")

        # Its state_dict() keeps no shuffle buffer: resumed from it, the library refills the buffer
        # from the items after the position, and those waiting in it at the save are never trained
        # that epoch (datasets 5.2.0, BufferShuffledExamplesIterable.load_state_dict). Replayed
        # from the epoch's start instead, the buffer fills as it did, and the order is the same.
        self.shuffles = [(node.buffer_size, node.generator.bit_generator.seed_seq.entropy)
                         for node in _hf_buffered_shuffles(self.dataset._ex_iterable) if node.buffer_size >= 2]

    def rank_share(self, epoch: int, state: dict | None = None) -> tuple[Any, bool]:
        share = self.dataset
        if self.world_size > 1 and getattr(share, "_distributed", None) is None:
            from datasets.distributed import split_dataset_by_node  # noqa: PLC0415  (the user's library)

            share = split_dataset_by_node(share, rank=self.rank, world_size=self.world_size)
        share.set_epoch(epoch)
        return share, True

    def worker_state(self, source: Any) -> dict | None:
        return None if self.shuffles else super().worker_state(source)

    def resume_note(self) -> str | None:
        if not self.shuffles:
            return None
        return (f"it shuffles through a buffer of {self.shuffles[0][0]:,} items, which its state_dict() does not hold: "
                "a resume mid-epoch replays each worker's items from the epoch's start to its position, so it trains "
                "exactly the uninterrupted run's items (docs/data.md: what that costs)")

    def order_key(self) -> Any:
        # Each shuffle's seed (an unseeded one draws 128 random bits): the same on every rank, or
        # the ranks deal out the shards in different orders (some trained twice, some never).
        return [seed for _, seed in self.shuffles] or None



def _hf_buffered_shuffles(node: Any) -> Iterator[Any]:
    """The shuffle buffers in a datasets.IterableDataset's chain of example iterables."""
    if type(node).__name__ == "BufferShuffledExamplesIterable":
        yield node
    for child in [getattr(node, "ex_iterable", None), *getattr(node, "ex_iterables", ())]:
        if child is not None:
            yield from _hf_buffered_shuffles(child)


class WebDataset(Reader):
    """webdataset's pipelines (WebDataset, DataPipeline): the node splitter stage (its default
    single_node_only, split_by_node, or none) replaced by this rank's split of the shard list;
    its worker splitter (split_by_worker) left to split by worker. No state: replayed."""

    kind = "a WebDataset pipeline"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from webdataset import shardlists  # noqa: PLC0415  (the user's library)

        stages = list(self.dataset.pipeline)
        node = [i for i, s in enumerate(stages) if s in (shardlists.single_node_only, shardlists.split_by_node)]
        first = 1 if stages and _is_shard_list(stages[0]) else None
        if first is None and not node:
            start = type(stages[0]).__name__ if stages else "nothing"
            raise UsageError(f"the WebDataset pipeline starts with a {start}, not a shard list: split it by rank "
                             "yourself and pass AlreadySplit(pipeline)")
        self.splits_workers = shardlists.split_by_worker in stages
        splitter = _NodeSplit(self.rank, self.world_size)
        if node:
            stages[node[0]] = splitter
        else:
            stages.insert(first, splitter)
        self.dataset = copy.copy(self.dataset)
        self.dataset.pipeline = stages

    def rank_share(self, epoch: int, state: dict | None = None) -> tuple[Any, bool]:
        heard_epoch(self.dataset, epoch)
        return self.dataset, True

    def batches_per_epoch(self) -> int | None:
        size = getattr(self.dataset, "size", None)  # .with_length(n): the whole stream's
        return size // (self.batch_size * self.world_size) if isinstance(size, int) else None

    def order_warning(self) -> str | None:
        for stage in self.dataset.pipeline:
            if _unseeded_shuffle(stage):
                return ("its .shuffle() stage has no seed (rng=None, seed=None): each process draws its own "
                        "order, and a resume mid-epoch would replay other items; pass .shuffle(n, seed=S)")
        return None

    def order_key(self) -> Any:
        # WebDataset(seed=None) draws a seed per process, which orders only the stages that shuffle.
        seeds = [seed for reorders, seed in map(_shuffle_stage, self.dataset.pipeline) if reorders]
        return seeds or None


class _NodeSplit:
    """This rank's part of the shard list: every W-th shard from the r-th (webdataset's
    split_by_node, with the rank given instead of read from torch.distributed or RANK)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def __call__(self, src: Iterator[Any]) -> Iterator[Any]:
        return itertools.islice(src, self.rank, None, self.world_size)


def _is_shard_list(stage: Any) -> bool:
    return type(stage).__name__ in ("SimpleShardList", "ResampledShards", "MultiShardSample")


def _shuffle_stage(stage: Any) -> tuple[bool, Any]:
    """Whether a pipeline stage reorders the stream, and the seed it draws the order from:
    webdataset's shuffle(bufsize) and detshuffle(bufsize) reorder with a buffer of 2 or more
    (WebDataset(shardshuffle=False) adds shuffle(False), which does not)."""
    if getattr(getattr(stage, "f", None), "__name__", "") == "_shuffle":
        size = stage.args[0] if stage.args else stage.kw.get("bufsize", 1000)
        return bool(size) and size >= 2, stage.kw.get("seed")
    if type(stage).__name__ == "detshuffle":
        return stage.bufsize >= 2, stage.seed
    return False, None


def _unseeded_shuffle(stage: Any) -> bool:
    """A webdataset shuffle stage that reorders with neither seed nor rng."""
    reorders, seed = _shuffle_stage(stage)
    return reorders and seed is None and getattr(stage, "kw", {}).get("rng") is None


class LitData(Reader):
    """litdata.StreamingDataset: it deals chunks out by rank and worker itself, from the rank,
    world, batch size and worker count it is given here (it reads the world once, when built,
    from torch.distributed). Its position is this rank's samples consumed: state_dict(
    num_samples_yielded, num_workers, batch_size), loaded before the workers start."""

    kind = "a litdata StreamingDataset"
    splits_workers = True
    rank_position = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from litdata.utilities.env import _DistributedEnv  # noqa: PLC0415  (the user's library)

        self.dataset = copy.copy(self.dataset)
        seen = self.dataset.distributed_env
        self.dataset.distributed_env = _DistributedEnv(self.world_size, self.rank, getattr(seen, "num_nodes", 1))
        self.dataset.set_batch_size(self.batch_size)
        self.dataset.set_num_workers(self.workers)

    def rank_share(self, epoch: int, state: dict | None = None) -> tuple[Any, bool]:
        share = self.dataset
        share.reset_state_dict()
        share.set_epoch(epoch + 1)  # litdata's epochs count from 1 (its StreamingDataLoader's)
        if state:
            share.load_state_dict(state)
        return share, True

    def rank_state(self, trained_batches: int, epoch: int) -> dict:
        state = self.dataset.state_dict(trained_batches * self.batch_size, self.workers, self.batch_size)
        return dict(state, current_epoch=epoch + 1)

    def first_items(self, count: int) -> list[Any]:
        return [self.dataset[i] for i in range(min(count, len(self.dataset)))]

    def batches_per_epoch(self) -> int | None:
        return len(self.dataset) // self.batch_size  # litdata's length is this rank's

    def worker_state(self, source: Any) -> dict | None:
        return None


class MosaicML(Reader):
    """streaming.StreamingDataset (MosaicML): it deals samples out by rank and worker itself,
    from the world it read when built (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, and MASTER_ADDR and
    MASTER_PORT for the process group it opens for a moment: set them before building it,
    ddp_abci.rank_variables(discover_launch())), in batches of its batch_size. Its position is the
    samples every rank consumed in the epoch, loaded before each epoch, which also keeps its
    epoch counter to the trainer's; on resume it deals the rest out from worker 0 again."""

    kind = "a MosaicML StreamingDataset"
    splits_workers = True
    rank_position = True
    restarts_at_first_worker = True

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        world = self.dataset._unique_rank_world
        if (world.rank, world.num_ranks) != (self.rank, self.world_size):
            raise UsageError(f"the MosaicML StreamingDataset was built for rank {world.rank} of {world.num_ranks}, "
                             f"this is rank {self.rank} of {self.world_size}: it reads RANK, WORLD_SIZE, LOCAL_RANK "
                             "and LOCAL_WORLD_SIZE when built; set them first: "
                             "os.environ.update(ddp_abci.rank_variables(ddp_abci.discover_launch()))")
        size = self.dataset.batch_size
        if size is None:
            self.dataset.batch_size = self.batch_size  # it deals whole batches to each worker
        elif size != self.batch_size:
            raise UsageError(f"the MosaicML StreamingDataset has batch_size={size}, each rank's batch here is "
                             f"{self.batch_size}: build it with batch_size={self.batch_size} (or leave it out)")
        # What its own state_dict keeps beside the position (num_canonical_nodes, shuffle_seed),
        # read now: its resume state lives in shared memory that every rank of the node writes
        # before each epoch, and a rank reading it then could find another one writing it.
        self.base = self.dataset.state_dict(0, True)

    def rank_share(self, epoch: int, state: dict | None = None) -> tuple[Any, bool]:
        self.dataset.load_state_dict(state or dict(self.base, epoch=epoch, sample_in_epoch=0))
        return self.dataset, True

    def rank_state(self, trained_batches: int, epoch: int) -> dict:
        return dict(self.base, epoch=epoch, sample_in_epoch=trained_batches * self.batch_size * self.world_size)

    def first_items(self, count: int) -> list[Any]:
        return [self.dataset.get_item(i) for i in range(min(count, self.dataset.num_samples))]

    def batches_per_epoch(self) -> int | None:
        return len(self.dataset) // self.batch_size  # its length is this rank's

    def worker_state(self, source: Any) -> dict | None:
        return None


# A class's module names its library: (module prefix, class names, reader).
KINDS: tuple[tuple[str, tuple[str, ...], type[Reader]], ...] = (
    ("datasets.", ("IterableDataset",), HuggingFace),
    ("webdataset.", ("WebDataset", "DataPipeline", "FluidWrapper"), WebDataset),
    ("litdata.", ("StreamingDataset",), LitData),
    ("streaming.", ("StreamingDataset",), MosaicML),
)


def reader_for(dataset: Any, rank: int, world_size: int, batch_size: int, workers: int) -> Reader:
    """The reader for this stream's kind (the first class in its MRO a library is known by)."""
    if isinstance(dataset, AlreadySplit):
        return AlreadySplitReader(dataset, rank, world_size, batch_size, workers)
    for cls in type(dataset).__mro__:
        for prefix, names, reader in KINDS:
            if cls.__module__.startswith(prefix) and cls.__name__ in names:
                return reader(dataset, rank, world_size, batch_size, workers)
    return Reader(dataset, rank, world_size, batch_size, workers)


def reading_failure(error: BaseException) -> str:
    """A failure while reading as one line that keeps the library's own message: a DataLoader
    worker's re-raised exception carries the worker's whole traceback, whose last line is it."""
    text = str(error)
    if "Original Traceback" in text:
        head = text.strip().splitlines()[0].rstrip(".")  # "Caught ValueError in DataLoader worker process 0"
        last = [line.strip() for line in text.strip().splitlines() if line.strip()][-1]
        return f"{last} ({head.replace('Caught ', 'raised as ', 1)})"
    return f"{type(error).__name__}: {' '.join(text.split()) or type(error).__name__}"

