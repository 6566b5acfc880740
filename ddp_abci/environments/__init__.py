"""Launch environments: one small class per way the ranks of a job get started, each saying
how it is detected, how it gives rank, sizes and rank 0's address, and how it ends the job.

    ENVIRONMENTS     the registry, in the order detect_environment() tries it
    TorchRun         torchrun's RANK, WORLD_SIZE, ...            torchrun.py
    OpenMPI, MPICH   mpirun (OMPI_COMM_WORLD_*), Hydra (PMI_*)   mpi.py: mpi4py when at hand
    Srun             Slurm's srun (SLURM_PROCID, ...)            slurm.py
    PBSJob, GridEngineJob, SlurmJob                              schedulers.py: a job script's own process
    SingleProcess    nothing at all                              single.py

A launcher of your own: subclass Environment (base.py), define detect() and environ_ranks()
(and rank0_host(), end_job() where it knows better), then pass an instance to
fit(environment=...) or discover_launch(environment=...).
"""
from __future__ import annotations

import os
from typing import Mapping

from .base import Environment, LaunchError, Meeting, Ranks
from .mpi import MPICH, OpenMPI
from .schedulers import GridEngineJob, PBSJob, SlurmJob, job_port
from .single import SingleProcess
from .slurm import Srun
from .torchrun import TorchRun

# MPI first where mpi4py can ask it (mpi.py says when torchrun's variables win instead); srun
# --mpi=pmi2 sets PMI_* and is then MPICH's kind of MPI; a scheduler's own process last.
ENVIRONMENTS: tuple[type[Environment], ...] = (OpenMPI, MPICH, TorchRun, Srun, PBSJob, GridEngineJob, SlurmJob,
                                               SingleProcess)

__all__ = ["ENVIRONMENTS", "Environment", "GridEngineJob", "LaunchError", "MPICH", "Meeting", "OpenMPI", "PBSJob",
           "Ranks", "SingleProcess", "SlurmJob", "Srun", "TorchRun", "detect_environment", "job_port",
           "launched_rank", "launched_world_size", "rank_variables"]


def detect_environment(environ: Mapping[str, str] | None = None) -> Environment:
    """The first environment of the registry that detects itself in `environ`."""
    env = os.environ if environ is None else environ
    return next(cls(env) for cls in ENVIRONMENTS if cls.detect(env))


def _sniffed(environ: Mapping[str, str] | None) -> Ranks:
    try:
        return detect_environment(environ).environ_ranks()
    except LaunchError:
        return Ranks(0, 1, 0, 1)


def launched_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as its launcher's variables say (0 without a launcher), read
    without MPI: where an error must be printed once before the launch is discovered."""
    return _sniffed(environ).rank


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many ranks the launcher started, as its variables say (1 without a launcher)."""
    return _sniffed(environ).world_size


def rank_variables(launch: object = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE as torchrun sets them, for libraries
    that read them when they are built (MosaicML's StreamingDataset); with a Launch
    (discover_launch()), MASTER_ADDR and MASTER_PORT too, where such a library opens a process
    group of its own. Nothing is set here: `os.environ.update(rank_variables(launch))` does it."""
    ranks = launch if launch is not None else _sniffed(environ)
    names = {"RANK": ranks.rank, "WORLD_SIZE": ranks.world_size, "LOCAL_RANK": ranks.local_rank,
             "LOCAL_WORLD_SIZE": ranks.local_world_size}
    if launch is not None:
        names.update(MASTER_ADDR=launch.master_addr, MASTER_PORT=launch.master_port)
    return {key: str(value) for key, value in names.items()}
