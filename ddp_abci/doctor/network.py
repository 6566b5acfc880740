"""The network, as the gradients will use it: all-reduce latency and bus bandwidth over a size
sweep, through each path the trainer can take here (MPI, gloo; NCCL on GPUs), across all
ranks, within each host, and between neighbouring hosts in pairs (host i with host i+1, the
last with the first): a slow host or link shows up in both pairs it belongs to.

Bus bandwidth as nccl-tests computes it: busbw = algbw x 2(n-1)/n, algbw = bytes / time.
Each size is timed over repeats (about 0.2 s of them), the time the slowest rank saw; a
sweep stops growing once one all-reduce takes more than a second (the rest is "skipped").
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from ..parallel.launch import Launch

SIZES = [8, 64, 512, 4096, 32768, 262144, 2 << 20, 16 << 20, 64 << 20]  # bytes: 8 B to 64 MiB
PAIR_SIZES = [8, 262144, 16 << 20]  # the pairs: latency, a bucket's worth, bandwidth
SLOWEST_OP_S = 1.0
BATCH_S = 0.2


def sweep(path: Any, members: int, sizes: list[int]) -> list[dict]:
    """path(elements) -> an op that all-reduces that many float32s once; path.max(x) -> the max
    of x over the group. Only the group's ranks call this, all with the same sizes, and they
    must agree on the repeats: each size's are decided from the max over the group of its
    first timed op."""
    rows, skip = [], False
    for size in sizes:
        if skip:
            rows.append({"bytes": size, "skipped": f"an all-reduce took over {SLOWEST_OP_S:g} s at a smaller size"})
            continue
        op = path(max(1, size // 4))
        for _ in range(3 if not rows else 1):  # warm up: buffers, connections, shared memory
            op()
        began = time.perf_counter()
        op()
        first = path.max(time.perf_counter() - began)
        repeats = max(1, min(50, int(BATCH_S / max(first, 1e-6))))
        began = time.perf_counter()
        for _ in range(repeats):
            op()
        seconds = path.max((time.perf_counter() - began) / repeats)
        algbw = size / seconds / 1e9
        rows.append({"bytes": size, "latency_us": _sig(seconds * 1e6), "algbw_gbps": _sig(algbw),
                     "busbw_gbps": _sig(algbw * 2 * (members - 1) / members) if members > 1 else None})
        skip = seconds > SLOWEST_OP_S
    return rows


def _sig(x: float) -> float:
    """Four significant digits: an 8-byte all-reduce's bandwidth is a few kB/s."""
    return float(f"{x:.4g}")


class GlooPath:
    """all-reduces over a gloo group (the default one on the CPU, a gloo one beside NCCL's on GPUs)."""

    name = "gloo"

    def __init__(self, group: Any) -> None:
        self.group = group

    def __call__(self, elements: int) -> Callable[[], None]:
        t = torch.ones(elements)
        return lambda: dist.all_reduce(t, group=self.group)

    def max(self, seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.item()


class NCCLPath(GlooPath):
    name = "nccl"

    def __call__(self, elements: int) -> Callable[[], None]:
        t = torch.ones(elements, device="cuda")

        def op() -> None:
            dist.all_reduce(t, group=self.group)
            torch.cuda.synchronize()
        return op

    def max(self, seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.item()


class MPIPath:
    name = "mpi"

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def __call__(self, elements: int) -> Callable[[], None]:
        from mpi4py import MPI  # noqa: PLC0415  (optional)

        buffer = np.ones(elements, dtype=np.float32)
        return lambda: self.comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

    def max(self, seconds: float) -> float:
        from mpi4py import MPI  # noqa: PLC0415

        return self.comm.allreduce(seconds, op=MPI.MAX)


def measure_network(launch: Launch, device: torch.device, hosts: list[str], watchdog: Any,
                    largest: int = SIZES[-1]) -> dict:
    """Collective: every path, every scope, sizes up to `largest` bytes. Returns rank 0's view:
    {path: {scope: rows}}."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    names = list(by_host)
    pairs = [(names[i], names[(i + 1) % len(names)]) for i in range(len(names) if len(names) > 2 else 1)] \
        if len(names) > 1 else []
    out: dict[str, dict] = {}
    for path, groups in _paths(launch, device, by_host, pairs):
        with watchdog.waiting(f"the doctor's {path} all-reduces"):
            out[path] = _scopes(launch, groups, by_host, pairs, largest)
    return out


def _paths(launch: Launch, device: torch.device, by_host: dict, pairs: list) -> list[tuple[str, dict]]:
    """Each path's groups: all, one per host, one per pair (leaders: each host's first rank).
    Groups are made collectively, on every rank, in the same order."""
    leaders = {host: ranks[0] for host, ranks in by_host.items()}
    hosts = {f"host {h}": r for h, r in by_host.items()} if len(by_host) > 1 else {}  # one host: that is "all"
    scopes = {"all": list(range(launch.world_size)), **hosts,
              **{f"pair {a}-{b}": [leaders[a], leaders[b]] for a, b in pairs}}
    paths = []
    if launch.mpi and launch.world_size > 1:
        from mpi4py import MPI  # noqa: PLC0415

        world = MPI.COMM_WORLD
        comms = {}
        for scope, ranks in scopes.items():
            comm = world.Split(0 if launch.rank in ranks else MPI.UNDEFINED, launch.rank)
            comms[scope] = MPIPath(comm) if comm != MPI.COMM_NULL else None
        paths.append(("mpi", comms))
    gloo_default = device.type != "cuda"
    groups = {scope: dist.new_group(ranks, backend="gloo") if not (gloo_default and scope == "all") else None
              for scope, ranks in scopes.items()}
    paths.append(("gloo", {s: GlooPath(g) if launch.rank in scopes[s] else None for s, g in groups.items()}))
    if device.type == "cuda":
        nccl = {scope: dist.new_group(ranks) if scope != "all" else None for scope, ranks in scopes.items()}
        paths.append(("nccl", {s: NCCLPath(g) if launch.rank in scopes[s] else None for s, g in nccl.items()}))
    return paths


def _scopes(launch: Launch, groups: dict, by_host: dict, pairs: list, largest: int) -> dict:
    """Every scope in turn (a barrier between: pairs share hosts, and must not share time)."""
    from ..parallel.collectives import all_ranks, wait_for_everyone  # noqa: PLC0415

    mine: dict[str, list[dict]] = {}
    for scope, path in groups.items():
        if path is not None:
            members = len(by_host[scope[5:]]) if scope.startswith("host ") else 2 if scope.startswith("pair") \
                else launch.world_size
            sizes = [size for size in (PAIR_SIZES if scope.startswith("pair") else SIZES) if size <= largest]
            if members > 1:
                mine[scope] = sweep(path, members, sizes)
        if scope.startswith("pair") or scope == "all":
            wait_for_everyone()
    merged: dict[str, list[dict]] = {}
    for theirs in all_ranks(mine):
        for scope, rows in theirs.items():
            merged.setdefault(scope, rows)  # every member measured the same (the max over the group)
    return merged
