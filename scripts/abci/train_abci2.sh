#!/bin/bash
# ddp_abci on ABCI 2.0-style Grid Engine sites (the seed document's setting). Submit from the repo root:
#   qsub -g GROUP -l rt_AF=2 -l h_rt=1:00:00 -l s_rt=0:57:00 scripts/abci/train_abci2.sh
# or scripts/submit.sh abci2 -g GROUP -n 2 -t 1:00:00 [-c N]. Settings: docs/abci.md, "Reference".
# Outside Grid Engine: NODEFILE=file-of-hosts CONTAINER=none NPROC_PER_NODE=2 bash scripts/abci/train_abci2.sh
#$ -l rt_AF=1
#$ -l h_rt=1:00:00
# s_rt: Grid Engine ends a job at h_rt with SIGKILL, no warning; at s_rt it sends SIGUSR1,
# which stops the ranks with a checkpoint. The trainer's --stop-at (from s_rt) comes first.
#$ -l s_rt=0:57:00
#$ -j y
#$ -cwd
set -euo pipefail
REPO=${DDP_ABCI_REPO:-$(cd "$(dirname "$0")/../.." 2>/dev/null && [ -d ddp_abci ] && pwd || echo "${SGE_O_WORKDIR:-$PWD}")}
SITE=abci2
# shellcheck source=scripts/lib/job_common.sh
source "$REPO/scripts/lib/job_common.sh"
cd "$REPO"
CONTAINER=${CONTAINER:-$REPO/ddp_abci.sif}
MODULES=${MODULES-hpcx/2.12 singularitypro/3.11}
export CONTAINER MODULES
run_job "$@"
