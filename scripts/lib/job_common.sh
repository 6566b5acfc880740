# shellcheck shell=bash
# Shared by the job scripts (scripts/abci/*.sh, scripts/slurm/train.sbatch): node list,
# ranks per node, container wrapper, and an mpirun that stops cleanly on walltime.
# The caller sets REPO and JOB_NUM, and NODEFILE (one host per line, repeats allowed).
#
# Settings (environment variables):
#   CONTAINER       .sif image, or "none" to run on the host's Python (default $REPO/ddp_abci.sif)
#   TRAIN_SCRIPT    your own training script (a fit() script: docs/abci.md, "your own model"), run
#                   on every rank instead of python -m ddp_abci.train, with the same arguments
#   NPROC_PER_NODE  ranks per node (default: one per GPU, else 2 on a CPU-only host)
#   PYTHON          Python to run (default python3; the image's python3 with a container)
#   MPIRUN          mpirun to use (default mpirun: the host's, e.g. HPC-X on ABCI)
#   MPI_ARGS        extra mpirun arguments
#   IFNAME          network interface for rank 0's address (e.g. bond0 on ABCI 3.0)
#   CKPT_DIR        checkpoint folder; when set, runs resume from it (resubmit the same job)
#   TRAIN_ARGS      extra trainer arguments (qsub -v TRAIN_ARGS="--epochs 10"); script arguments too
#   BINDS           extra singularity bind paths, comma separated
#   DRY_RUN         1: print the mpirun command line (forwarded variables, binds, mapping) and exit 0
#   STOP_AFTER      seconds for the trainer's --stop-after (default: the scheduler's time left - STOP_MARGIN_S)
#   STOP_MARGIN_S   kept free before the walltime for start-up and the last save (default 120 s,
#                   a quarter of what is left for walltimes under 8 minutes)
#   MAP_BY          Open MPI's --map-by (default: ranks shared out per socket, PE cores each, bound)
#   SOCKETS_PER_NODE, CORES_PER_NODE  the node's sockets and physical cores (default: lscpu's)
#   DOCTOR          1: python -m ddp_abci.doctor checks the allocation before training; a problem
#                   stops the job (exit 1) with its lines
#   DDP_ABCI_ENV    a file of settings written by submit.sh (values may hold commas), sourced first
#   CHAIN_ID        set by submit.sh -c: this job is one of a chain (see chain_verdict)
#   JOBS_PYTHON     the Python that runs the chain's rules (ddp_abci/jobs.py; no torch, 3.9 or newer);
#                   default: PYTHON without a container, else the host's python3
#   LOG_DIR         where submit.sh asks the scheduler to put each job's output (default: the
#                   folder it is run from, the checkout)

# submit.sh passes its settings in a file: qsub -v would split values at their commas.
if [ -n "${DDP_ABCI_ENV:-}" ]; then
    # shellcheck disable=SC1090
    source "$DDP_ABCI_ENV"
fi

die() {
    local line
    line="$(basename "$0"): error: $*"
    echo "$line" >&2
    # A job's refusal is recorded (ddp_abci/jobs.py): the chain's next jobs then stop at once, where
    # each would take its nodes to fail the same way. submit.sh and dry runs record nothing.
    if [ -n "${JOB_NUM:-}" ] && [ -n "${CKPT_DIR:-}" ] && [ "${DRY_RUN:-0}" != 1 ]; then
        jobs_py record "$CKPT_DIR" 2 "$line" ${CHAIN_ID:+--chain "$CHAIN_ID"} 2>/dev/null || true
    fi
    exit 2
}

# The script's own files (the node list, the host file, the copy of mpirun's output) go when it
# exits, however it exits: a suite's short jobs had left 700 of them under /tmp.
JOB_TMP=()
trap 'rm -f "${JOB_TMP[@]+"${JOB_TMP[@]}"}"' EXIT
job_tmp() {  # job_tmp VAR NAME: VAR is set to a new file ddp_abci_NAME.XXXXXX under TMPDIR, removed at exit
    local file
    file=$(mktemp "${TMPDIR:-/tmp}/ddp_abci_$2.XXXXXX") || die "cannot make a file under ${TMPDIR:-/tmp}: set TMPDIR"
    JOB_TMP+=("$file")
    printf -v "$1" %s "$file"
}

# NODES: unique hosts in node-file order (PBS and SGE repeat a host once per slot).
read_nodes() {
    [ -n "${NODEFILE:-}" ] || die "no node file: run inside a job or set NODEFILE (a file with one host per line)"
    [ -r "$NODEFILE" ] || die "node file $NODEFILE cannot be read"
    mapfile -t NODES < <(awk 'NF && !seen[$1]++ {print $1}' "$NODEFILE")
    [ "${#NODES[@]}" -gt 0 ] || die "node file $NODEFILE lists no hosts"
}

# GPUs counted, never matched by name: the seed's V100/A100 test broke on any other GPU.
gpus_on_this_node() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true
    else
        echo 0
    fi
}

# Ranks per node. Under Slurm, what the job asked Slurm for (--ntasks-per-node, or the tasks
# Slurm gave it): mpirun takes its slots from Slurm's allocation, and asking it for more ranks
# than that fails ("not enough slots"). Elsewhere: NPROC_PER_NODE, else one per GPU, else 2.
ranks_per_node() {
    local gpus allocated=""
    if [ -n "${SLURM_JOB_ID:-}" ]; then
        allocated=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-}}
        allocated=${allocated%%[(,]*}  # "2(x2)" or "2,1": the first node's
    fi
    if [ -n "${NPROC_PER_NODE:-}" ]; then
        [[ "$NPROC_PER_NODE" =~ ^[1-9][0-9]*$ ]] || die "NPROC_PER_NODE=$NPROC_PER_NODE is not a positive integer"
        if [ -n "$allocated" ] && [ "$allocated" != "$NPROC_PER_NODE" ]; then
            die "NPROC_PER_NODE=$NPROC_PER_NODE but Slurm gave this job $allocated task(s) per node: ask sbatch for" \
                "--ntasks-per-node=$NPROC_PER_NODE (or leave NPROC_PER_NODE out)"
        fi
        echo "$NPROC_PER_NODE"
        return
    fi
    if [ -n "$allocated" ]; then
        echo "$allocated"
        return
    fi
    gpus=$(gpus_on_this_node)
    if [ "$gpus" -gt 0 ]; then echo "$gpus"; else echo 2; fi
}

# The node's sockets and physical cores, from the node itself (lscpu), or SOCKETS_PER_NODE and
# CORES_PER_NODE. A scheduler counts hardware threads: ABCI 3.0's 2 x 48-core Xeon 8558 shows
# 192 CPUs for 96 cores, and mapping by its count asks a 48-core socket for 96.
node_topology() {
    local pairs
    SOCKETS=${SOCKETS_PER_NODE:-$(lscpu -p=SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)}
    CORES=${CORES_PER_NODE:-$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l)}
    pairs=$(lscpu -p=CPU 2>/dev/null | grep -vc '^#' || true)  # hardware threads, for the allocation below
    [ "$SOCKETS" -ge 1 ] 2>/dev/null || SOCKETS=1
    [ "$CORES" -ge 1 ] 2>/dev/null || CORES=$(nproc)
    THREADS_PER_CORE=$(( ${pairs:-0} > CORES ? pairs / CORES : 1 ))
}

# The physical cores this job may use on a node: all of them, or fewer where the scheduler
# allocated fewer CPUs (Slurm SLURM_CPUS_ON_NODE, PBS NCPUS: hardware threads, so divided by the
# node's threads a core). Threads from the whole node oversubscribe where nodes are shared.
cores_of_this_job() {
    local cpus=""
    if [ -n "${SLURM_CPUS_ON_NODE:-}" ]; then cpus=$SLURM_CPUS_ON_NODE
    elif [ -n "${PBS_JOBID:-}" ] && [ -n "${NCPUS:-}" ]; then cpus=$NCPUS; fi
    if [ -n "$cpus" ] && [ -z "${CORES_PER_NODE:-}" ] && [ $(( cpus / THREADS_PER_CORE )) -lt "$CORES" ]; then
        echo $(( cpus / THREADS_PER_CORE ))
    else
        echo "$CORES"
    fi
}

# Every setting checked before anything loads or starts: one line names what is wrong.
check_settings() {
    local gpus
    chain_verdict
    read_nodes
    PER_NODE=$(ranks_per_node) || exit 2
    gpus=$(gpus_on_this_node)
    if [ "$gpus" -gt 0 ] && [ "$PER_NODE" -gt "$gpus" ]; then
        die "$PER_NODE rank(s) per node but this node has $gpus GPU(s), and each rank takes one: ask for at most" \
            "$gpus (submit.sh -p, NPROC_PER_NODE, sbatch --ntasks-per-node)"
    elif [ "$gpus" -gt "$PER_NODE" ]; then
        echo "$(basename "$0"): $gpus GPUs on this node and $PER_NODE rank(s) per node; each rank takes one GPU:" \
            "ask for one rank per GPU (submit.sh -p $gpus, NPROC_PER_NODE) to use them all" >&2
    fi
    if [ "${CONTAINER}" != none ] && [ ! -r "$CONTAINER" ]; then
        die "container image $CONTAINER not found: build it (scripts/container/) or set CONTAINER=none"
    fi
    placement
}

# The command each rank runs: python directly, or through `singularity exec` in the image.
# The host's mpirun starts one `singularity exec` per rank (ABCI's hybrid model): the MPI
# inside the image must be ABI-compatible with the host's (Open MPI 4.1 for HPC-X 2.20).
rank_command() {
    if [ "${CONTAINER}" = none ]; then
        RANK_CMD=("${PYTHON:-python3}")
        return
    fi
    if [ "${DRY_RUN:-0}" != 1 ]; then
        command -v singularity >/dev/null 2>&1 || die "singularity not found: load its module or set CONTAINER=none"
    fi
    # Singularity refuses to bind a path that does not exist: make a fresh run folder first.
    # TMPDIR holds Open MPI's session directory, which the ranks inside must see too.
    local binds=$REPO
    if [ -n "${CKPT_DIR:-}" ]; then
        [ "${DRY_RUN:-0}" = 1 ] || mkdir -p "$CKPT_DIR" || die "cannot create CKPT_DIR=$CKPT_DIR"
        binds+=",$(realpath -m "$CKPT_DIR")"
    fi
    [ -n "${TMPDIR:-}" ] && [ -d "$TMPDIR" ] && binds+=",$TMPDIR"
    [ -n "${BINDS:-}" ] && binds+=",$BINDS"
    # PYTHONNOUSERSITE: a bound ~/.local must not shadow the image's packages.
    RANK_CMD=(singularity exec --nv --env PYTHONNOUSERSITE=1 --bind "$binds" --pwd "$REPO" "$CONTAINER"
        "${PYTHON:-python3}")
}

write_hostfile() {  # one "host slots=N" line per node
    job_tmp HOSTFILE hosts
    for node in "${NODES[@]}"; do echo "$node slots=$1"; done >"$HOSTFILE"
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

# TRAIN: the trainer (or TRAIN_SCRIPT) and its arguments from the settings (IFNAME, CKPT_DIR,
# TRAIN_ARGS, the job's own arguments), the same under mpirun and srun. The seed's job gets
# --bs DEFAULT_BS unless the arguments give one: the trainer's own 50 divides by no 8-rank node,
# 256 (the seed's job script's) by 8, 16, 32, ... ranks.
DEFAULT_BS=256
trainer_args() {
    local args=()
    # shellcheck disable=SC2206
    args=(${TRAIN_ARGS:-} "$@")
    if [ -n "${TRAIN_SCRIPT:-}" ]; then
        [ -r "$TRAIN_SCRIPT" ] || die "TRAIN_SCRIPT=$TRAIN_SCRIPT cannot be read: give the path of your fit() script"
        TRAIN=("$TRAIN_SCRIPT")
    else
        TRAIN=(-m ddp_abci.train)
        [[ " ${args[*]+"${args[*]}"} " == *" --bs"* ]] || TRAIN+=(--bs "$DEFAULT_BS")
    fi
    [ -n "${IFNAME:-}" ] && TRAIN+=(--interface "$IFNAME")
    [ -n "${CKPT_DIR:-}" ] && TRAIN+=(--ckpt-dir "$CKPT_DIR" --resume)
    TRAIN+=("${args[@]+"${args[@]}"}")
    deadline_args
}

# The chain's rules (ddp_abci/jobs.py), run by a Python that needs neither torch nor the image:
# the trainer's own where no container is used, else the host's python3 (3.9 or newer); JOBS_PYTHON
# names another.
jobs_py() {
    local python=${JOBS_PYTHON:-}
    if [ -z "$python" ]; then
        if [ "${CONTAINER:-none}" = none ]; then python=${PYTHON:-python3}; else python=python3; fi
    fi
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$python" -m ddp_abci.jobs "$@"
}

# The trainer's deadline: the job's own end from the scheduler, less STOP_MARGIN_S, as a wall-clock
# time (--stop-at), so that what runs first (the doctor, mpirun starting the ranks) comes out of the
# job's time; STOP_AFTER gives seconds from the trainer's own start instead.
deadline_args() {
    if [ -n "${STOP_AFTER:-}" ]; then
        TRAIN+=(--stop-after "$STOP_AFTER")
        return
    fi
    # No scheduler, no walltime (the scheduler's own variables, as exported: train_abci3.sh sets a JOB_ID of its own).
    [ -n "$(printenv PBS_JOBID SLURM_JOB_ID JOB_ID)" ] || return 0
    local flag
    # shellcheck disable=SC2207  # two words: --stop-at and its time
    flag=($(jobs_py deadline --job "$JOB_NUM" ${STOP_MARGIN_S:+--margin "$STOP_MARGIN_S"} --elapsed "$SECONDS"))
    TRAIN+=("${flag[@]+"${flag[@]}"}")
}

# MAP: where ranks go. One rank per GPU, shared out over the sockets (ranks 0-3 and 4-7 of
# an 8-GPU node, whose GPUs hang off sockets 0 and 1: check with nvidia-smi topo -m), each
# bound to PE physical cores of its own socket and running that many threads (OMP_NUM_THREADS).
# Without binding, Open MPI 4.1 binds each rank to a whole socket whichever its GPU. A mapping
# Open MPI would refuse (more cores a socket than it has) is never asked for.
placement() {
    if [ -n "${MAP_BY:-}" ]; then
        MAP=(--map-by "$MAP_BY")
        return
    fi
    node_topology
    local cores per_socket pe unit=socket count
    cores=$(cores_of_this_job)
    if [ $(( PER_NODE % SOCKETS )) -eq 0 ]; then
        per_socket=$(( PER_NODE / SOCKETS ))
        pe=$(( CORES / SOCKETS / per_socket ))
        count=$per_socket
    else
        unit=node count=$PER_NODE pe=$(( CORES / PER_NODE ))
    fi
    [ $(( cores / PER_NODE )) -lt "$pe" ] && pe=$(( cores / PER_NODE ))
    [ "$pe" -ge 1 ] || die "$PER_NODE rank(s) per node but the job has $cores core(s) there ($SOCKETS socket(s)," \
        "$CORES cores): ask for fewer ranks (-p, NPROC_PER_NODE) or set MAP_BY"
    MAP=(--map-by "ppr:${count}:${unit}:PE=${pe}" --bind-to core)
    [ -n "${OMP_NUM_THREADS:-}" ] || export OMP_NUM_THREADS=$pe
}

# FORWARD: `-x VAR` for each variable the ranks need from this shell. Open MPI hands ranks
# on other nodes only what it is told to; NCCL_SOCKET_IFNAME follows IFNAME unless set.
forward_env() {
    if [ -n "${IFNAME:-}" ] && [ -z "${NCCL_SOCKET_IFNAME:-}" ]; then
        export NCCL_SOCKET_IFNAME=$IFNAME
    fi
    export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
    flight_recorder
    FORWARD=(-x PATH)
    [ -n "${LD_LIBRARY_PATH:-}" ] && FORWARD+=(-x LD_LIBRARY_PATH)
    local var
    while IFS= read -r var; do
        FORWARD+=(-x "$var")
    done < <(compgen -e | grep -E '^(NCCL_.*|TORCH_.*|OMP_NUM_THREADS|PYTHONNOUSERSITE)$' | sort)
}

# On GPUs, torch's NCCL flight recorder: the last collectives of each rank, dumped when NCCL's
# own watchdog times out, beside the watchdog's hang-STEP/ stacks (names read in torch 2.13:
# c10d/ProcessGroupNCCL.hpp and FlightRecorder.hpp, TORCH_FR_DUMP_TEMP_FILE and its older name
# in libtorch; each rank's file is the prefix and its rank). Yours win. Not run here: no GPU.
flight_recorder() {
    [ -n "${CKPT_DIR:-}" ] && [ "$(gpus_on_this_node)" -gt 0 ] || return 0
    local prefix=$CKPT_DIR/nccl-flight-recorder/rank-
    export TORCH_NCCL_TRACE_BUFFER_SIZE=${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}
    export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
    export TORCH_FR_DUMP_TEMP_FILE=${TORCH_FR_DUMP_TEMP_FILE:-$prefix}
    export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$prefix}
    [ "${DRY_RUN:-0}" = 1 ] || mkdir -p "$CKPT_DIR/nccl-flight-recorder"
}

# Open MPI 5's mpirun keeps its session in $TMPDIR/ompi.PID (else /tmp) and leaves it there when
# it is SIGKILLed (a walltime's kill, scancel --signal=KILL); a later mpirun on this node that gets
# the same PID then fails at once: "The PMIx server's listener thread failed to start", exit 213
# (reproduced with Open MPI 5.0.11: a stale copy made for the next PIDs). This job's user's ones whose
# process is gone are removed before this job's mpirun starts (not in a dry run: it changes nothing).
clear_stale_mpi_sessions() {
    [ "${DRY_RUN:-0}" = 1 ] && return 0
    local dir
    for dir in "${TMPDIR:-/tmp}"/ompi.[0-9]*; do
        [ -d "$dir" ] && [ -O "$dir" ] && [ ! -e "/proc/${dir##*.}" ] && rm -rf "$dir"
    done
    return 0
}

# A job of a chain (submit.sh -c) first reads what the jobs before it recorded in CKPT_DIR/status
# and ends at once where it should (ddp_abci/jobs.py, verdict: a finished run, or an end that does
# not mend by itself); 69, 75 and a first 1 resume.
chain_verdict() {
    [ -n "${CHAIN_ID:-}" ] && [ -n "${CKPT_DIR:-}" ] || return 0
    local decision
    decision=$(jobs_py verdict "$CKPT_DIR" --chain "$CHAIN_ID" --job "$JOB_NUM") ||
        die "the chain's rules could not run (python -m ddp_abci.jobs with ${JOBS_PYTHON:-python3}): set JOBS_PYTHON"
    [ "$decision" = train ] || exit "$decision"
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

# DOCTOR=1 (or the first job of a chain submitted with --doctor): the allocation checked before
# training, by the same mpirun; a problem stops the job with exit 1 and its lines.
run_doctor() {
    [ "${DOCTOR:-}" = 1 ] || { [ -n "${DOCTOR_FIRST:-}" ] && ! [ -f "${CKPT_DIR:-/nonexistent}/status" ]; } ||
        return 0
    local cmd=("${MPIRUN:-mpirun}" -np "$1" --hostfile "$HOSTFILE" --stdin none "${MAP[@]}" "${FORWARD[@]}"
        "${EXTRA_MPI[@]+"${EXTRA_MPI[@]}"}" "${RANK_CMD[@]}" -m ddp_abci.doctor ${CKPT_DIR:+--ckpt-dir "$CKPT_DIR"})
    echo "job $JOB_NUM: the doctor checks the allocation first (DOCTOR=1)"
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "dry run: $(printf '%q ' "${cmd[@]}")"
        return 0
    fi
    "${cmd[@]}" || { echo "job $JOB_NUM: the doctor found the problems above: not training on this allocation" >&2
        exit 1; }
}

# Start mpirun and wait (run_stoppable), then say what its exit status means. Its output also
# goes to a file, where the run's last error line is found for the record (jobs.py, finish).
launch_training() {
    local per_node=$PER_NODE np=$(( ${#NODES[@]} * PER_NODE ))
    rank_command
    write_hostfile "$per_node"
    trainer_args "$@"
    forward_env
    # shellcheck disable=SC2206
    EXTRA_MPI=(${MPI_ARGS:-})
    local cmd=("${MPIRUN:-mpirun}" -np "$np" --hostfile "$HOSTFILE" --stdin none "${MAP[@]}"
        "${FORWARD[@]}" "${EXTRA_MPI[@]+"${EXTRA_MPI[@]}"}" "${RANK_CMD[@]}" "${TRAIN[@]}")
    echo "job $JOB_NUM: ${#NODES[@]} node(s) x $per_node rank(s) = $np, container ${CONTAINER}," \
        "${OMP_NUM_THREADS:-?} thread(s) per rank"
    clear_stale_mpi_sessions
    run_doctor "$np"
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "dry run: $(printf '%q ' "${cmd[@]}")"
        return 0
    fi
    local rc=0 before copy copier status
    before=$(jobs_py fingerprint "${CKPT_DIR:-/nonexistent}")
    job_tmp OUTPUT output
    # The copy ignores Ctrl-C and SIGTERM: were it to die, mpirun's output would have nowhere to go.
    exec {copy}> >(trap '' INT TERM; exec tee "$OUTPUT")
    copier=$!
    run_stoppable "${cmd[@]}" >&"$copy" 2>&1 {copy}>&- || rc=$?
    exec {copy}>&-
    wait_for_copy "$copier"
    # What the status means, said and recorded; the chain's next job told of slow hosts (jobs.py).
    status=$(jobs_py finish "${CKPT_DIR:-}" "$rc" --before "$before" --output "$OUTPUT" --job "$JOB_NUM" \
        ${CHAIN_ID:+--chain "$CHAIN_ID"} --submit-dir "${SUBMIT_DIR:-$REPO/.submit}") || status=$rc
    return "$status"
}
