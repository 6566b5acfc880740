"""Launch discovery: who am I, how many are we, and where do we meet.

The launch environment (environments/: mpirun with mpi4py, srun, torchrun, ...) is detected
from the process's variables, or given; it gives rank and sizes, and the ranks agree on rank
0's address and port through it. The result is one frozen Launch, passed everywhere after.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, NoReturn

from ..environments import (
    Environment,
    LaunchError,
    Meeting,
    OpenMPI,
    SingleProcess,
    detect_environment,
    launched_rank,
    launched_world_size,
)
from ..environments.variables import integer_or_none
from ..options import option

__all__ = ["Launch", "LaunchError", "LaunchOptions", "discover_launch", "launched_rank", "launched_world_size"]


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # which launcher was recognised: mpi4py, torchrun, ompi-env, pmi-env, slurm-env, pbs, ..., single
    # MPI joins the ranks (mpirun with mpi4py): the control collectives and, on the CPU, the
    # gradients can go through it, and MPI_Abort ends the job. The environment says so.
    mpi: bool = False
    environment: Environment | None = field(default=None, compare=False, repr=False)
    # The job's secret (parallel/signing.py): never printed, compared or written anywhere.
    secret: bytes = field(default=b"", compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def spans_hosts(self) -> bool:
        return self.local_world_size < self.world_size

    @property
    def init_method(self) -> str:
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"

    def end_job(self, status: int) -> NoReturn:
        """End every rank of the job now, with `status`, as its environment does it (a Launch
        made by hand: MPI_Abort where it says MPI joins the ranks, else this process exits)."""
        environment = self.environment or (OpenMPI({}) if self.mpi else SingleProcess({}))
        environment.end_job(status)


@dataclass(frozen=True)
class LaunchOptions:
    """Where the ranks meet, when the launcher's defaults will not do (the command line's
    rendezvous flags; fit()'s keywords of the same names)."""

    master_addr: str | None = option(None, "rank 0's address for the rendezvous (default: MASTER_ADDR, else "
                                           "chosen by rank 0)")
    master_port: int | None = option(None, "the rendezvous port (default: MASTER_PORT, else a free one rank 0 "
                                           "picks)", kind=int)
    interface: str | None = option(None, "take rank 0's address from this interface, e.g. bond0 or ib0 "
                                         "(default: DDP_ABCI_IFNAME)")


def discover_launch(*, master_addr: str | None = None, master_port: int | None = None, interface: str | None = None,
                    environ: Mapping[str, str] | None = None, environment: Environment | None = None,
                    timeout_s: float = 120.0) -> Launch:
    """Find rank, sizes and the rendezvous point. Explicit arguments beat MASTER_ADDR/MASTER_PORT;
    `environment` (one of environments/, or your own) beats detection from `environ`."""
    env = os.environ if environ is None else environ
    environment = environment or detect_environment(env)
    port = master_port or integer_or_none(env.get("MASTER_PORT"), "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"rendezvous port {port} (--master-port or MASTER_PORT) must be between 1 and 65535")
    meeting = Meeting(master_addr=master_addr or env.get("MASTER_ADDR") or None, master_port=port,
                      interface=interface or env.get("DDP_ABCI_IFNAME") or None, timeout_s=timeout_s)
    ranks = environment.ranks()  # MPI_Init happens here, under mpirun with mpi4py
    addr, port = environment.rendezvous(ranks, meeting)
    secret = environment.share_secret(ranks, addr, port, timeout_s)
    return Launch(ranks.rank, ranks.world_size, ranks.local_rank, ranks.local_world_size, addr, port,
                  environment.source, environment.mpi, environment, secret)
