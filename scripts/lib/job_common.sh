# shellcheck shell=bash
# Shared by the job scripts (scripts/abci/*.sh, scripts/slurm/train.sbatch). Bash keeps what is
# bash's: the settings sourced, the modules, mpirun in its own process group, its signals and its
# copied output. Every decision (the chain's verdict, the nodes, ranks per node, placement, the
# container's command, the trainer's arguments, the variables forwarded) is made by the job's
# Python half, ddp_abci/cluster/job.py (`jobs_py prepare`), which checks every setting before
# anything starts; the settings and what each does: its SETTINGS, or docs/abci.md, "Reference".
# The caller sets REPO and SITE (abci3, abci2 or slurm).

# submit.sh passes its settings in a file, every one exported (the job's Python half reads them):
# qsub -v would split values at their commas. Variables whose names look like secrets come from a
# file of their own, readable by the user alone (ddp_abci/cluster/forwarding.py).
set -a
# shellcheck disable=SC1090
[ -z "${DDP_ABCI_ENV:-}" ] || source "$DDP_ABCI_ENV"
# shellcheck disable=SC1090
[ -z "${DDP_ABCI_SECRETS:-}" ] || ! [ -r "$DDP_ABCI_SECRETS" ] || source "$DDP_ABCI_SECRETS"
set +a
# shellcheck source=scripts/lib/exits.sh
source "$REPO/scripts/lib/exits.sh"

die() {
    echo "$(basename "$0"): error: $*" >&2
    exit "$EXIT_USAGE"
}

# The job's Python half, run by a Python that needs neither torch nor the image: JOBS_PYTHON, else
# the trainer's own where no container is used and it is there, else the host's python3 (3.9 or newer).
# From the checkout's root, where `python -m` finds the checkout's ddp_abci first; the job's own
# environment is left as it is (the Python half reads it, PYTHONPATH included).
jobs_py() {
    local python=${JOBS_PYTHON:-}
    if [ -z "$python" ] && [ "${CONTAINER:-none}" = none ] && command -v "${PYTHON:-}" >/dev/null 2>&1; then
        python=$PYTHON
    fi
    (cd "$REPO" && exec "${python:-python3}" -m ddp_abci.jobs "$@")
}

# The script's own files (the host file, the copy of mpirun's output) go when it exits, however
# it exits: a suite's short jobs had left 700 of them under /tmp.
JOB_TMP=()
trap 'rm -f "${JOB_TMP[@]+"${JOB_TMP[@]}"}"' EXIT
job_tmp() {  # job_tmp VAR NAME: VAR is set to a new file ddp_abci_NAME.XXXXXX under TMPDIR, removed at exit
    local file
    file=$(mktemp "${TMPDIR:-/tmp}/ddp_abci_$2.XXXXXX") || die "cannot make a file under ${TMPDIR:-/tmp}: set TMPDIR"
    JOB_TMP+=("$file")
    printf -v "$1" %s "$file"
}

load_modules() {  # MODULES: space-separated; skipped where the module system is absent
    [ -n "${MODULES:-}" ] || return 0
    if [ -f /etc/profile.d/modules.sh ]; then
        # shellcheck disable=SC1091
        source /etc/profile.d/modules.sh
        # shellcheck disable=SC2086
        module load $MODULES
    else
        echo "$(basename "$0"): no module system here; not loading: $MODULES" >&2
    fi
}

# Everything decided before mpirun (cluster/job.py): JOB_NUM, NODES, PER_NODE, NP, MAP, RANK_CMD,
# TRAIN, FORWARD, DOCTOR_RUN and the exports; HOSTFILE written. A job whose chain ended, or whose
# settings are refused, ends here with that status.
prepare_job() {
    local plan rc=0
    job_tmp HOSTFILE hosts
    plan=$(jobs_py prepare --site "$SITE" --script "$(basename "$0")" --repo "$REPO" --hostfile "$HOSTFILE" \
        --elapsed "$SECONDS" -- "$@") || rc=$?
    case $rc in
        0) ;;
        126 | 127) die "the job's Python half could not run (python -m ddp_abci.jobs with ${JOBS_PYTHON:-python3}):" \
            "set JOBS_PYTHON" ;;
        "$EXIT_USAGE") exit "$rc" ;;
        *) echo "$(basename "$0"): the job's Python half failed (above): not training" >&2
            exit "$EXIT_FAILED" ;;
    esac
    EXIT_NOW=""
    eval "$plan"
    [ -z "$EXIT_NOW" ] || exit "$EXIT_NOW"
    # shellcheck disable=SC2206
    EXTRA_MPI=(${MPI_ARGS:-})
}

# wait_for_copy PID: the verdict on mpirun's exit reads its copied output, so wait until the copy
# has its last lines; it can trail mpirun's exit under load (a test saw the verdict miss them). At
# most 10 s: a process that outlives mpirun and holds the pipe open must not hold the job.
wait_for_copy() {
    local polls=0
    while kill -0 "$1" 2>/dev/null && [ "$polls" -lt 200 ]; do
        sleep 0.05
        polls=$((polls + 1))
    done
}

# Run CMD and wait for it, turning stop signals into SIGUSR1 for it. Open MPI's mpirun
# forwards SIGUSR1 to every rank and waits for them, whereas on SIGTERM or Ctrl-C it kills
# them within half a second, their last lines unprinted (measured: docs/reliability.md).
# CMD runs in its own process group (set -m), so a terminal's Ctrl-C reaches this shell
# only; a second Ctrl-C ends CMD at once. Returns CMD's exit status.
run_stoppable() {
    set -m
    "$@" &
    local pid=$! rc=0 interrupted=""
    set +m
    trap 'kill -USR1 "$pid" 2>/dev/null' TERM USR1
    trap 'if [ -n "$interrupted" ]; then kill -TERM "$pid" 2>/dev/null; fi; interrupted=1; kill -USR1 "$pid" 2>/dev/null' INT
    wait "$pid" || rc=$?
    while kill -0 "$pid" 2>/dev/null; do  # a trapped signal interrupts wait: wait again
        rc=0
        wait "$pid" || rc=$?
    done
    trap - TERM USR1 INT
    return "$rc"
}

on_ranks() {  # the mpirun line that runs ARGS on every rank
    ON_RANKS=("${MPIRUN:-mpirun}" -np "$NP" --hostfile "$HOSTFILE" --stdin none "${MAP[@]}" "${FORWARD[@]}"
        "${EXTRA_MPI[@]+"${EXTRA_MPI[@]}"}" "${RANK_CMD[@]}" "$@")
}

# The doctor (DOCTOR=1, or the first job of a chain submitted with --doctor): the allocation
# checked before training, by the same mpirun; a problem stops the job with exit 1 and its lines.
run_doctor() {
    [ -n "$DOCTOR_RUN" ] || return 0
    on_ranks -m ddp_abci.doctor ${CKPT_DIR:+--ckpt-dir "$CKPT_DIR"}
    echo "job $JOB_NUM: the doctor checks the allocation first (DOCTOR=1)"
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "dry run: $(printf '%q ' "${ON_RANKS[@]}")"
        return 0
    fi
    "${ON_RANKS[@]}" || { echo "job $JOB_NUM: the doctor found the problems above: not training on this allocation" >&2
        exit "$EXIT_FAILED"; }
}

# Start mpirun and wait (run_stoppable), then say what its exit status means. Its output also
# goes to a file, where the run's last error line is found for the record (cluster/chain.py,
# finish). After a fault that may mend, train again in this job while its walltime allows, on the
# hosts left (cluster/restarts.py decides: AGAIN, NODES, NP, PAUSE; the host file rewritten).
launch_training() {
    run_doctor
    on_ranks "${TRAIN[@]}"
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "dry run: $(printf '%q ' "${ON_RANKS[@]}")"
        return 0
    fi
    local rc before copy copier status started decision
    job_tmp OUTPUT output
    while :; do
        rc=0
        started=$(date +%s.%N)
        before=$(jobs_py fingerprint "${CKPT_DIR:-/nonexistent}")
        # The copy ignores Ctrl-C and SIGTERM: were it to die, mpirun's output would have nowhere to go.
        exec {copy}> >(trap '' INT TERM; exec tee "$OUTPUT")
        copier=$!
        run_stoppable "${ON_RANKS[@]}" >&"$copy" 2>&1 {copy}>&- || rc=$?
        exec {copy}>&-
        wait_for_copy "$copier"
        # What the status means, said and recorded; the chain's next job told of slow and bad hosts.
        status=$(jobs_py finish "${CKPT_DIR:-}" "$rc" --before "$before" --output "$OUTPUT" --job "$JOB_NUM" \
            ${CHAIN_ID:+--chain "$CHAIN_ID"} --submit-dir "${SUBMIT_DIR:-$REPO/.submit}") || status=$rc
        decision=$(jobs_py after-try "${CKPT_DIR:-}" "$status" --job "$JOB_NUM" --started "$started" \
            --hostfile "$HOSTFILE" --per-node "$PER_NODE" --elapsed "$SECONDS" ${CHAIN_ID:+--chain "$CHAIN_ID"} \
            --submit-dir "${SUBMIT_DIR:-$REPO/.submit}" -- "${NODES[@]}") || return "$status"
        AGAIN=""
        eval "$decision"
        [ -n "$AGAIN" ] || return "$status"
        sleep "$PAUSE"
        on_ranks "${TRAIN[@]}"
    done
}

# The whole job: the Python half's decisions (every setting checked before anything loads), the
# modules, the container's checks, then mpirun (or srun, under Slurm).
run_job() {
    prepare_job "$@"
    load_modules
    if [ "$CONTAINER" != none ] && [ "${DRY_RUN:-0}" != 1 ]; then
        jobs_py container "$CONTAINER" --script "$(basename "$0")" --repo "$REPO" --job "$JOB_NUM" || exit "$?"
    fi
    if [ "${LAUNCHER:-mpirun}" = srun ]; then
        rm -f "${JOB_TMP[@]+"${JOB_TMP[@]}"}"  # exec runs no EXIT trap
        exec srun --mpi=pmix --ntasks-per-node="$PER_NODE" "${RANK_CMD[@]}" "${TRAIN[@]}"
    fi
    launch_training
}
