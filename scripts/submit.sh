#!/bin/bash
# Submit ddp_abci, one job or a chain of them. scripts/submit.sh --help says how.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/job_common.sh
REPO=$PWD  # job_common.sh: where jobs_py finds the package
source scripts/lib/job_common.sh  # jobs_py (the chain's rules), DEFAULT_BS, and die: "submit.sh: error: ..."

usage() {
    cat <<'USAGE'
usage: scripts/submit.sh SITE [-g GROUP] [-n NODES] [-t WALLTIME] [-c JOBS] [-p RANKS_PER_NODE]
                         [-G GPUS_PER_NODE] [-r RESOURCE] [--doctor] [-- TRAINER ARGS]
  SITE               abci3 (PBS Professional, ABCI 3.0), abci2 (Grid Engine, ABCI 2.0) or slurm
  -g GROUP           your ABCI group (qsub -P / -g), or a Slurm account (-A); needed on ABCI
  -n NODES           nodes per job (default 1)
  -t WALLTIME        per job: 12:00:00, 2-00:00:00, 12h, 90m, 2d (default 1h)
  -c JOBS            a chain: JOBS jobs, each starting when the one before ends, each resuming
                     from CKPT_DIR (needed); a finished run ends the chain, and so do exits 2, 65, 74
                     and 1 twice in a row
  -p RANKS_PER_NODE  ranks on each node (default: one per GPU: abci3 rt_HF 8, abci2 rt_AF 8,
                     rt_F 4; slurm: -G's, else NPROC_PER_NODE, else 1)
  -G GPUS_PER_NODE   slurm: the partition's GPUs per node (or GPUS_PER_NODE): asks --gpus-per-node
  -r RESOURCE        abci2: rt_AF (default, 8 A100) or rt_F (4 V100)
  --doctor           the first job checks the allocation first (python -m ddp_abci.doctor; DOCTOR=1)
  -- TRAINER ARGS    the trainer's flags (python -m ddp_abci.train --help), or your TRAIN_SCRIPT's
Settings from the environment reach every job: CKPT_DIR, TRAIN_SCRIPT, CONTAINER, IFNAME,
NPROC_PER_NODE, MODULES, MPI_ARGS, BINDS, STOP_MARGIN_S, MAP_BY, PYTHON, MPIRUN
(scripts/lib/job_common.sh); LOG_DIR: where the jobs' output files go; AFTER=JOBID: the first
job waits for that one (to extend a chain that runs: give its last job).
DRY_RUN=1 prints the submit lines and the settings file and writes nothing. Job ids: one a line.
USAGE
}

site=${1:-}
case "$site" in
    -h | --help) usage; exit 0 ;;
    abci3 | abci2 | slurm) shift ;;
    *) die "first argument must be abci3, abci2 or slurm (scripts/submit.sh --help)" ;;
esac
options=() doctor=""
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --doctor) doctor=1 ;;
        *) options+=("$1") ;;
    esac
    shift
done
[ "${1:-}" != -- ] || shift
group="" nodes=1 walltime=1h chain=1 per_node="" gpus=${GPUS_PER_NODE:-} resource=rt_AF
set -- "${options[@]+"${options[@]}"}" -- "$@"
while getopts "g:n:t:c:p:G:r:" opt; do
    case $opt in
        g) group=$OPTARG ;;
        n) nodes=$OPTARG ;;
        t) walltime=$OPTARG ;;
        c) chain=$OPTARG ;;
        p) per_node=$OPTARG ;;
        G) gpus=$OPTARG ;;
        r) resource=$OPTARG ;;
        *) die "unknown option (scripts/submit.sh --help)" ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" != -- ] || shift
[ "$site" = slurm ] || [ -n "$group" ] || die "no group given: pass -g GROUP (your ABCI group, e.g. gaa12345)"
for pair in "n:$nodes" "c:$chain" ${per_node:+"p:$per_node"} ${gpus:+"G:$gpus"}; do
    [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]] || die "-${pair%%:*} ${pair#*:} is not a positive number"
done
case "$site:$resource" in abci2:rt_AF | abci2:rt_F | abci3:* | slurm:*) ;; *)
    die "-r $resource: ABCI 2.0's multi-node types are rt_AF (8 GPUs) and rt_F (4 GPUs)" ;; esac
[ "$chain" = 1 ] || [ -n "${CKPT_DIR:-}" ] || die "-c $chain needs CKPT_DIR: every job of a chain resumes from it" \
    "(CKPT_DIR=/groups/GROUP/runs/NAME scripts/submit.sh ...)"
# Ranks per node: what -p or NPROC_PER_NODE says, else one per GPU of the site's node.
case "$site:$resource" in abci3:*) node_gpus=8 ;; abci2:rt_AF) node_gpus=8 ;; abci2:rt_F) node_gpus=4 ;;
    *) node_gpus=${gpus:-0} ;; esac
if [ -n "$per_node" ]; then
    [ "$node_gpus" = 0 ] || [ "$per_node" = "$node_gpus" ] ||
        echo "submit.sh: $per_node rank(s) per node (-p), not one per GPU ($node_gpus)" >&2
elif [ -n "${NPROC_PER_NODE:-}" ]; then
    per_node=$NPROC_PER_NODE
    echo "submit.sh: $per_node rank(s) per node (NPROC_PER_NODE)" >&2
elif [ "$node_gpus" != 0 ]; then
    per_node=$node_gpus
else
    per_node=1
fi
[[ "$per_node" =~ ^[1-9][0-9]*$ ]] || die "NPROC_PER_NODE=$per_node is not a positive number"
NPROC_PER_NODE=$per_node
# Checked before anything is queued (ddp_abci/jobs.py, plan): the walltime's form (a bare number
# is minutes to Slurm and seconds to PBS: only unambiguous forms are taken), the trainer's flags
# as the trainer parses them (the global batch must divide by the ranks), TRAIN_SCRIPT readable
# where the ranks will see it; it sets limit, margin, walltime_hms, slurm_time, slurm_warning and
# node_hours. The trainer stops a margin before the limit (a quarter of a short walltime, at most
# 2 minutes); the scheduler's warning signal is the fallback and must not come before it. Grid
# Engine: s_rt (where its SIGUSR1 comes) at the margin. Slurm "may send the signal up to 60 seconds
# earlier than specified" (man sbatch, --signal; seen here: a 1-minute job's USR1 came 26 s in), so
# it is asked for 60 s after the planned stop, and not at all under a minute's margin.
planned=$(jobs_py plan "$site" --walltime "$walltime" --nodes "$nodes" --per-node "$per_node" --jobs "$chain" \
    --default-bs "$DEFAULT_BS" --train-script "${TRAIN_SCRIPT:-}" --repo "$PWD" --binds "${BINDS:-}" \
    --container "${CONTAINER:-$PWD/ddp_abci.sif}" -- "$@") || exit 2
limit="" margin="" walltime_hms="" slurm_time="" slurm_warning="" node_hours=""
eval "$planned"

# Settings reach the jobs in a file (SUBMIT_DIR, default .submit/, on the shared file system),
# sourced by the job: qsub -v splits its list at commas, which BINDS and trainer arguments may hold.
SUBMIT_DIR=${SUBMIT_DIR:-$PWD/.submit}
settings() {
    printf 'TRAIN_ARGS=%q\n' "$*"
    printf 'NPROC_PER_NODE=%q\n' "$NPROC_PER_NODE"
    [ "$chain" = 1 ] || printf 'CHAIN_ID=%q\n' "$chain_id"
    [ -z "$doctor" ] || printf 'DOCTOR_FIRST=1\n'
    # PYTHON and MPIRUN too: PBS and Grid Engine start a job with a login environment, where
    # nothing of this shell's PATH reaches it (on ABCI the modules give mpirun; elsewhere these).
    for v in CONTAINER CKPT_DIR IFNAME MODULES MPI_ARGS BINDS STOP_MARGIN_S MAP_BY TRAIN_SCRIPT DOCTOR PYTHON \
        MPIRUN; do
        [ -n "${!v:-}" ] && printf '%s=%q\n' "$v" "${!v}"
    done
    return 0
}
if [ -n "${DRY_RUN:-}" ]; then
    envfile=$SUBMIT_DIR/job.DRYRUN.env
else
    mkdir -p "$SUBMIT_DIR"
    envfile=$(mktemp "$SUBMIT_DIR/job.XXXXXX.env")
fi
chain_id=$(basename "$envfile" .env)  # unique for this chain: its jobs read only its records
[ -n "${DRY_RUN:-}" ] || settings "$@" >"$envfile"

# submit_line PREVIOUS_ID: the command that submits one job, after PREVIOUS_ID when given.
submit_line() {
    local after=$1
    case "$site" in
        abci3)
            # rt_HF is a whole node (8 H200): select=N nodes, with mpiprocs ranks on each. Open MPI
            # inside a PBS job takes its slots from PBS's allocation, one per PBS_NODEFILE line,
            # that is per mpiprocs: with select=N alone, one a node (seen under OpenPBS: "not
            # enough slots available" for 2 ranks).
            cmd=(qsub -P "$group" -q rt_HF -l "select=$nodes:mpiprocs=$per_node" -l "walltime=$walltime_hms")
            [ -n "$after" ] && cmd+=(-W "depend=afterany:$after")
            [ -n "${LOG_DIR:-}" ] && cmd+=(-o "$LOG_DIR/")
            cmd+=(-v "DDP_ABCI_ENV=$envfile" scripts/abci/train_abci3.sh) ;;
        abci2)
            # rt_AF=N / rt_F=N: N whole nodes. s_rt before h_rt: SIGUSR1 there, where h_rt
            # alone would SIGKILL unannounced.
            cmd=(qsub -terse -g "$group" -l "$resource=$nodes" -l "h_rt=$walltime_hms" -l "s_rt=$(( limit - margin ))")
            [ -n "$after" ] && cmd+=(-hold_jid "$after")
            [ -n "${LOG_DIR:-}" ] && cmd+=(-o "$LOG_DIR/")
            cmd+=(-v "DDP_ABCI_ENV=$envfile" scripts/abci/train_abci2.sh) ;;
        slurm)
            cmd=(sbatch --parsable -N "$nodes" --ntasks-per-node="$per_node" -t "$slurm_time")
            [ -n "$gpus" ] && cmd+=("--gpus-per-node=$gpus")
            [ "$slurm_warning" -gt 0 ] && cmd+=("--signal=B:USR1@$slurm_warning")
            [ -n "$group" ] && cmd+=(-A "$group")
            [ -n "$after" ] && cmd+=("--dependency=afterany:$after")
            [ -n "${LOG_DIR:-}" ] && cmd+=("--output=$LOG_DIR/slurm-%j.out")
            cmd+=("--export=ALL,DDP_ABCI_ENV=$envfile" scripts/slurm/train.sbatch) ;;
    esac
}

previous=${AFTER:-} ids=()  # AFTER: a job this chain waits for (extending a chain that runs)
for i in $(seq 1 "$chain"); do
    submit_line "$previous"
    if [ -n "${DRY_RUN:-}" ]; then
        printf '%q ' "${cmd[@]}"
        echo
        previous=JOB$i
    else
        out=$("${cmd[@]}") || die "submitting job $i of $chain failed: $out"
        previous=${out%%;*}   # sbatch --parsable: "ID;cluster"
        ids+=("$previous")
        echo "$previous"
    fi
done
# The run's chain, where `python -m ddp_abci.status CKPT_DIR` finds it (ddp_abci/jobs.py).
if [ -z "${DRY_RUN:-}" ] && [ -n "${CKPT_DIR:-}" ]; then
    jobs_py chain --site "$site" --node-hours "$node_hours" --walltime-s "$limit" "$CKPT_DIR" "${ids[@]}" || true
fi
if [ -n "${DRY_RUN:-}" ]; then
    echo "# $envfile (not written: DRY_RUN):"
    settings "$@"
elif [ "$chain" != 1 ]; then
    printf '%s\n' "${ids[@]}" >"$SUBMIT_DIR/$chain_id.jobs"  # the jobs read it: a slow host left out of the next
    cancel="qdel"
    [ "$site" = slurm ] && cancel=scancel
    # The last job first: PBS deletes a list in order, and a held job deleted before the one after
    # it releases that one (afterany), which runs or ends before its turn (qdel then exits 35,
    # "Job has finished"; seen under OpenPBS). The running job, last, stops with a checkpoint.
    # On stderr: stdout is the job ids alone, for the tools that read them.
    echo "submit.sh: a chain of $chain jobs, listed in $SUBMIT_DIR/$chain_id.jobs; to cancel them all:" \
        "$cancel \$(tac $SUBMIT_DIR/$chain_id.jobs)" >&2
fi
echo "submit.sh: $chain job(s) x $nodes node(s) x $walltime_hms = $node_hours node-hours asked for" \
    "(held whether or not the run uses them)" >&2
