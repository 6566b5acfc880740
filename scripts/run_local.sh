#!/usr/bin/env bash
# Run the main job on this machine: NPROC ranks (default 2) under the venv's mpirun.
# Extra arguments go to the trainer, e.g. scripts/run_local.sh --epochs 20 --ckpt-dir runs/a
# Ctrl-C stops the job cleanly: the ranks finish their step, save (with --ckpt-dir), say
# where, and the job exits 75; a second Ctrl-C ends it at once.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
REPO=$PWD
# shellcheck source=scripts/lib/job_common.sh
source scripts/lib/job_common.sh  # run_stoppable
NPROC=${NPROC:-2}
# Open MPI refuses to start as root without these; they belong to the launch, not the library.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI 5 from pip: naming the transports cuts MPI_Init by about a second per rank
# here (docs/benchmark.md); sm for ranks on one host, tcp between hosts.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm,tcp}
cmd=(.venv/bin/mpirun -n "$NPROC" --oversubscribe --stdin none .venv/bin/python -m ddp_abci.train "$@")
if [ "${DRY_RUN:-}" = 1 ]; then  # print the command instead of running it
    echo "dry run: $(printf '%q ' "${cmd[@]}")"
    exit 0
fi
run_stoppable "${cmd[@]}"
