"""Run under mpirun -n 2 by test_streams.py: fit() over a stream. usage: SCRIPT KIND OUT [trainer flags]

KIND:
  numbered   a plain IterableDataset of 1,000 numbered items (no shard, no state)
  uneven     a stream whose shard() gives rank 1 fifty items fewer than rank 0
  shards     ShardedFiles over 16 JSON-lines files written in OUT/shards (2 workers a rank)
Each rank appends the item numbers it trained to OUT/trained-R.txt, and every file opened to
OUT/opened.txt ("rank worker path" lines, worker "main" for the preflight's dry run, which reads
the stream's first batch in the rank's own process), so the test sees what was read and trained.
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import IterableDataset, get_worker_info

from ddp_abci import ShardedFiles, fit, parse_command_line

kind, out = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])


class Numbered(IterableDataset):
    def __init__(self, count=1000):
        self.count = count

    def __iter__(self):
        return (torch.tensor([float(i)]) for i in range(self.count))


class Uneven(Numbered):
    def shard(self, index, count):
        return Numbered(300) if index == 0 else _Offset(250)


class _Offset(Numbered):
    def __iter__(self):
        return (torch.tensor([float(1000 + i)]) for i in range(self.count))


def read(path):
    info = get_worker_info()
    with open(out / "opened.txt", "a") as log:
        log.write(f"{rank} {info.id if info else 'main'} {path}\n")  # main: the preflight's first batch
    with open(path) as f:
        for line in f:
            yield torch.tensor([float(json.loads(line)["i"])])


def shards():
    folder = out / "shards"
    folder.mkdir(exist_ok=True)
    for n in range(16):
        with open(folder / f"part-{n:02d}.jsonl", "w") as f:
            f.writelines(json.dumps({"i": n * 100 + i}) + "\n" for i in range(100))
    return ShardedFiles(sorted(str(p) for p in folder.glob("*.jsonl")), read, shuffle_seed=3)


calls = []


def loss_fn(model, x):
    calls.append(1)
    if kind == "shards":
        time.sleep(0.01)  # a step of real size: a stop can land mid-epoch, after some files are done
    if len(calls) > 1:  # the first call is the preflight's dry run, not a trained batch
        with open(out / f"trained-{rank}.txt", "a") as f:
            f.write(" ".join(str(int(v)) for v in x.flatten().tolist()) + "\n")
    return ((model(x / 1000) - x / 1000) ** 2).mean()


config, launch, _ = parse_command_line(sys.argv[3:], global_batch=20, epochs=1, lr=0.01)
dataset = {"numbered": Numbered, "uneven": Uneven, "shards": shards}[kind]()
torch.manual_seed(0)
sys.exit(fit(torch.nn.Linear(1, 1), dataset, loss_fn, config, launch=launch))
