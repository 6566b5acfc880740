"""What each rank is and has: host, versions, devices, threads and cores, free memory; and the
clocks, each host's offset from rank 0's (the deadline and the watchdog read them)."""
from __future__ import annotations

import os
import platform
import socket
import time

import torch

from ..environments.mpi import have_mpi4py
from ..parallel.collectives import all_ranks
from ..parallel.launch import Launch

ALLOCATION = ("SLURM_CPUS_ON_NODE", "NCPUS", "NSLOTS")  # Slurm, PBS, Grid Engine: the CPUs a job got


def rank_facts(launch: Launch, device: torch.device) -> dict:
    mpi, library = None, None
    if have_mpi4py():
        import mpi4py  # noqa: PLC0415  (optional)

        mpi = mpi4py.__version__
        if launch.mpi:
            from mpi4py import MPI  # noqa: PLC0415

            library = MPI.Get_library_version().splitlines()[0].strip()
    cuda = device.type == "cuda"
    return {
        "rank": launch.rank, "host": socket.gethostname(), "local_rank": launch.local_rank,
        "python": platform.python_version(), "torch": torch.__version__, "mpi4py": mpi, "mpi_library": library,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else ["cpu"],
        "threads": torch.get_num_threads(), "cores_bound": len(os.sched_getaffinity(0)),
        "host_cpus": os.cpu_count(), "allocated": next((os.environ[v] for v in ALLOCATION if v in os.environ), None),
        "free_memory_mib": _free_memory_mib(),
    }


def _free_memory_mib() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def gather_facts(launch: Launch, device: torch.device) -> list[dict]:
    """Collective: every rank's facts, in rank order."""
    return all_ranks(rank_facts(launch, device))


def clock_offsets(launch: Launch) -> list[dict]:
    """Collective: each rank's wall clock against rank 0's, read at once after a barrier (the
    figure includes how unevenly the barrier lets the ranks go: a millisecond or so)."""
    from ..parallel.collectives import wait_for_everyone  # noqa: PLC0415

    wait_for_everyone()
    seen = all_ranks((socket.gethostname(), time.time()))
    return [{"rank": r, "host": host, "offset_s": round(t - seen[0][1], 6)} for r, (host, t) in enumerate(seen)]
