#!/bin/bash
# ddp_abci on ABCI 2.0-style Grid Engine sites (the seed document's setting). Submit from the repo root:
#   qsub -g GROUP -l rt_AF=2 -l h_rt=1:00:00 -l s_rt=0:57:00 scripts/abci/train_abci2.sh
# or scripts/submit.sh abci2 -g GROUP -n 2 -t 1:00:00 [-c N]. Settings: scripts/lib/job_common.sh.
# Outside Grid Engine: NODEFILE=file-of-hosts CONTAINER=none NPROC_PER_NODE=2 bash scripts/abci/train_abci2.sh
#$ -l rt_AF=1
#$ -l h_rt=1:00:00
# s_rt: Grid Engine ends a job at h_rt with SIGKILL, no warning; at s_rt it sends SIGUSR1,
# which stops the ranks with a checkpoint. The trainer's --stop-after (from s_rt) comes first.
#$ -l s_rt=0:57:00
#$ -j y
#$ -cwd
set -euo pipefail
REPO=${DDP_ABCI_REPO:-$(cd "$(dirname "$0")/../.." 2>/dev/null && [ -d ddp_abci ] && pwd || echo "${SGE_O_WORKDIR:-$PWD}")}
# shellcheck source=scripts/lib/job_common.sh
source "$REPO/scripts/lib/job_common.sh"
cd "$REPO"

# ABCI's SGE_JOB_HOSTLIST, else Grid Engine's own PE_HOSTFILE ("host slots queue ..." lines);
# a job without a parallel environment runs on its own host.
NODEFILE=${NODEFILE:-${SGE_JOB_HOSTLIST:-${PE_HOSTFILE:-}}}
if [ -z "$NODEFILE" ] && [ -n "${JOB_ID:-}" ]; then
    job_tmp NODEFILE nodes
    hostname >"$NODEFILE"
fi
JOB_NUM=${JOB_ID:-0}
CONTAINER=${CONTAINER:-$REPO/ddp_abci.sif}
MODULES=${MODULES-hpcx/2.12 singularitypro/3.11}

check_settings
if [ -n "${NHOSTS:-}" ] && [ "$NHOSTS" != "${#NODES[@]}" ]; then
    die "NHOSTS=$NHOSTS but $NODEFILE lists ${#NODES[@]} hosts"
fi
load_modules
launch_training "$@"
