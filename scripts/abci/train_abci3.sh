#!/bin/bash
# ddp_abci on ABCI 3.0 (PBS Professional, H200 nodes with 8 GPUs). Submit from the repo root:
#   qsub -P GROUP -q rt_HF -l select=2:mpiprocs=8 -l walltime=01:00:00 scripts/abci/train_abci3.sh
#   qsub -P GROUP -q rt_HF -l select=2:mpiprocs=8 -v CKPT_DIR=/groups/GROUP/runs/a,TRAIN_ARGS="--epochs 50" scripts/abci/train_abci3.sh
# or scripts/submit.sh abci3 -g GROUP -n 2 -t 01:00:00 [-c N]. Settings: docs/abci.md, "Reference".
# Outside PBS (a test): NODEFILE=file-of-hosts CONTAINER=none NPROC_PER_NODE=2 bash scripts/abci/train_abci3.sh
#PBS -q rt_HF
#PBS -l select=1:mpiprocs=8
#PBS -l walltime=01:00:00
#PBS -j oe
#PBS -N ddp_abci
set -euo pipefail
# PBS runs a copy of this script from its spool: find the checkout from where qsub ran.
REPO=${DDP_ABCI_REPO:-$(cd "$(dirname "$0")/../.." 2>/dev/null && [ -d ddp_abci ] && pwd || echo "${PBS_O_WORKDIR:-$PWD}")}
SITE=abci3
# shellcheck source=scripts/lib/job_common.sh
source "$REPO/scripts/lib/job_common.sh"
cd "$REPO"
CONTAINER=${CONTAINER:-$REPO/ddp_abci.sif}
MODULES=${MODULES-hpcx/2.20}   # the host's mpirun; CUDA and NCCL come with the image
[ "$CONTAINER" = none ] && MODULES=${MODULES_NO_CONTAINER-$MODULES}
export CONTAINER MODULES
run_job "$@"
