"""The data libraries' test corpus: 1,000 numbered items in 16 shards, written once per test run
in each library's own format. usage: python tests/data_corpus.py OUT

Item i is {"id": i, "x": [i, i+1, i+2, i+3] / 1000} (float32). Shard s holds the items of one
contiguous range; the shards' sizes (63 or 62) are dealt so that 2 ranks, and 2 ranks x 2
workers, get 250 or 500 items each whichever shards they are dealt by position parity.

    OUT/jsonl/part-SS.jsonl          Hugging Face datasets' "json" builder
    OUT/tar/part-SS.tar              WebDataset: KEY.json members
    OUT/mds/                         MosaicML streaming: MDSWriter shards (index.json)
    OUT/litdata/                     litdata: optimize()'s chunks (index.json)
"""
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np

ITEMS, SHARDS = 1000, 16
# 63 for shards 0-3 and 8-11, 62 for 4-7 and 12-15: dealt out by position to 2 ranks (s mod 2) and then
# 2 workers (s mod 4), every rank gets 500 items and every worker 250.
SIZES = [63 if (s // 4) % 2 == 0 else 62 for s in range(SHARDS)]


def ranges() -> list[range]:
    starts = np.cumsum([0] + SIZES)
    return [range(starts[s], starts[s + 1]) for s in range(SHARDS)]


def item(i: int) -> dict:
    return {"id": i, "x": [(i + k) / 1000 for k in range(4)]}


def write_jsonl(out: Path) -> None:
    folder = out / "jsonl"
    folder.mkdir(parents=True)
    for s, part in enumerate(ranges()):
        (folder / f"part-{s:02d}.jsonl").write_text("".join(json.dumps(item(i)) + "\n" for i in part))


def write_tar(out: Path) -> None:
    folder = out / "tar"
    folder.mkdir(parents=True)
    for s, part in enumerate(ranges()):
        with tarfile.open(folder / f"part-{s:02d}.tar", "w") as tar:
            for i in part:
                data = json.dumps(item(i)).encode()
                info = tarfile.TarInfo(f"{i:06d}.json")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_mds(out: Path) -> None:
    from mosaic_import import mosaic

    writer_cls = mosaic().MDSWriter
    # A shard holds what fits size_limit: each sample is its id and 4 floats (24 bytes, and 8 of
    # framing); one writer per shard keeps the sizes exact.
    folder = out / "mds"
    for s, part in enumerate(ranges()):
        with writer_cls(out=str(folder / f"{s:02d}"), columns={"id": "int64", "x": "ndarray:float32:4"},
                        size_limit=1 << 20) as writer:
            for i in part:
                writer.write({"id": i, "x": np.asarray(item(i)["x"], dtype=np.float32)})
    index = {"version": 2, "shards": []}
    for s in range(SHARDS):  # one index over the 16 folders' shards, as MDSWriter's merge makes it
        shard = json.loads((folder / f"{s:02d}" / "index.json").read_text())["shards"][0]
        name = f"{s:02d}/{shard['raw_data']['basename']}"
        shard["raw_data"]["basename"] = name
        index["shards"].append(shard)
    (folder / "index.json").write_text(json.dumps(index))


def _litdata_item(i: int) -> dict:
    return {"id": i, "x": np.asarray(item(i)["x"], dtype=np.float32)}


def write_litdata(out: Path) -> None:
    import litdata

    litdata.optimize(fn=_litdata_item, inputs=list(range(ITEMS)), output_dir=str(out / "litdata"),
                     chunk_size=max(SIZES), num_workers=1, mode="overwrite", start_method="fork")


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    for write in (write_jsonl, write_tar, write_mds, write_litdata):
        write(target)
