"""Streamed data from shard files: ddp_abci.ShardedFiles over JSON-lines shards that this
example writes itself (docs/data.md).

    mpirun -n 2 python -m ddp_abci.examples.shards --epochs 3 --workers 2 --ckpt-dir /tmp/run1
    (then the same with --resume after a Ctrl-C: the run goes on at the item it stopped at)

Each rank writes the same 16 files of 500 items, `{"x": [...8 numbers], "y": [...2]}` a line,
into --shards (default: a folder under $TMPDIR, per user), unless they are there already:
no shared file system is needed. The files are dealt out whole, each epoch in a new order:
no file is read by two ranks or two workers, and a resume opens no file it had finished.
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from ddp_abci import ShardedFiles, fit, parse_command_line

FILES, ITEMS_PER_FILE = 16, 500


def write_shards(folder: Path) -> list[Path]:
    """The corpus: y = x @ W + noise, fixed by the seed; written once, each file atomically
    (ranks on one host may write the same file at once: the rename makes either whole)."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(8, 2, generator=g)
    paths = []
    for i in range(FILES):
        x = torch.randn(ITEMS_PER_FILE, 8, generator=g)
        y = x @ weights + 0.1 * torch.randn(ITEMS_PER_FILE, 2, generator=g)
        path = folder / f"shard-{i:03d}.jsonl"
        if not path.exists():
            tmp = folder / f".{path.name}.{os.getpid()}.tmp"
            lines = (json.dumps({"x": a.tolist(), "y": b.tolist()}) + "\n" for a, b in zip(x, y, strict=True))
            tmp.write_text("".join(lines))
            tmp.replace(path)
        paths.append(path)
    return paths


def read_jsonl(path: Path):
    """One file's items: what ShardedFiles calls for each file it opens (in a loader worker too)."""
    with open(path) as f:
        for line in f:
            item = json.loads(line)
            yield torch.tensor(item["x"]), torch.tensor(item["y"])


def main() -> int:
    config, launch, rest = parse_command_line(epochs=3, global_batch=64, lr=3e-3, betas=(0.9, 0.999),
                                              own=("--shards",))
    mine = argparse.ArgumentParser(prog="python -m ddp_abci.examples.shards")
    mine.add_argument("--shards", type=Path, help="the shard files' folder (written when missing)",
                      default=Path(tempfile.gettempdir()) / f"ddp_abci_shards-{os.getuid()}")
    args = mine.parse_args(rest)
    train_set = ShardedFiles(write_shards(args.shards), read_jsonl, shuffle_seed=0)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)

    def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    return fit(model, train_set, loss_fn, config, launch=launch)


if __name__ == "__main__":
    sys.exit(main())
