"""torchrun (torch.distributed.run), or anything that sets its variables."""
from __future__ import annotations

from typing import Mapping

from .base import Environment, Ranks
from .variables import integer


class TorchRun(Environment):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; MASTER_ADDR and MASTER_PORT are
    torchrun's too. Without mpi4py, tried before the MPI launchers' variables: torchrun
    started inside an mpirun job (one agent per node) sees the node's OMPI_* variables as
    well, and its own are the process's."""

    source = "torchrun"
    variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return "RANK" in environ and "WORLD_SIZE" in environ

    def environ_ranks(self) -> Ranks:
        world = integer(self.environ, "WORLD_SIZE")
        return Ranks(integer(self.environ, "RANK"), world, integer(self.environ, "LOCAL_RANK", 0),
                     integer(self.environ, "LOCAL_WORLD_SIZE", world))
