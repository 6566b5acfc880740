#!/bin/bash
# Submit ddp_abci to ABCI: scripts/abci/submit.sh abci3|abci2 -g GROUP [-n NODES] [-t WALLTIME] [-- TRAINER ARGS]
#   scripts/abci/submit.sh abci3 -g gaa12345 -n 4 -t 02:00:00 -- --epochs 50
# Environment settings (CONTAINER, CKPT_DIR, IFNAME, ...) are passed on to the job in a file
# (SUBMIT_DIR, default .submit/, sourced by the job): qsub -v splits its list at commas, which BINDS and
# trainer arguments may hold. DRY_RUN=1 prints the qsub line and the file instead of submitting.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/job_common.sh
source scripts/lib/job_common.sh  # to_seconds, and die: "submit.sh: error: ..."
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
mkdir -p "${SUBMIT_DIR:=$PWD/.submit}"  # on the shared file system, where the job can read it
envfile=$(mktemp "$SUBMIT_DIR/job.XXXXXX.env")
{
    printf 'TRAIN_ARGS=%q\n' "$*"
    for v in CONTAINER CKPT_DIR IFNAME NPROC_PER_NODE MODULES MPI_ARGS BINDS STOP_MARGIN_S; do
        [ -n "${!v:-}" ] && printf '%s=%q\n' "$v" "${!v}"
    done
} >"$envfile"
if [ "$site" = abci3 ]; then
    cmd=(qsub -P "$group" -q rt_HF -l "select=$nodes" -l "walltime=$walltime" -v "DDP_ABCI_ENV=$envfile"
        scripts/abci/train_abci3.sh)
else
    # s_rt three minutes before h_rt: SIGUSR1 there, where h_rt alone would SIGKILL unannounced.
    soft=$(( $(to_seconds "$walltime") - 180 ))
    [ "$soft" -ge 60 ] || die "-t $walltime is too short: give at least 00:04:00"
    cmd=(qsub -g "$group" -l "rt_AF=$nodes" -l "h_rt=$walltime" -l "s_rt=$soft" -v "DDP_ABCI_ENV=$envfile"
        scripts/abci/train_abci2.sh)
fi
if [ -n "${DRY_RUN:-}" ]; then
    printf '%q ' "${cmd[@]}"
    echo
    cat "$envfile"
else
    "${cmd[@]}"
fi
