"""MPI launchers: Open MPI's mpirun (OMPI_COMM_WORLD_*), and MPICH's or Intel MPI's Hydra
(PMI_*). With mpi4py at hand, MPI itself gives rank, size and the ranks sharing this node,
rank 0 broadcasts the rendezvous it chose, and MPI_Abort ends the job; without it, the
launcher's variables give the ranks and the rendezvous is as for any launcher (base.py).
"""
from __future__ import annotations

import os
import threading
from typing import Mapping, NoReturn

from ..errors import UsageError
from .base import Environment, LaunchError, Meeting, Ranks
from .torchrun import TorchRun
from .variables import integer


def have_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401, PLC0415  (optional: the package works without it)
    except ImportError:
        return False
    return True


class MPILauncher(Environment):
    """What Open MPI and MPICH share: everything but their variables' names."""

    size_variable = ""  # the world size as the launcher sets it (mpi4py's own is checked against it)

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """The launcher's size variable. With mpi4py, MPI answers for the process whatever else
        its environment says (Accelerate copies RANK and WORLD_SIZE into it); without, torchrun's
        variables, where present, are a launcher started inside this one (torchrun.py)."""
        return cls.size_variable in environ and (have_mpi4py() or not TorchRun.detect(environ))

    @property
    def mpi(self) -> bool:
        return have_mpi4py()

    @property
    def source(self) -> str:  # type: ignore[override]  (the start-up line's name: which path was taken)
        return "mpi4py" if self.mpi else self.environ_source

    environ_source = ""

    def ranks(self) -> Ranks:
        if not self.mpi:
            return self.environ_ranks()
        from mpi4py import MPI  # noqa: PLC0415

        comm = MPI.COMM_WORLD
        expected = integer(self.environ, self.size_variable)
        if expected != comm.Get_size():
            # mpi4py built against another MPI than the mpirun that started us sees a
            # singleton world: without this check every rank would train alone.
            raise LaunchError(f"mpirun started {expected} ranks but mpi4py sees a world of {comm.Get_size()}: "
                              "mpi4py is built against a different MPI; reinstall it against the mpirun you use")
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local = (node.Get_rank(), node.Get_size())
        node.Free()
        return Ranks(comm.Get_rank(), comm.Get_size(), *local)

    def rendezvous(self, ranks: Ranks, meeting: Meeting) -> tuple[str, int]:
        """Rank 0 chooses and broadcasts: only it can tell whether the job spans hosts (its
        node holds fewer than all ranks) and check that it can listen. Any failure on rank 0
        travels in the broadcast too: the others are already waiting in it."""
        if not self.mpi:
            return super().rendezvous(ranks, meeting)
        from mpi4py import MPI  # noqa: PLC0415

        from ..parallel import rendezvous  # noqa: PLC0415

        choice = None
        if ranks.rank == 0:
            try:
                chosen = rendezvous.choose_master_addr(spans_hosts=ranks.spans_hosts, addr=meeting.master_addr,
                                                       interface=meeting.interface)
                rendezvous.check_bindable(chosen, meeting.master_port or 0)
                choice = (chosen, meeting.master_port or rendezvous.free_port(chosen), None)
            except Exception as e:
                error = str(e) if isinstance(e, UsageError) else f"rank 0 could not choose the rendezvous: {e!r}"
                choice = (None, None, error)
        chosen, port, error = MPI.COMM_WORLD.bcast(choice, root=0)
        if error:
            raise rendezvous.AddressUnusable(error)
        return chosen, port

    def share_secret(self, ranks: Ranks, addr: str, port: int, timeout_s: float) -> bytes:
        """Over MPI: rank 0's draw broadcast, never leaving the processes' memory."""
        if not self.mpi:
            return super().share_secret(ranks, addr, port, timeout_s)
        from mpi4py import MPI  # noqa: PLC0415

        from ..parallel import signing  # noqa: PLC0415

        return MPI.COMM_WORLD.bcast(signing.draw() if ranks.rank == 0 else None, root=0)

    def end_job(self, status: int) -> NoReturn:
        """MPI_Abort makes mpirun SIGKILL every rank (measured: a SIGSTOPped peer too) and exit
        with `status`; a raise would leave a frozen or waiting peer behind."""
        if self.mpi:
            from mpi4py import MPI  # noqa: PLC0415

            # MPI_Abort waits for mpirun to take the job down; cut off from another host, that
            # wait has no end (measured: a partition between two hosts): this rank leaves anyway.
            threading.Timer(5.0, os._exit, args=(status,)).start()
            MPI.COMM_WORLD.Abort(status)
        os._exit(status)


class OpenMPI(MPILauncher):
    """Open MPI's mpirun (prterun in Open MPI 5; HPC-X on ABCI)."""

    environ_source = "ompi-env"
    size_variable = "OMPI_COMM_WORLD_SIZE"
    variables = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE")

    def environ_ranks(self) -> Ranks:
        return Ranks(*(integer(self.environ, var) for var in self.variables))


class MPICH(MPILauncher):
    """MPICH's and Intel MPI's Hydra (mpiexec.hydra, mpirun of Intel MPI), which set PMI_*."""

    environ_source = "pmi-env"
    size_variable = "PMI_SIZE"
    variables = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")

    def environ_ranks(self) -> Ranks:
        world = integer(self.environ, "PMI_SIZE")
        return Ranks(integer(self.environ, "PMI_RANK"), world, integer(self.environ, "MPI_LOCALRANKID", 0),
                     integer(self.environ, "MPI_LOCALNRANKS", world))
