"""What every launch environment tells the job: who this process is, how many there are,
where rank 0 listens, and how one rank ends the whole job.

A launch environment is one way the ranks of a job get started (mpirun, srun, torchrun, the
scheduler itself, nothing at all). Each is one small class here, as Lightning Fabric's
`plugins/environments/` has; `environments/__init__.py` holds the ordered registry that picks
one, and fit(environment=...) takes your own.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar, Mapping, NoReturn

from ..errors import UsageError


class LaunchError(UsageError):
    """The launch is inconsistent (e.g. several ranks that cannot find each other)."""


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def spans_hosts(self) -> bool:
        return self.local_world_size < self.world_size


@dataclass(frozen=True)
class Meeting:
    """How the ranks should meet, as the caller and the environment variables ask."""

    master_addr: str | None = None   # --master-addr, else MASTER_ADDR
    master_port: int | None = None   # --master-port, else MASTER_PORT
    interface: str | None = None     # --interface, else DDP_ABCI_IFNAME: rank 0's address from it
    timeout_s: float = 120.0         # for a rendezvous that needs the network before the group opens


class Environment:
    """One launcher. Subclasses set `source` and `variables`, and define detect() and
    environ_ranks(); an MPI launcher with mpi4py at hand overrides ranks(), rendezvous()
    and end_job() (environments/mpi.py)."""

    source: ClassVar[str] = ""                  # named in the start-up line: "rendezvous ... (from SOURCE)"
    variables: ClassVar[tuple[str, ...]] = ()   # what it reads (docs, and the environment sniffer)

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ
        # Rank 0's store where the others learned its address (rendezvous.learn_rank0_address):
        # held as long as this object, the launch's, so that the group's store shares its server.
        self.meeting_store: object | None = None
        self.met_first = False  # every rank: the rendezvous met rank 0 at its host first (learn_rank0_address)
        self.secret_path: object | None = None  # rank 0's file of the job's secret, removed at the end

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether this launcher started the process."""
        raise NotImplementedError

    # -- who and how many -------------------------------------------------------------

    def environ_ranks(self) -> Ranks:
        """Rank and sizes from the launcher's variables alone (no MPI_Init)."""
        raise NotImplementedError

    def ranks(self) -> Ranks:
        """Rank and sizes for the job (MPI launchers ask MPI itself)."""
        return self.environ_ranks()

    @property
    def mpi(self) -> bool:
        """Whether MPI (mpi4py's COMM_WORLD) joins the ranks: then the trainer's control
        collectives and, on the CPU, its gradients can go through it."""
        return False

    # -- where rank 0 listens -----------------------------------------------------------

    def rank0_host(self) -> str | None:
        """Rank 0's host as the launcher or the scheduler around it names it, or None."""
        from .schedulers import first_allocated_host  # noqa: PLC0415  (the registry imports this module)

        return first_allocated_host(self.environ)

    def job_port(self) -> int | None:
        """The scheduler's job id as a port: jobs sharing a node differ (schedulers.job_port)."""
        from .schedulers import job_port  # noqa: PLC0415

        return job_port(self.environ)

    def rendezvous(self, ranks: Ranks, meeting: Meeting) -> tuple[str, int]:
        """Rank 0's address and port, the same on every rank, without MPI."""
        from ..parallel import rendezvous  # noqa: PLC0415  (it loads torch's store only when needed)

        if ranks.world_size == 1:
            addr = meeting.master_addr or "127.0.0.1"
            return addr, meeting.master_port or rendezvous.free_port(addr)
        port = meeting.master_port or self.job_port()
        if not port:
            raise LaunchError(f"{ranks.world_size} ranks started by {self.source} and no mpi4py to agree on a port: "
                              "set MASTER_PORT (the same on every rank), or install mpi4py")
        if not ranks.spans_hosts:
            addr = rendezvous.interface_address(meeting.interface) if meeting.interface else None
            return addr or meeting.master_addr or "127.0.0.1", port
        if meeting.master_addr and not meeting.interface:
            return meeting.master_addr, port
        host = meeting.master_addr or self.rank0_host()
        if host is None:
            raise LaunchError(f"{ranks.world_size} ranks started by {self.source} across hosts and nothing names rank "
                              "0's host (no MASTER_ADDR, no scheduler's node list): set MASTER_ADDR to rank 0's host, "
                              "or install mpi4py")
        if not meeting.interface:
            return host, port
        # --interface names the network to meet on, and only rank 0 can read its own address
        # there: the others learn it from rank 0, met first at the host MASTER_ADDR or the
        # scheduler names (torchrun's MASTER_ADDR is often a host name on another network).
        addr, self.meeting_store = rendezvous.learn_rank0_address(ranks, host, port, meeting.interface,
                                                                  meeting.timeout_s)
        self.met_first = True
        return addr, port

    # -- the job's secret -----------------------------------------------------------------

    def share_secret(self, ranks: Ranks, addr: str, port: int, timeout_s: float) -> bytes:
        """The job's secret (parallel/signing.py): rank 0 draws it. Without MPI it leaves it in a
        file only the job's user can read (on the home the nodes share), and the other ranks get
        b"": they fetch it from there once the process group is open (signing.job_secret).
        Raises: LaunchError where rank 0 cannot leave it."""
        from ..parallel import signing  # noqa: PLC0415

        if ranks.world_size == 1 or ranks.rank != 0:
            return signing.draw() if ranks.world_size == 1 else b""
        path = signing.secret_file(addr, port, self.environ)
        secret = signing.draw()
        try:
            signing.leave(secret, path)
        except OSError as e:
            raise LaunchError(f"rank 0 could not leave the job's secret for the other ranks in {path} ({e}): set "
                              "DDP_ABCI_SECRETS_DIR to a folder every node sees, that only you can enter") from None
        self.secret_path = path
        return secret

    # -- the end ------------------------------------------------------------------------

    def end_job(self, status: int) -> NoReturn:
        """End the whole job now with `status`. Here: this process exits, and its launcher
        (torchrun, srun) ends the others; MPI and srun do more (mpi.py, slurm.py)."""
        os._exit(status)

