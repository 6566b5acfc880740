"""Numbered items in each data library's own shard format, for docs/data.md's recipes, the data
libraries' tests and `python -m ddp_abci.compare.resume_cost` (the libraries: the test extra).
usage: python -m ddp_abci.compare.corpus OUT [--items 1000] [--shards 16]

Item i is {"id": i, "x": [i, i+1, i+2, i+3] / 1000} (float32). Shard s holds the items of one
contiguous range, `sizes[s]` of them:

    OUT/jsonl/part-SSSS.jsonl        Hugging Face datasets' "json" builder
    OUT/tar/part-SSSS.tar            WebDataset: KEY.json members
    OUT/mds/                         MosaicML streaming: MDSWriter shards (index.json)
    OUT/litdata/                     litdata: optimize()'s chunks (index.json)
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import sys
import tarfile
import types
from pathlib import Path

import numpy as np


def ranges(sizes: list[int]) -> list[range]:
    """The ids of each shard."""
    starts = np.cumsum([0] + list(sizes))
    return [range(int(starts[s]), int(starts[s + 1])) for s in range(len(sizes))]


def item(i: int) -> dict:
    return {"id": i, "x": [(i + k) / 1000 for k in range(4)]}


def write_jsonl(out: Path, sizes: list[int]) -> None:
    folder = out / "jsonl"
    folder.mkdir(parents=True)
    for s, part in enumerate(ranges(sizes)):
        (folder / f"part-{s:04d}.jsonl").write_text("".join(json.dumps(item(i)) + "\n" for i in part))


def write_tar(out: Path, sizes: list[int]) -> None:
    folder = out / "tar"
    folder.mkdir(parents=True)
    for s, part in enumerate(ranges(sizes)):
        with tarfile.open(folder / f"part-{s:04d}.tar", "w") as tar:
            for i in part:
                data = json.dumps(item(i)).encode()
                info = tarfile.TarInfo(f"{i:09d}.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_mds(out: Path, sizes: list[int]) -> None:
    writer_cls = mosaic().MDSWriter
    folder = out / "mds"
    # One writer per shard, each shard under size_limit, keeps the shards' sizes exact; one index
    # over the folders' shards then, as MDSWriter's own merge makes it.
    index: dict = {"version": 2, "shards": []}
    for s, part in enumerate(ranges(sizes)):
        with writer_cls(out=str(folder / f"{s:04d}"), columns={"id": "int64", "x": "ndarray:float32:4"},
                        size_limit=1 << 30) as writer:
            for i in part:
                writer.write({"id": i, "x": np.asarray(item(i)["x"], dtype=np.float32)})
        shard = json.loads((folder / f"{s:04d}" / "index.json").read_text())["shards"][0]
        shard["raw_data"]["basename"] = f"{s:04d}/{shard['raw_data']['basename']}"
        index["shards"].append(shard)
    (folder / "index.json").write_text(json.dumps(index))


def _litdata_item(i: int) -> dict:
    return {"id": i, "x": np.asarray(item(i)["x"], dtype=np.float32)}


def write_litdata(out: Path, sizes: list[int]) -> None:
    """litdata's chunks: `max(sizes)` items each (litdata deals chunks, not our shards)."""
    import litdata

    litdata.optimize(fn=_litdata_item, inputs=list(range(sum(sizes))), output_dir=str(out / "litdata"),
                     chunk_size=max(sizes), num_workers=1, mode="overwrite", start_method="fork")


WRITERS = {"jsonl": write_jsonl, "tar": write_tar, "mds": write_mds, "litdata": write_litdata}


def write(out: Path, sizes: list[int], formats: tuple[str, ...] = tuple(WRITERS)) -> None:
    """Write the corpus of `sum(sizes)` items in `formats` under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for name in formats:
        WRITERS[name](out, sizes)


def mosaic() -> types.SimpleNamespace:
    """MosaicML streaming's StreamingDataset and MDSWriter: `from streaming import ...` where that
    imports; else the same classes loaded without the package's __init__ files.

    streaming/__init__.py imports streaming.vision (torchvision) and streaming.base.dataloader
    (transformers). Where neither loads (PyPI's torchvision 0.28.0 against the CPU torch 2.13.0:
    "operator torchvision::nms does not exist"), `streaming` and `streaming.base` are registered
    as bare packages on their own folders, so that the modules of these two classes, which import
    neither, load unmodified (docs/testing.md).
    """
    if "streaming" not in sys.modules:
        try:
            import streaming
            return types.SimpleNamespace(StreamingDataset=streaming.StreamingDataset, MDSWriter=streaming.MDSWriter)
        except (ImportError, RuntimeError):
            for name in [n for n in sys.modules if n == "streaming" or n.startswith("streaming.")]:
                del sys.modules[name]
            root = list(importlib.util.find_spec("streaming").submodule_search_locations)
            for name, path in (("streaming", root), ("streaming.base", [p + "/base" for p in root])):
                package = types.ModuleType(name)
                package.__path__ = path
                sys.modules[name] = package
    dataset = importlib.import_module("streaming.base.dataset")
    writer = importlib.import_module("streaming.base.format.mds.writer")
    classes = types.SimpleNamespace(StreamingDataset=dataset.StreamingDataset, MDSWriter=writer.MDSWriter)
    vars(sys.modules["streaming"]).update(vars(classes))  # `from streaming import StreamingDataset` then works
    return classes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write numbered items in each data library's format")
    parser.add_argument("out")
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=16)
    args = parser.parse_args(argv)
    if not 0 < args.shards <= args.items:
        parser.error(f"--shards {args.shards} for --items {args.items}: give 1 to {args.items} shards")
    each, extra = divmod(args.items, args.shards)
    write(Path(args.out), [each + (s < extra) for s in range(args.shards)])
    print(f"{args.items:,} items in {args.shards} shards, in {', '.join(WRITERS)} under {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
