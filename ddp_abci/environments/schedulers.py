"""The batch schedulers around a job: PBS Professional (ABCI 3.0), Grid Engine (ABCI 2.0)
and Slurm. Each is also a launch environment of its own, for the process a job script runs
directly (one rank); for the launchers inside a job, a scheduler gives two things: its job
id, as the rendezvous port of jobs that share a node, and its node list, whose first host is
where mpirun and srun place rank 0.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Mapping

from .base import Environment, Ranks


class SchedulerJob(Environment):
    """A job script's own process under a scheduler: one rank."""

    job_variable: ClassVar[str] = ""

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return cls.job_variable in environ

    def environ_ranks(self) -> Ranks:
        return Ranks(0, 1, 0, 1)

    @classmethod
    def job_number(cls, environ: Mapping[str, str]) -> int | None:
        """The job id's number: '1234.pbs1' (PBS), '1234[5].pbs1' (a PBS array job), '1234'."""
        digits = environ.get(cls.job_variable, "").split(".")[0].split("[")[0]
        return int(digits) if digits.isdigit() else None

    @classmethod
    def first_host(cls, environ: Mapping[str, str]) -> str | None:
        """The first host of the job's node list, or None."""
        return None


class PBSJob(SchedulerJob):
    """PBS Professional (ABCI 3.0): PBS_JOBID, and PBS_NODEFILE with one line per MPI slot."""

    source = "pbs"
    job_variable = "PBS_JOBID"
    variables = ("PBS_JOBID", "PBS_NODEFILE")

    @classmethod
    def first_host(cls, environ: Mapping[str, str]) -> str | None:
        return _first_line(environ.get("PBS_NODEFILE"))


class GridEngineJob(SchedulerJob):
    """Grid Engine (ABCI 2.0): JOB_ID, with SGE_ROOT or a parallel environment's PE_HOSTFILE
    ("host slots queue processors" lines); ABCI's SGE_JOB_HOSTLIST, one host a line."""

    source = "grid-engine"
    job_variable = "JOB_ID"
    variables = ("JOB_ID", "PE_HOSTFILE", "SGE_JOB_HOSTLIST")

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        # JOB_ID alone is too common a name to mean Grid Engine.
        return "JOB_ID" in environ and any(v in environ for v in ("SGE_ROOT", "PE_HOSTFILE", "SGE_JOB_HOSTLIST"))

    @classmethod
    def first_host(cls, environ: Mapping[str, str]) -> str | None:
        return _first_line(environ.get("SGE_JOB_HOSTLIST") or environ.get("PE_HOSTFILE"))


class SlurmJob(SchedulerJob):
    """A Slurm batch script's own process: SLURM_JOB_ID, and SLURM_JOB_NODELIST ("h[1-2]")."""

    source = "slurm-job"
    job_variable = "SLURM_JOB_ID"
    variables = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST")

    @classmethod
    def first_host(cls, environ: Mapping[str, str]) -> str | None:
        nodes = environ.get("SLURM_JOB_NODELIST")
        return first_host_of_list(nodes) if nodes else None


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


def first_host_of_list(hostlist: str) -> str:
    """The first host of a Slurm host list: 'h1', 'h[1-2,5]' -> 'h1', 'a[07-09],b1' -> 'a07'."""
    first = re.split(r",(?![^\[]*\])", hostlist.strip())[0]
    match = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", first)
    if not match:
        return first
    prefix, ranges, suffix = match.groups()
    return prefix + ranges.split(",")[0].split("-")[0] + suffix


def _first_line(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with Path(path).open() as f:
            for line in f:
                if line.split():
                    return line.split()[0]
    except OSError:
        return None
    return None
