"""`python -m ddp_abci.compare.accelerate_env CMD...`: run CMD (one rank of the Accelerate variant)
with torchrun's variables copied from Open MPI's. Accelerate's GPU path reads RANK,
WORLD_SIZE, LOCAL_RANK; mpirun sets OMPI_COMM_WORLD_*. The benchmark uses this module;
job scripts call it the same way. The raw trainer needs neither:
mpi4py gives it rank, size and rank 0's address.
"""
from __future__ import annotations

import os
import sys

from ..environments import job_port

COPIES = {"RANK": "OMPI_COMM_WORLD_RANK", "WORLD_SIZE": "OMPI_COMM_WORLD_SIZE",
          "LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_WORLD_SIZE": "OMPI_COMM_WORLD_LOCAL_SIZE"}


def torchrun_environment(environ: dict[str, str]) -> dict[str, str]:
    """A copy of `environ` with torchrun's variables added (the caller's MASTER_PORT wins)."""
    missing = [ompi for ompi in COPIES.values() if ompi not in environ]
    if missing or "MASTER_ADDR" not in environ:
        raise SystemExit(f"error: start this under Open MPI's mpirun with -x MASTER_ADDR=<rank 0's host> "
                         f"(missing: {', '.join(missing) or 'MASTER_ADDR'})")
    env = dict(environ, **{torchrun: environ[ompi] for torchrun, ompi in COPIES.items()})
    env.setdefault("MASTER_PORT", str(job_port(environ) or 29500))  # never the seed's fixed 11111
    return env


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit("error: name the command to run, e.g. python -m ddp_abci.accelerate_variant")
    os.execvpe(argv[0], argv, torchrun_environment(dict(os.environ)))


if __name__ == "__main__":
    main()
