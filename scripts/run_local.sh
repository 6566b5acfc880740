#!/usr/bin/env bash
# Run the main job on this machine: NPROC ranks (default 2) under the venv's mpirun.
# Extra arguments go to the trainer, e.g. scripts/run_local.sh --epochs 20 --amp bf16
set -euo pipefail
cd "$(dirname "$0")/.."
NPROC=${NPROC:-2}
# Open MPI refuses to start as root without these; they belong to the launch, not the library.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI 5 from pip: naming the transports cuts MPI_Init from 1.1 s to 0.1 s per rank
# here (measured); sm for ranks on one host, tcp between hosts.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm,tcp}
exec .venv/bin/mpirun -n "$NPROC" --oversubscribe .venv/bin/python -m ddp_abci.train "$@"
