"""Launch discovery: who am I, how many are we, and where do we meet.

mpi4py is the primary source (the job is started by mpirun): it gives rank, size and
the ranks sharing this node, and rank 0 broadcasts the rendezvous address and port it
chose. Without mpi4py or outside MPI the launcher's environment variables are read,
in the order torchrun, Open MPI, MPICH/Intel MPI (PMI), Slurm; with none, one process.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..errors import UsageError
from ..options import option
from . import rendezvous


class LaunchError(UsageError):
    """The launch is inconsistent (e.g. several ranks that cannot find each other)."""


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # which launcher was recognised: mpi4py, torchrun, ompi-env, pmi-env, slurm-env, single

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


# Variables an MPI launcher sets in every rank: their presence means "started by mpirun".
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
_JOB_ID_VARS = ("PBS_JOBID", "JOB_ID", "SLURM_JOB_ID")


def discover_launch(
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
    interface: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Launch:
    """Find rank, sizes and the rendezvous point. Explicit arguments beat MASTER_ADDR/MASTER_PORT."""
    env = os.environ if environ is None else environ
    interface = interface or env.get("DDP_ABCI_IFNAME") or None
    addr = master_addr or env.get("MASTER_ADDR") or None
    port = master_port or _int_or_none(env.get("MASTER_PORT"), "MASTER_PORT")
    if port is not None and not 0 < port < 65536:
        raise LaunchError(f"rendezvous port {port} (--master-port or MASTER_PORT) must be between 1 and 65535")
    if any(v in env for v in _MPI_SIZE_VARS) and _have_mpi4py():
        return _from_mpi4py(env, addr, port, interface)
    for source, read in (("torchrun", _torchrun), ("ompi-env", _ompi), ("pmi-env", _pmi), ("slurm-env", _slurm)):
        ranks = read(env)
        if ranks is not None:
            return _from_env(source, ranks, env, addr, port, interface)
    return _single(addr, port)


def _have_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def _from_mpi4py(env: Mapping[str, str], addr: str | None, port: int | None, interface: str | None) -> Launch:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    expected = _launched_size(env)
    if expected is not None and expected != size:
        # mpi4py built against another MPI than the mpirun that started us sees a
        # singleton world: without this check every rank would train alone.
        raise LaunchError(
            f"mpirun started {expected} ranks but mpi4py sees a world of {size}: "
            "mpi4py is built against a different MPI; reinstall it against the mpirun you use"
        )
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    # Only rank 0 can tell whether the job spans hosts (its node holds fewer than all ranks),
    # and only rank 0 can check that it can listen; the verdict travels with the broadcast.
    # Any failure on rank 0 must travel too: the others are already waiting in bcast.
    choice = None
    if rank == 0:
        try:
            chosen = rendezvous.choose_master_addr(spans_hosts=local_size < size, addr=addr, interface=interface)
            rendezvous.check_bindable(chosen, port or 0)
            choice = (chosen, port or rendezvous.free_port(chosen), None)
        except Exception as e:
            error = str(e) if isinstance(e, UsageError) else f"rank 0 could not choose the rendezvous: {e!r}"
            choice = (None, None, error)
    chosen, chosen_port, error = comm.bcast(choice, root=0)
    if error:
        raise rendezvous.AddressUnusable(error)
    return Launch(rank, size, local_rank, local_size, chosen, chosen_port, "mpi4py")


def _launched_size(env: Mapping[str, str]) -> int | None:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if var in env:
            return _int_or_none(env[var], var)
    return None


# The environment sniffer, for the moments before (or without) a Launch: each launcher's
# rank and world-size variables, in the order discover_launch reads them.
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK", "SLURM_PROCID")
_WORLD_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def launched_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as its launcher's variables say (0 without a launcher), read
    without MPI: where an error must be printed once before the launch is discovered."""
    env = os.environ if environ is None else environ
    return next((int(env[v]) for v in _RANK_VARS if env.get(v, "").isdigit()), 0)


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many ranks the launcher started, as its variables say (1 without a launcher)."""
    env = os.environ if environ is None else environ
    return next((int(env[v]) for v in _WORLD_VARS if env.get(v, "").isdigit()), 1)


# Each reader returns (rank, world, local_rank, local_world) or None when its launcher is absent.
def _torchrun(env: Mapping[str, str]):
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = _int(env, "WORLD_SIZE")
    return _int(env, "RANK"), world, _int(env, "LOCAL_RANK", 0), _int(env, "LOCAL_WORLD_SIZE", world)


def _ompi(env: Mapping[str, str]):
    if "OMPI_COMM_WORLD_SIZE" not in env:
        return None
    return (_int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"))


def _pmi(env: Mapping[str, str]):
    if "PMI_SIZE" not in env:
        return None
    world = _int(env, "PMI_SIZE")
    return _int(env, "PMI_RANK"), world, _int(env, "MPI_LOCALRANKID", 0), _int(env, "MPI_LOCALNRANKS", world)


def _slurm(env: Mapping[str, str]):
    # SLURM_STEP_NUM_TASKS is set by srun only: inside the batch script itself
    # SLURM_NTASKS describes the allocation, not this process.
    if "SLURM_STEP_NUM_TASKS" not in env:
        return None
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env["SLURM_STEP_NUM_TASKS"])
    local_world = int(per_node.split("(")[0].split(",")[0])  # "4(x2)" -> 4
    return _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS"), _int(env, "SLURM_LOCALID"), local_world


def _from_env(source: str, ranks, env: Mapping[str, str], addr: str | None, port: int | None,
              interface: str | None) -> Launch:
    rank, world, local_rank, local_world = ranks
    if world == 1:
        return _single(addr, port, source)
    spans = local_world < world
    if not addr:
        if spans and not interface:
            raise LaunchError(
                f"{world} ranks started by {source} across hosts and no mpi4py to share rank 0's "
                "address: set MASTER_ADDR to rank 0's host, or install mpi4py"
            )
        addr = rendezvous.interface_address(interface) if interface else "127.0.0.1"
    if not port:
        port = port_from_job_id(env)
    if not port:
        raise LaunchError(
            f"{world} ranks started by {source} and no mpi4py to agree on a port: "
            "set MASTER_PORT (the same on every rank), or install mpi4py"
        )
    return Launch(rank, world, local_rank, local_world, addr, port, source)


def port_from_job_id(env: Mapping[str, str]) -> int | None:
    """Jobs sharing a node get different ports: 10000 + job id % 50000 (ids like '1234.pbs1' too)."""
    for var in _JOB_ID_VARS:
        digits = env.get(var, "").split(".")[0].split("[")[0]
        if digits.isdigit():
            return 10000 + int(digits) % 50000
    return None


def _single(addr: str | None, port: int | None, source: str = "single") -> Launch:
    addr = addr or "127.0.0.1"
    return Launch(0, 1, 0, 1, addr, port or rendezvous.free_port(addr), source)


def _int(env: Mapping[str, str], var: str, default: int | None = None) -> int:
    if var not in env and default is not None:
        return default
    value = _int_or_none(env.get(var), var)
    if value is None:
        raise LaunchError(f"{var} is not set but the launcher's other variables are; set it or unset them")
    return value


def _int_or_none(value: str | None, var: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{var}={value!r} is not an integer; fix or unset it") from None
