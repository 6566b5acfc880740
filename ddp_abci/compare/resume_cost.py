"""What a resume far into each kind of stream costs: `python -m ddp_abci.compare.resume_cost
[--batches 100000] [--out bench-results/resume-cost.json]` (the data libraries: the test extra).

For each library a corpus of numbered items (ddp_abci/compare/corpus.py) is written in its
format, read through the trainer's own Stream on one rank without workers for `batches`
batches, and the position a checkpoint would keep is taken (Stream.state_dict). A fresh
dataset and Stream are then given that position and timed from the start of the epoch to
their first batch, which must be the batch the uninterrupted read had next. A map-style set
(a DataLoader's dataset) is timed the same way through the trainer's sampler, which skips.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import tempfile
import time
from glob import glob
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from ..data import EpochBatches, build_loader
from ..parallel.launch import Launch
from ..streams import Stream
from . import corpus

SHARD_ITEMS = 10_000


def hugging_face(folder: Path) -> Any:
    from datasets import load_dataset

    files = sorted(glob(str(folder / "jsonl" / "*.jsonl")))
    return load_dataset("json", data_files=files, split="train", streaming=True).with_format("torch")


def hugging_face_shuffled(folder: Path) -> Any:
    return hugging_face(folder).shuffle(seed=3, buffer_size=1000)


def webdataset(folder: Path) -> Any:
    import numpy as np
    import webdataset

    def item(sample: dict) -> dict:
        return {"id": sample["json"]["id"], "x": np.asarray(sample["json"]["x"], dtype=np.float32)}

    return webdataset.WebDataset(sorted(glob(str(folder / "tar" / "*.tar"))), shardshuffle=False).decode().map(item)


def litdata(folder: Path) -> Any:
    import litdata

    return litdata.StreamingDataset(str(folder / "litdata"), shuffle=True, seed=11)


def mosaic(folder: Path) -> Any:
    return corpus.mosaic().StreamingDataset(local=str(folder / "mds"), shuffle=True, shuffle_seed=5)


# name: (the corpus format it reads, how a user builds it)
STREAMS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "Hugging Face datasets (json, streaming=True)": ("jsonl", hugging_face),
    "Hugging Face datasets, .shuffle(seed=3, buffer_size=1000)": ("jsonl", hugging_face_shuffled),
    "WebDataset (tar shards)": ("tar", webdataset),
    "litdata StreamingDataset": ("litdata", litdata),
    "MosaicML StreamingDataset": ("mds", mosaic),
}


def first_ids(batch: Any) -> list[int]:
    return [int(i) for i in batch["id"][:3]]


def stream_resume(build: Callable[[], Any], batches: int, batch_size: int) -> dict:
    """Read `batches` batches, keep the position, and time a fresh stream's resume from it."""
    stream = Stream(build(), 0, 1, batch_size)
    epoch = stream.begin(0)
    began = time.monotonic()
    for _ in range(batches):
        _, where = next(epoch)
        stream.trained_one(where)
    read_s = time.monotonic() - began
    state = stream.state_dict()
    following, _ = next(epoch)
    del epoch, stream
    resumed = Stream(build(), 0, 1, batch_size)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint holds it: plain data
    began = time.monotonic()
    first, where = next(resumed.begin(0))
    resume_s = time.monotonic() - began
    return {"read_s": round(read_s, 2), "resume_s": round(resume_s, 3), "how": where.get("how"),
            "replayed_items": where.get("replayed", 0), "exact": first_ids(first) == first_ids(following)}


def map_style_resume(batches: int, batch_size: int) -> dict:
    """A map-style set's resume: the trainer's sampler skips `batches` batches without reading them."""
    table = [{"id": i, "x": torch.full((4,), i / 1000)} for i in range((batches + 1) * batch_size)]
    launch = Launch(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="127.0.0.1", master_port=0,
                    source="single")
    began = time.monotonic()
    first = next(EpochBatches(build_loader(table, launch, batch_size, seed=3)).begin(0, skip=batches))
    resume_s = time.monotonic() - began
    following = list(EpochBatches(build_loader(table, launch, batch_size, seed=3)).begin(0))[batches]
    return {"resume_s": round(resume_s, 3), "how": "the sampler skips the batches trained, reading none",
            "replayed_items": 0, "exact": first_ids(first) == first_ids(following)}


def measure(batches: int, batch_size: int, names: list[str]) -> dict:
    items = (batches + 1) * batch_size
    sizes = [SHARD_ITEMS] * (items // SHARD_ITEMS) + ([items % SHARD_ITEMS] if items % SHARD_ITEMS else [])
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            form, make = STREAMS[name]
            folder = Path(tmp) / form
            began = time.monotonic()
            if not folder.exists():  # two streams of one format read one corpus
                corpus.write(folder, sizes, (form,))
            written_s = time.monotonic() - began
            results[name] = dict(stream_resume(functools.partial(make, folder), batches, batch_size),
                                 written_s=round(written_s, 1))
            print(f"{name}: {results[name]}", flush=True)
    results["DataLoader over a map-style set"] = map_style_resume(batches, batch_size)
    return {"batches": batches, "batch_size": batch_size, "items": items, "shard_items": SHARD_ITEMS,
            "environment": environment(), "results": results}


def environment() -> dict:
    """The machine and the libraries' versions the figures were measured with."""
    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    packages = ("torch", "datasets", "webdataset", "litdata", "mosaicml-streaming", "torchdata")
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d"), **{package: version(package) for package in packages}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100_000, help="the position to resume at (default 100000)")
    parser.add_argument("--batch-size", type=int, default=10, help="items a batch (default 10)")
    parser.add_argument("--only", action="append", choices=list(STREAMS), help="measure these streams only")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    report = measure(args.batches, args.batch_size, args.only or list(STREAMS))
    for name, row in report["results"].items():
        print(f"{name:48s} resume {row['resume_s']:8.3f} s  {row['how']}  exact={row['exact']}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(row["exact"] for row in report["results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
