"""Slurm's srun: every task of the job step is a rank (SLURM_PROCID, SLURM_STEP_NUM_TASKS).

A batch script's own process (SLURM_JOB_ID without a step's variables) is not a rank of a
step: it is schedulers.SlurmJob, one process.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping, NoReturn

from ..cluster.schedulers import expand_hostlist
from .base import Ranks
from .mpi import MPILauncher, have_mpi4py
from .variables import integer


class Srun(MPILauncher):
    """srun's tasks. Started with --mpi=pmix (PMIX_RANK set) and mpi4py at hand, MPI joins
    them as under mpirun."""

    environ_source = "slurm-env"
    # SLURM_STEP_NUM_TASKS is set by srun only: inside the batch script itself SLURM_NTASKS
    # describes the allocation, not this process.
    size_variable = "SLURM_STEP_NUM_TASKS"
    variables = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE",
                 "SLURM_STEP_NODELIST")

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return "SLURM_STEP_NUM_TASKS" in environ and "SLURM_PROCID" in environ

    @property
    def mpi(self) -> bool:
        return "PMIX_RANK" in self.environ and have_mpi4py()

    def environ_ranks(self) -> Ranks:
        world = integer(self.environ, "SLURM_STEP_NUM_TASKS")
        per_node = self.environ.get("SLURM_STEP_TASKS_PER_NODE", str(world))
        local_world = int(per_node.split("(")[0].split(",")[0])  # "4(x2)" -> 4
        return Ranks(integer(self.environ, "SLURM_PROCID"), world, integer(self.environ, "SLURM_LOCALID"), local_world)

    def rank0_host(self) -> str | None:
        """srun places task 0 on the step's first node (its default block distribution)."""
        nodes = self.environ.get("SLURM_STEP_NODELIST") or self.environ.get("SLURM_JOB_NODELIST")
        return expand_hostlist(nodes)[0] if nodes else super().rank0_host()

    def end_job(self, status: int) -> NoReturn:
        """Under srun a task's exit leaves the others running (Slurm's KillOnBadExit is off by
        default), waiting in their next collective: cancel the whole step first."""
        if not self.mpi and shutil.which("scancel") and "SLURM_JOB_ID" in self.environ:
            step = f"{self.environ['SLURM_JOB_ID']}.{self.environ.get('SLURM_STEP_ID', '0')}"
            try:
                subprocess.run(["scancel", "--signal=KILL", step], timeout=10, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired):
                pass
            os._exit(status)
        super().end_job(status)
