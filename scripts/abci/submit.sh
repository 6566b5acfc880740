#!/bin/bash
# Submit ddp_abci to ABCI: scripts/abci/submit.sh abci3|abci2 -g GROUP [-n NODES] [-t WALLTIME] [-- TRAINER ARGS]
#   scripts/abci/submit.sh abci3 -g gaa12345 -n 4 -t 02:00:00 -- --epochs 50
# Environment settings (CONTAINER, CKPT_DIR, IFNAME, ...) are passed on to the job.
# DRY_RUN=1 prints the qsub line instead of submitting.
set -euo pipefail
cd "$(dirname "$0")/../.."
die() { echo "submit.sh: error: $*" >&2; exit 2; }
site=${1:-}
shift || true
[ "$site" = abci3 ] || [ "$site" = abci2 ] || die "first argument must be abci3 or abci2"
group="" nodes=1 walltime=01:00:00
while getopts "g:n:t:" opt; do
    case $opt in
        g) group=$OPTARG ;;
        n) nodes=$OPTARG ;;
        t) walltime=$OPTARG ;;
        *) die "usage: submit.sh abci3|abci2 -g GROUP [-n NODES] [-t WALLTIME] [-- TRAINER ARGS]" ;;
    esac
done
shift $((OPTIND - 1))
[ -n "$group" ] || die "no group given: pass -g GROUP (your ABCI group, e.g. gaa12345)"
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "-n $nodes is not a positive number of nodes"
vars="TRAIN_ARGS=$*"
for v in CONTAINER CKPT_DIR IFNAME NPROC_PER_NODE MODULES MPI_ARGS BINDS; do
    [ -n "${!v:-}" ] && vars="$vars,$v=${!v}"
done
if [ "$site" = abci3 ]; then
    cmd=(qsub -P "$group" -q rt_HF -l "select=$nodes" -l "walltime=$walltime" -v "$vars" scripts/abci/train_abci3.sh)
else
    cmd=(qsub -g "$group" -l "rt_AF=$nodes" -l "h_rt=$walltime" -v "$vars" scripts/abci/train_abci2.sh)
fi
if [ -n "${DRY_RUN:-}" ]; then
    printf '%q ' "${cmd[@]}"
    echo
else
    "${cmd[@]}"
fi
