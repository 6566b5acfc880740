"""A batch scheduler's own process as a launch environment: PBS Professional (ABCI 3.0), Grid
Engine (ABCI 2.0) and Slurm batch jobs, one rank each. What a scheduler is (detection, the job
id, the node list) is cluster/schedulers.py's; for the launchers inside a job it gives two
things: its job id, as the rendezvous port of jobs that share a node, and its node list, whose
first host is where mpirun and srun place rank 0.
"""
from __future__ import annotations

from typing import ClassVar, Mapping

from ..cluster.schedulers import PBS, GridEngine, Scheduler, Slurm
from .base import Environment, Ranks


class SchedulerJob(Environment):
    """A job script's own process under a scheduler: one rank."""

    scheduler: ClassVar[type[Scheduler]] = Scheduler

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return cls.scheduler.detect(environ)

    def environ_ranks(self) -> Ranks:
        return Ranks(0, 1, 0, 1)

    @classmethod
    def job_number(cls, environ: Mapping[str, str]) -> int | None:
        return cls.scheduler.job_number(environ)

    @classmethod
    def first_host(cls, environ: Mapping[str, str]) -> str | None:
        return cls.scheduler.first_host(environ)


class PBSJob(SchedulerJob):
    source, scheduler, variables = "pbs", PBS, ("PBS_JOBID", "PBS_NODEFILE")


class GridEngineJob(SchedulerJob):
    source, scheduler, variables = "grid-engine", GridEngine, ("JOB_ID", "PE_HOSTFILE", "SGE_JOB_HOSTLIST")


class SlurmJob(SchedulerJob):
    source, scheduler, variables = "slurm-job", Slurm, ("SLURM_JOB_ID", "SLURM_JOB_NODELIST")


SCHEDULERS = (PBSJob, GridEngineJob, SlurmJob)


def job_port(environ: Mapping[str, str]) -> int | None:
    """Jobs sharing a node get different ports: 10000 + job id % 50000. The one formula: the
    launch environments and the Accelerate variant's environment mapping (compare/accelerate_env.py)
    call it. Returns None outside a scheduler's job."""
    for scheduler in SCHEDULERS:
        number = scheduler.job_number(environ)
        if number is not None:
            return 10000 + number % 50000
    return None


def first_allocated_host(environ: Mapping[str, str]) -> str | None:
    """The first host of the scheduler's node list: where mpirun (by slot or by node over the
    job script's host file, written in node-list order) and srun place rank 0."""
    for scheduler in SCHEDULERS:
        if scheduler.detect(environ):
            host = scheduler.first_host(environ)
            if host:
                return host
    return None
