"""Storage from each host: whether the checkpoint folder can be written there, and how fast a
write reaches the disk (write, then fsync: what a checkpoint costs); the same for reading the
data folder. Each host's first rank measures, alone on its host."""
from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

from ..parallel.collectives import all_ranks
from ..parallel.launch import Launch

CHUNK = 4 << 20


def write_speed(folder: str, megabytes: int) -> dict:
    """MB/s of a write of `megabytes` and its fsync into `folder`, or why it cannot be written."""
    data = os.urandom(CHUNK)
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".doctor-", suffix=".tmp")
    except OSError as e:
        return {"writable": False, "error": f"{e.strerror or e}"}
    chunks = max(1, megabytes * (1 << 20) // CHUNK)  # whole chunks: what is written, not what was asked
    try:
        began = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            for _ in range(chunks):
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - began
        return {"writable": True, "write_mb_s": round(chunks * CHUNK / 1e6 / seconds, 1)}
    except OSError as e:
        return {"writable": False, "error": f"{e.strerror or e}"}
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_speed(folder: str, megabytes: int) -> dict:
    """MB/s reading the folder's files (up to `megabytes`; files read before may come from the
    page cache, and read faster than the disk)."""
    done, began = 0, time.perf_counter()
    try:
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            with path.open("rb") as f:
                while done < megabytes << 20 and (chunk := f.read(CHUNK)):
                    done += len(chunk)
            if done >= megabytes << 20:
                break
    except OSError as e:
        return {"readable": False, "error": f"{e.strerror or e}"}
    seconds = time.perf_counter() - began
    return {"readable": True, "read_mb": round(done / 1e6, 1), "read_mb_s": round(done / 1e6 / max(seconds, 1e-9), 1)}


def check_storage(launch: Launch, ckpt_dir: str | None, data_dir: str | None, megabytes: int) -> list[dict]:
    """Collective: each host's figures (its local rank 0 measures), in rank order."""
    mine = None
    if launch.is_local_main:
        mine = {"host": socket.gethostname(), "rank": launch.rank}
        if ckpt_dir:
            mine["ckpt_dir"] = {"folder": ckpt_dir, **write_speed(ckpt_dir, megabytes)}
        if data_dir:
            mine["data_dir"] = {"folder": data_dir, **read_speed(data_dir, megabytes)}
    return [entry for entry in all_ranks(mine) if entry is not None]
