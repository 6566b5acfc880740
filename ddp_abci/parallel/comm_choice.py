"""--comm auto on the CPU under mpirun: MPI's all-reduce, or gloo's where it is clearly faster for
this model's gradient over these ranks' links, measured at the start within a budget of seconds.

Neither path wins everywhere (docs/benchmark.md): on one host Open MPI's shared memory beats
gloo's loopback TCP; across a slow link gloo's all-reduce can take half Open MPI's time. Between
network namespaces MPI's first large all-reduce once took 117 s and once never finished (its TCP
transport connecting on a route that did not answer), so each path is first probed once at the
measured size: MPI's with a non-blocking operation on a communicator of its own, polled for at
most PROBE_S, gloo's on the process group itself (which training needs whatever is chosen). The
ranks agree on the probes over gloo (its all-reduce timed by the watchdog); where MPI's did not
finish on every rank the run takes gloo at once, and says why. Otherwise both paths are measured
as training meets them, an agreed number of rounds. A resume at the same world size reuses its
checkpoint's verdict (assembly.py) instead of measuring again.
"""
from __future__ import annotations

import atexit
import math
import time
from contextlib import nullcontext
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from .gradients import GradientPath, gradient_path

GLOO_MARGIN = 0.8  # gloo is taken where it all-reduces in under 0.8 of MPI's time
# What a step's all-reduce costs, as training meets it: each path in blocks of BLOCK consecutive
# calls (after one untimed call that re-warms it), the paths' blocks alternating, as many rounds
# as fit in ROUNDS_S (2 to ROUNDS). Single calls, best-of or interleaved, chose the wrong path
# across a slow link, where a lone call's time is not a run of calls' (docs/benchmark.md, "Models
# of real size, and a slow link"). MEASURED_BYTES: the paths' ratio did not change beyond it.
BLOCK, ROUNDS, ROUNDS_S, MEASURED_BYTES = 3, 5, 3.0, 4 * 2**20
PROBE_S = 5.0    # MPI's first all-reduce: past it on any rank, MPI is out
# An MPI operation given up on still owns its buffer, freeing its request is erroneous, and
# MPI_Finalize crashed completing one that every rank had given up on (seen here: a segmentation
# fault in NBC_Progress, reproduced with two ranks and nothing else). So every rank polls it once
# they have agreed (where a rank was only late, it finishes then), and what is still unfinished is
# kept, and polled again at exit (before mpi4py's finalize) for at most EXIT_S: the TCP connect
# timeout a stalled transport waits out. The one exception to the package's no-module-state rule.
UNFINISHED: list = []
EXIT_S = 150.0


def measure_and_choose(gradient_bytes: int, watchdog: Any = None, probe_s: float = PROBE_S) -> tuple[GradientPath, str]:
    """The path every rank takes, and the line that says so. Each path's time is the median of
    its blocks' means, the maximum over the ranks. Returns: (the path, whose measured_ms holds
    mpi, gloo and the measuring's own cost, took; the line)."""
    from mpi4py import MPI  # noqa: PLC0415  (only under mpirun: importing it starts MPI)

    nbytes = max(4, min(gradient_bytes, MEASURED_BYTES))
    buffer = torch.zeros(nbytes // 4)
    comm = MPI.COMM_WORLD
    timed = watchdog.waiting("measuring the gradient all-reduce, MPI against gloo") if watchdog else nullcontext()
    began = time.perf_counter()
    with timed:
        probes = agree(probe(comm, buffer, probe_s))
        if probes["mpi"] is None:
            times = {"mpi": None, "gloo": probes["gloo"]}
            finish_unfinished(probe_s)
        else:
            means = _block_medians([lambda: comm.Allreduce(MPI.IN_PLACE, buffer.numpy(), op=MPI.SUM),
                                    lambda: dist.all_reduce(buffer)], max(probes.values()))
            comm.Allreduce(MPI.IN_PLACE, means, op=MPI.MAX)
            times = {"mpi": float(means[0]), "gloo": float(means[1])}
    took_ms = (time.perf_counter() - began) * 1e3
    name, why = choose(times, probe_s)
    chosen = gradient_path(name)
    chosen.measured_ms = {"mpi": _ms(times["mpi"]), "gloo": _ms(times["gloo"]), "took": round(took_ms, 1)}
    return chosen, (f"gradients: an all-reduce of {nbytes / 1e6:.2f} MB took {_shown(times['mpi'])} through MPI, "
                    f"{_shown(times['gloo'])} through gloo: via {name} (--comm auto{why}); measuring took "
                    f"{took_ms:.0f} ms")


def probe(comm: Any, buffer: torch.Tensor, probe_s: float) -> dict[str, float | None]:
    """One all-reduce of `buffer` each way: MPI's on a duplicate of `comm` (left unfinished there
    past `probe_s`: None), gloo's on the process group (blocking: training needs it anyway)."""
    from mpi4py import MPI  # noqa: PLC0415

    spare, data = comm.Dup(), buffer.numpy().copy()
    began = time.monotonic()
    request = spare.Iallreduce(MPI.IN_PLACE, data, op=MPI.SUM)
    while not request.Test():
        if time.monotonic() - began > probe_s:
            mpi = None
            UNFINISHED.append((spare, request, data))
            break
    else:
        mpi = time.monotonic() - began
    began = time.monotonic()
    dist.all_reduce(buffer.clone())
    return {"mpi": mpi, "gloo": time.monotonic() - began}


def finish_unfinished(within_s: float) -> None:
    """Poll the probes given up on until they finish or `within_s` passes; those left are polled
    again at exit (an atexit handler runs before mpi4py's MPI_Finalize)."""
    deadline = time.monotonic() + within_s
    while UNFINISHED and time.monotonic() < deadline:
        UNFINISHED[:] = [each for each in UNFINISHED if not each[1].Test()]
    if UNFINISHED and not getattr(finish_unfinished, "at_exit", False):
        finish_unfinished.at_exit = True  # type: ignore[attr-defined]
        atexit.register(finish_unfinished, EXIT_S)


def choose(times: dict[str, float | None], probe_s: float = PROBE_S) -> tuple[str, str]:
    """(the path, the line's note): gloo only when clearly faster (near a tie a measurement's
    noise would pick either, and two runs of one seed would not end bit for bit alike); MPI out
    when its probe did not finish in time."""
    if times["mpi"] is None:
        return "gloo", f"; MPI's first all-reduce did not finish within {probe_s:g} s on every rank: gloo"
    return ("gloo" if times["gloo"] < GLOO_MARGIN * times["mpi"] else "mpi"), ""


def agree(mine: dict[str, float | None]) -> dict[str, float | None]:
    """Every rank's probes, agreed over the process group (gloo, which has just answered the
    probe): each path's maximum over the ranks, None where a rank had none. Nothing goes through
    the rendezvous store, which anyone who reaches its port can write (docs/security.md)."""
    paths = sorted(mine)
    times = torch.tensor([math.inf if mine[p] is None else mine[p] for p in paths], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return {p: None if math.isinf(t) else float(t) for p, t in zip(paths, times.tolist(), strict=True)}


def _block_medians(calls: list[Callable[[], Any]], first_s: float) -> np.ndarray:
    """Each call's time: the median over rounds of the mean of a block of BLOCK consecutive calls,
    each block after one untimed call, the calls' blocks taking turns within a round. `first_s`:
    the slowest probe, the same on every rank (agreed), which sets the rounds, alike everywhere."""
    rounds = max(2, min(ROUNDS, int(ROUNDS_S / max((BLOCK + 1) * first_s, 1e-9))))
    means = np.zeros((rounds, len(calls)))
    for r in range(rounds):
        for c, call in enumerate(calls):
            call()
            started = time.perf_counter()
            for _ in range(BLOCK):
                call()
            means[r, c] = (time.perf_counter() - started) / BLOCK
    return np.median(means, axis=0)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else float(seconds * 1e3)


def _shown(seconds: float | None) -> str:
    return "(did not finish in time)" if seconds is None else f"{seconds * 1e3:.2f} ms"
