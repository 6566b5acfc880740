#!/usr/bin/env bash
# Per-rank wrapper for the Accelerate variant on GPUs (the seed's python.bash, fixed):
# Accelerate's GPU path reads torchrun's variables, so copy Open MPI's into them.
#   mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=$PORT ... scripts/accelerate_env.sh python -m ddp_abci.accelerate_variant
# The raw trainer needs none of this: mpi4py gives it rank, size and the address.
set -euo pipefail
: "${OMPI_COMM_WORLD_RANK:?start this under the mpirun of Open MPI}"
: "${MASTER_ADDR:?pass the host of rank 0: mpirun -x MASTER_ADDR=HOST}"
export RANK=$OMPI_COMM_WORLD_RANK
export WORLD_SIZE=$OMPI_COMM_WORLD_SIZE
export LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK
export LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE
# Not a fixed port (the seed's 11111): two jobs sharing a node would collide.
job=${PBS_JOBID:-${JOB_ID:-${SLURM_JOB_ID:-0}}}
export MASTER_PORT=${MASTER_PORT:-$((10000 + ${job%%.*} % 50000))}
exec "$@"
