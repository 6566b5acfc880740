#!/usr/bin/env bash
# Benchmark wrapper: raw DDP against its peers (Accelerate, Fabric, the textbook script), each
# round a fresh mpirun.
# Arguments go to `python -m ddp_abci.bench` (see --help). On a cluster node, run it inside
# a job (e.g. after the module loads of scripts/abci/train_abci3.sh) with PYTHON set.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI 5 from pip: naming the transports cuts MPI_Init from 1.1 s to 0.1 s per rank
# here (measured); sm for ranks on one host, tcp between hosts.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm,tcp}  # harmless when not root
if [ "${DRY_RUN:-}" = 1 ]; then  # print the command instead of running it
    echo "dry run: $(printf '%q ' "$PYTHON" -m ddp_abci.bench "$@")"
    exit 0
fi
exec "$PYTHON" -m ddp_abci.bench "$@"
