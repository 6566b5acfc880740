#!/bin/bash
# Submit ddp_abci, one job or a chain of them:
#   scripts/submit.sh SITE [-g GROUP] [-n NODES] [-t WALLTIME] [-c N] [-- TRAINER ARGS]
#   SITE: abci3 (PBS Professional), abci2 (Grid Engine) or slurm
#   scripts/submit.sh abci3 -g gaa12345 -n 4 -t 12:00:00 -c 5 -- --epochs 200   # five 12-hour jobs, one after another
# -c N submits N jobs, each starting after the one before it ends, whatever its exit status
# (PBS depend=afterany, Grid Engine -hold_jid, Slurm --dependency=afterany); every job resumes
# from CKPT_DIR, which a chain needs. A job that finds the run finished exits 0 at once; one
# that finds it diverged (65), its storage failing (74) or its input refused (2) stops the
# chain, saying why (CKPT_DIR/status). It prints one job id per line.
# Environment settings (CONTAINER, CKPT_DIR, IFNAME, ...) reach the jobs in a file (SUBMIT_DIR,
# default .submit/, sourced by the job): qsub -v splits its list at commas, which BINDS and
# trainer arguments may hold. DRY_RUN=1 prints the submit lines (JOB1, JOB2, ... for the ids)
# and the file instead of submitting.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/job_common.sh
source scripts/lib/job_common.sh  # to_seconds, margin_s, and die: "submit.sh: error: ..."
site=${1:-}
shift || true
case "$site" in abci3 | abci2 | slurm) ;; *) die "first argument must be abci3, abci2 or slurm" ;; esac
group="" nodes=1 walltime=01:00:00 chain=1
while getopts "g:n:t:c:" opt; do
    case $opt in
        g) group=$OPTARG ;;
        n) nodes=$OPTARG ;;
        t) walltime=$OPTARG ;;
        c) chain=$OPTARG ;;
        *) die "usage: submit.sh abci3|abci2|slurm [-g GROUP] [-n NODES] [-t WALLTIME] [-c N] [-- TRAINER ARGS]" ;;
    esac
done
shift $((OPTIND - 1))
[ "$site" = slurm ] || [ -n "$group" ] || die "no group given: pass -g GROUP (your ABCI group, e.g. gaa12345)"
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "-n $nodes is not a positive number of nodes"
[[ "$chain" =~ ^[1-9][0-9]*$ ]] || die "-c $chain is not a positive number of jobs"
[ "$chain" = 1 ] || [ -n "${CKPT_DIR:-}" ] || die "-c $chain needs CKPT_DIR: every job of a chain resumes from it" \
    "(CKPT_DIR=/groups/GROUP/runs/NAME scripts/submit.sh ...)"
limit=$(to_seconds "$walltime")
[ "$limit" -ge 60 ] || die "-t $walltime is too short: give at least 00:01:00"
# The trainer stops at its --stop-after, a margin before the limit (a quarter of a short
# walltime, at most 2 minutes: job_common.sh); the scheduler's warning signal is the fallback
# and must not come before it. Grid Engine: s_rt (where its SIGUSR1 comes) at the margin, the
# deadline then taken from s_rt. Slurm "may send the signal up to 60 seconds earlier than
# specified" (man sbatch, --signal; seen here: a 1-minute job's USR1 came 26 s in), so it is
# asked for 60 s after the planned stop, and not at all when the margin is under a minute
# (Slurm's SIGTERM at the limit is then the fallback).
margin=$(margin_s "$limit")
slurm_warning=$(( margin - 60 ))

mkdir -p "${SUBMIT_DIR:=$PWD/.submit}"  # on the shared file system, where the jobs can read it
envfile=$(mktemp "$SUBMIT_DIR/job.XXXXXX.env")
chain_id=$(basename "$envfile" .env)  # unique for this chain: its jobs read only its records
{
    printf 'TRAIN_ARGS=%q\n' "$*"
    [ "$chain" = 1 ] || printf 'CHAIN_ID=%q\n' "$chain_id"
    for v in CONTAINER CKPT_DIR IFNAME NPROC_PER_NODE MODULES MPI_ARGS BINDS STOP_MARGIN_S MAP_BY; do
        [ -n "${!v:-}" ] && printf '%s=%q\n' "$v" "${!v}"
    done
} >"$envfile"

# submit_line PREVIOUS_ID: the command that submits one job, after PREVIOUS_ID when given.
submit_line() {
    local after=$1
    case "$site" in
        abci3)
            cmd=(qsub -P "$group" -q rt_HF -l "select=$nodes" -l "walltime=$walltime")
            [ -n "$after" ] && cmd+=(-W "depend=afterany:$after")
            cmd+=(-v "DDP_ABCI_ENV=$envfile" scripts/abci/train_abci3.sh) ;;
        abci2)
            # s_rt before h_rt: SIGUSR1 there, where h_rt alone would SIGKILL unannounced.
            local soft=$(( limit - margin ))
            cmd=(qsub -terse -g "$group" -l "rt_AF=$nodes" -l "h_rt=$walltime" -l "s_rt=$soft")
            [ -n "$after" ] && cmd+=(-hold_jid "$after")
            cmd+=(-v "DDP_ABCI_ENV=$envfile" scripts/abci/train_abci2.sh) ;;
        slurm)
            cmd=(sbatch --parsable -N "$nodes" -t "$walltime")
            [ "$slurm_warning" -gt 0 ] && cmd+=("--signal=B:USR1@$slurm_warning")
            [ -n "$group" ] && cmd+=(-A "$group")
            [ -n "$after" ] && cmd+=("--dependency=afterany:$after")
            cmd+=("--export=ALL,DDP_ABCI_ENV=$envfile" scripts/slurm/train.sbatch) ;;
    esac
}

previous=""
for i in $(seq 1 "$chain"); do
    submit_line "$previous"
    if [ -n "${DRY_RUN:-}" ]; then
        printf '%q ' "${cmd[@]}"
        echo
        previous=JOB$i
    else
        out=$("${cmd[@]}") || die "submitting job $i of $chain failed: $out"
        previous=${out%%;*}   # sbatch --parsable: "ID;cluster"
        echo "$previous"
    fi
done
if [ -n "${DRY_RUN:-}" ]; then
    cat "$envfile"
fi
