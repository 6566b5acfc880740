"""Run under mpirun -n 2 by test_data_libraries.py: what a user passes from each data library,
through fit() as they would pass it, three times in these same two ranks: uninterrupted, stopped
mid-epoch (--max-steps 17, or as SHAPES says), and resumed from that checkpoint.
usage: SCRIPT CORPUS OUT CASE:WORKERS [CASE:WORKERS ...]   (tests/data_corpus.py wrote CORPUS)

Each rank writes OUT/CASE-wWORKERS-rRANK.json: the item ids it trained in each run, in order
(loss_fn records them; its first call, the preflight's dry run, is not training), each run's exit
status, and rank 0 also what fit() printed.
"""
import contextlib
import io
import json
import os
import random
import sys
from glob import glob
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ddp_abci import TrainConfig, discover_launch, fit, launched_rank, launched_world_size, rank_variables

corpus, out = Path(sys.argv[1]), Path(sys.argv[2])
rank, world = launched_rank(), launched_world_size()


def hf():
    from datasets import load_dataset

    files = sorted(glob(str(corpus / "jsonl" / "*.jsonl")))
    return load_dataset("json", data_files=files, split="train", streaming=True).with_format("torch")


def hf_split():
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(hf(), rank=rank, world_size=world)


def wds(**kw):
    import webdataset

    def item(sample):  # the user's .map(): a dict, the sample's __key__ string kept in it
        record = sample["json"]
        return {"id": record["id"], "x": np.asarray(record["x"], dtype=np.float32), "__key__": sample["__key__"]}

    urls = sorted(glob(str(corpus / "tar" / "*.tar")))
    return webdataset.WebDataset(urls, **kw).decode().map(item)


def litdata():
    import litdata

    return litdata.StreamingDataset(str(corpus / "litdata"), shuffle=True, seed=11)


def mosaic():
    from ddp_abci.compare.corpus import mosaic

    os.environ.update(rank_variables(discover_launch()))  # MosaicML reads RANK, WORLD_SIZE, ... when built
    return mosaic().StreamingDataset(local=str(corpus / "mds"), shuffle=True, shuffle_seed=5)


class Sized(IterableDataset):
    """A stream of your own that has a length."""

    def __len__(self):
        return 1000

    def __iter__(self):
        return ({"id": i, "x": torch.arange(i, i + 4, dtype=torch.float32) / 1000} for i in range(1000))


class NumpyText(IterableDataset):
    """numpy scalars and a text column, batched by a collate_fn that tokenizes the text."""

    def __iter__(self):
        for i in range(1000):
            yield {"id": np.int64(i), "x": (np.arange(i, i + 4) / 1000).astype(np.float32),
                   "weight": np.float32(1.0), "text": f"item number {i}"}


def tokenize(items):
    batch = torch.utils.data.default_collate([{k: v for k, v in it.items() if k != "text"} for it in items])
    batch["tokens"] = torch.tensor([len(it["text"].split()) for it in items])
    return batch


class Table(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return {"id": i, "x": torch.arange(i, i + 4, dtype=torch.float32) / 1000}


def loader(workers, stateful=False):
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as cls
    else:
        cls = DataLoader
    return cls(Table(), batch_size=10, shuffle=True, num_workers=workers)  # 10 a rank: global_batch 20


CASES = {
    "hf": lambda w: (hf(), None),
    # The usual recipe: shards and items shuffled through a buffer, a seed given (the buffer is
    # not in its state_dict(): replayed), and the same without a seed (refused: the ranks would
    # deal out differently shuffled shards).
    "hf-shuffled": lambda w: (hf().shuffle(seed=3, buffer_size=100), None),
    "hf-unseeded-shuffle": lambda w: (random.seed() or hf().shuffle(buffer_size=100), None),
    "hf-split": lambda w: (hf_split(), None),
    "wds": lambda w: (wds(shardshuffle=False), None),
    "wds-split-by-node": lambda w: (wds(shardshuffle=False, nodesplitter=__import__("webdataset").split_by_node),
                                    None),
    "wds-seeded-shuffle": lambda w: (wds(shardshuffle=100, seed=5,
                                         nodesplitter=__import__("webdataset").split_by_node), None),
    # random.seed(): as in a job's new process (fit() seeds Python's generator, from which
    # WebDataset draws its seed, so that runs in one process would draw the same).
    "wds-unseeded-shuffle": lambda w: (random.seed() or wds(shardshuffle=100,
                                                            nodesplitter=__import__("webdataset").split_by_node), None),
    "litdata": lambda w: (litdata(), None),
    "mosaic": lambda w: (mosaic(), None),
    "sized": lambda w: (Sized(), None),
    "numpy-text": lambda w: (NumpyText(), tokenize),
    "dataloader": lambda w: (loader(w), None),
    "stateful-dataloader": lambda w: (loader(w, stateful=True), None),
}

# (epochs, the step the first of the cut runs stops at) where not (1, 17): the shuffled stream
# stops in its second epoch, whose order its set_epoch() changes.
SHAPES = {"hf-shuffled": (2, 70)}

trained: list[int] = []
calls: list[int] = []


def loss_fn(model, batch):
    calls.append(1)
    if len(calls) > 1:  # the first call is the preflight's dry run, not a trained batch
        trained.extend(int(i) for i in batch["id"])
    return (model(batch["x"]) ** 2).mean()


def one_run(case: str, workers: int, **settings) -> dict:
    train_set, collate_fn = CASES[case](workers)
    loader_given = isinstance(train_set, DataLoader)
    config = TrainConfig(epochs=SHAPES.get(case, (1, 17))[0], global_batch=20, lr=0.01, timeout_s=20,
                         workers=0 if loader_given else workers, **settings)
    trained.clear()
    calls.clear()
    torch.manual_seed(0)
    printed = Tee(out / f"{case}-w{workers}-r{rank}.log")
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        status = fit(torch.nn.Linear(4, 1), train_set, loss_fn, config, collate_fn=collate_fn)
    return {"status": status, "trained": list(trained), "printed": printed.getvalue()}


class Tee(io.StringIO):
    """What fit() prints, kept for the results and written through to a log file at once (a
    job that ends itself, exit 69, leaves its last line there)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.log = open(path, "a", buffering=1)

    def write(self, text: str) -> int:
        self.log.write(text)
        return super().write(text)


for spec in sys.argv[3:]:
    case, workers = spec.split(":")
    ck = out / f"ck-{case}-w{workers}"
    runs = {"whole": one_run(case, int(workers)),
            "first": one_run(case, int(workers), ckpt_dir=str(ck), max_steps=SHAPES.get(case, (1, 17))[1]),
            "rest": one_run(case, int(workers), ckpt_dir=str(ck), resume=True)}
    (out / f"{case}-w{workers}-r{rank}.json").write_text(json.dumps(runs))
