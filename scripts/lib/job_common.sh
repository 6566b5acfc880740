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
#   LOG_DIR         where submit.sh asks the scheduler to put each job's output (default: the
#                   folder it is run from, the checkout)

# submit.sh passes its settings in a file: qsub -v would split values at their commas.
if [ -n "${DDP_ABCI_ENV:-}" ]; then
    # shellcheck disable=SC1090
    source "$DDP_ABCI_ENV"
fi

die() {
    echo "$(basename "$0"): error: $*" >&2
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
# --bs DEFAULT_BS unless the arguments give one: the trainer's own 50 divides by no 8-rank node.
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

# A walltime in seconds: "12:00:00", "1-00:00:00", "12h", "90m", "45s", "2d" (what users type),
# or, from the schedulers themselves, "MM:SS" (squeue's %L) and plain seconds (qstat -j).
to_seconds() {
    local t=$1 days=0 h=0 m=0 s=0
    case "$t" in
        *[0-9][dhms])
            [[ "$t" =~ ^[0-9]+[dhms]$ ]] || die "walltime $t: use HH:MM:SS, D-HH:MM:SS, or a number with d, h, m or s (12h, 90m)"
            local n=$(( 10#${t%?} ))
            case "${t: -1}" in d) echo $(( n * 86400 )) ;; h) echo $(( n * 3600 )) ;; m) echo $(( n * 60 )) ;; s) echo "$n" ;; esac
            return ;;
    esac
    [[ "$t" =~ ^([0-9]+-)?[0-9]+(:[0-9]+){0,2}(\.[0-9]+)?$ ]] ||
        die "walltime $t: use HH:MM:SS, D-HH:MM:SS, or a number with d, h, m or s (12h, 90m)"
    if [[ "$t" == *-* ]]; then days=${t%%-*}; t=${t#*-}; fi
    IFS=: read -r -a parts <<<"$t"
    case ${#parts[@]} in
        3) h=${parts[0]} m=${parts[1]} s=${parts[2]} ;;
        2) m=${parts[0]} s=${parts[1]} ;;
        *) s=${parts[0]} ;;
    esac
    echo $(( 10#$days * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#${s%%.*} ))
}

# Seconds as HH:MM:SS (hours past 24 stay hours: PBS and Grid Engine take 72:00:00).
hms() {
    printf '%02d:%02d:%02d' $(( $1 / 3600 )) $(( $1 % 3600 / 60 )) $(( $1 % 60 ))
}

# Seconds as Slurm's -t: D-HH:MM:SS past a day, else HH:MM:SS.
slurm_time() {
    if [ "$1" -ge 86400 ]; then
        printf '%d-%s' $(( $1 / 86400 )) "$(hms $(( $1 % 86400 )))"
    else
        hms "$1"
    fi
}

# The global batch the trainer will use: --bs N (or --bs=N) among the arguments, else the job
# scripts' default, DEFAULT_BS (256, the seed's job script's: it divides by 8, 16, 32, ... ranks).
DEFAULT_BS=256
batch_of() {
    local bs=$DEFAULT_BS
    while [ $# -gt 0 ]; do
        case "$1" in
            --bs) bs=${2:-}; shift ;;
            --bs=*) bs=${1#--bs=} ;;
        esac
        shift
    done
    [[ "$bs" =~ ^[1-9][0-9]*$ ]] || die "--bs $bs is not a positive number"
    echo "$bs"
}

# Seconds left before the scheduler ends the job, from the scheduler itself; empty if unknown.
#   PBS: qstat -f's Resource_List.walltime minus resources_used.walltime
#   Grid Engine: qstat -j's s_rt (it sends SIGUSR1 there), else h_rt (SIGKILL, no warning), minus
#                the time this script has run
#   Slurm: squeue's %L (time left)
walltime_left_s() {
    local info limit used
    if [ -n "${PBS_JOBID:-}" ] && command -v "$(pbs_command qstat)" >/dev/null 2>&1; then
        info=$("$(pbs_command qstat)" -f "$PBS_JOBID" 2>/dev/null) || return 0
        limit=$(awk -F' = ' '/Resource_List.walltime/ {print $2; exit}' <<<"$info")
        used=$(awk -F' = ' '/resources_used.walltime/ {print $2; exit}' <<<"$info")
        [ -n "$limit" ] && echo $(( $(to_seconds "$limit") - $(to_seconds "${used:-0}") ))
    elif [ -n "${SLURM_JOB_ID:-}" ] && command -v squeue >/dev/null 2>&1; then
        limit=$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null) || return 0
        [[ "$limit" =~ ^[0-9] ]] && to_seconds "$limit"
    elif [ -n "${JOB_ID:-}" ] && command -v qstat >/dev/null 2>&1; then
        info=$(qstat -j "$JOB_ID" 2>/dev/null | grep -m1 'hard resource_list') || return 0
        limit=$(grep -o 's_rt=[0-9:]*' <<<"$info" | cut -d= -f2)
        [ -n "$limit" ] || limit=$(grep -o 'h_rt=[0-9:]*' <<<"$info" | cut -d= -f2)
        [ -n "$limit" ] && echo $(( $(to_seconds "$limit") - SECONDS ))
    fi
    return 0
}

# PBS's own command: where /etc/pbs.conf says PBS lives (PBS_EXEC). A PBS job's PATH puts
# /opt/pbs/bin last (/etc/profile.d/pbs.sh), and another scheduler's qstat may come first.
pbs_command() {
    local exec
    exec=$(sed -n 's/^PBS_EXEC=//p' "${PBS_CONF_FILE:-/etc/pbs.conf}" 2>/dev/null)
    if [ -n "$exec" ] && [ -x "$exec/bin/$1" ]; then echo "$exec/bin/$1"; else echo "$1"; fi
}

# The default time kept free before a walltime of $1 seconds: 2 minutes, or a quarter of a
# short one (a 1-minute job keeps 15 s).
margin_s() {
    local quarter=$(( $1 / 4 ))
    if [ "$quarter" -lt 120 ]; then echo "$quarter"; else echo 120; fi
}

# --stop-after for the trainer: the walltime is the plan, signals are the fallback.
deadline_args() {
    local left stop=${STOP_AFTER:-}
    if [ -z "$stop" ]; then
        left=$(walltime_left_s)
        [ -n "$left" ] || return 0
        stop=$(( left - ${STOP_MARGIN_S:-$(margin_s "$left")} ))
        if [ "$stop" -lt 10 ]; then
            echo "job $JOB_NUM: only ${left}s of walltime left; no --stop-after, signals are the only stop" >&2
            return 0
        fi
        echo "job $JOB_NUM: ${left}s of walltime left; the trainer stops, saves and exits 75 within ${stop}s"
    fi
    TRAIN+=(--stop-after "$stop")
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

# What the job's exit status means for the next step (docs/abci.md, "when a job fails").
explain_exit() {
    case "$1" in
        75) if [ -n "${CKPT_DIR:-}" ]; then
                echo "job $JOB_NUM: stopped early with a checkpoint; resubmit with the same CKPT_DIR to continue" \
                    "(Open MPI's 'exited with non-zero status' block above is this exit 75: expected)"
            else
                echo "job $JOB_NUM: stopped early with no checkpoint (no CKPT_DIR): its work is lost; set CKPT_DIR" \
                    "to carry a run from job to job"
            fi ;;
        65) echo "job $JOB_NUM: diverged; the last good checkpoint is kept; do not resubmit as is: lower --lr or add --clip-norm" ;;
        69) echo "job $JOB_NUM: a rank stopped answering (named above, with its host); the last checkpoint is intact: resubmit with the same CKPT_DIR, and check that host" ;;
        74) echo "job $JOB_NUM: a checkpoint could not be written (disk full, quota, folder); free space, then resubmit" ;;
        2) echo "job $JOB_NUM: refused before training (bad setting, named above); fix it, then resubmit" ;;
        1) echo "job $JOB_NUM: failed unexpectedly (the traceback above: CUDA out of memory, an NCCL error, a bug);" \
               "the last checkpoint is intact; resubmit once for a passing fault, fix the cause if it repeats" ;;
    esac
}

# A field of CKPT_DIR/status, the run's own record of how it ended (checkpoint.write_status).
status_field() {
    awk -v key="$1" 'index($0, key "=") == 1 {print substr($0, length(key) + 2); exit}' "$CKPT_DIR/status" 2>/dev/null
}

# The record's fingerprint, taken before mpirun: a record is this job's when it differs. Its time
# cannot tell: a job that fails at once ends within the second the job before it recorded in.
status_print() {
    cksum "${CKPT_DIR:-/nonexistent}/status" 2>/dev/null || echo none
}

# Whether the run (or this job) wrote CKPT_DIR/status since status_print gave $1.
recorded_since() {
    [ -f "$CKPT_DIR/status" ] && [ "$(status_print)" != "$1" ]
}

# The run's exit status, from mpirun's and the run's record. mpirun's is not always the run's:
# cut off from a host, Open MPI 5's mpirun exited 0 (measured: docs/reliability.md). So a
# status the run recorded during this job wins, and without one a 0 is not believed. A refusal
# (2) and an unexpected failure (1) record nothing themselves: the job records them, with the
# run's last error line, so that a chain stops on a refusal and on a failure that repeats.
reconciled_status() {
    local rc=$1 before=$2 recorded host
    [ -n "${CKPT_DIR:-}" ] || { echo "$rc"; return; }
    if recorded_since "$before"; then
        recorded=$(status_field status)
        if [ "$recorded" != "$rc" ]; then
            echo "job $JOB_NUM: mpirun exited $rc; the run recorded $recorded: $(status_field line)" >&2
        fi
        echo "$recorded"
    elif [ "$rc" = 0 ]; then
        lost_host "job $JOB_NUM: mpirun exited 0 but the run recorded no end in $CKPT_DIR/status: a rank or the" \
            "launcher was lost (Open MPI's lines above name the host); treated as 69"
    elif host=$(lost_daemon_host); then
        lost_host "job $JOB_NUM: mpirun exited $rc after Open MPI lost its daemon on $host (its lines above) during" \
            "training: that host, or the link to it, was lost; treated as 69"
    else
        if [ "$rc" = 2 ] || [ "$rc" = 1 ]; then
            record_status "$rc" "$(mpirun_output | grep '^error:' | tail -n 1)"
        fi
        echo "$rc"
    fi
}

# lost_host WORDS...: the 69 of a host lost where the run could not record it, said on stderr
# and recorded (the chain's next job resumes: 69 is a verdict it acts on).
lost_host() {
    echo "$*" >&2
    record_status 69 "$*"
    echo 69
}

# The host whose Open MPI daemon was lost after the ranks had started, from mpirun's output. Cut
# off from a host, mpirun either gives up on its own send (PRRTE's "lost communication with a
# remote daemon") or hears first that the daemon there ended (its "A daemon failed to report
# back", with exit 1): measured between the test's two hosts, the same cut gave either. Before
# the ranks start the same lines mean a launch that cannot work (no prted there), not a lost host.
lost_daemon_host() {
    grep -q '^ddp_abci: world size' "$OUTPUT" 2>/dev/null &&
        grep -q -e 'lost communication with a remote daemon' -e 'A daemon failed to report back' "$OUTPUT" ||
        return 1
    local host
    host=$(mpirun_output | grep -o -e 'Remote daemon: .* on node [^ ]*' -e 'Remote host: *[^ ]*' | head -n 1 |
        awk '{print $NF}')
    echo "${host:-a host}"
}

# mpirun's output as text. Open MPI 5 ends its MPI_ABORT banner with a NUL byte (measured: 1 run in
# 6 of a failing fit()): a rank's line that arrives after the banner starts with it, and grep takes
# the file for binary, where -o and a plain match print nothing. (grep -q answers right either way.)
mpirun_output() {
    tr -d '\000' < "$OUTPUT" 2>/dev/null
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

# record_status STATUS LINE: the job's own record in CKPT_DIR/status, as the run writes it
# (checkpoint.write_status), atomically; `failures` counts exits 1 in a row within the chain.
record_status() {
    local tmp failures=0
    mkdir -p "$CKPT_DIR" 2>/dev/null || return 0
    if [ "$1" = 1 ] && [ -f "$CKPT_DIR/status" ] && [ "$(status_field status)" = 1 ]; then
        failures=$(status_field failures)
    fi
    tmp=$(mktemp "$CKPT_DIR/.status.XXXXXX.tmp") || return 0
    printf 'status=%s\nfinished=0\nstep=%s\nrank=-\nhost=%s\nunix=%s\nline=%s\nfailures=%s\n' "$1" \
        "$(status_field step)" "$(hostname)" "$(date +%s)" "${2:-exit $1}" "$(( ${failures:-0} + ($1 == 1) ))" \
        >"$tmp" && mv "$tmp" "$CKPT_DIR/status"
}

# A job of a chain (submit.sh -c) first reads what the jobs before it recorded in
# CKPT_DIR/status: a finished run needs nothing more (exit 0 at once); a diverged one (65), a
# failing storage (74), a refused input (2) or an unexpected failure twice in a row (1) will not
# mend by itself, so the chain stops there (this job, and each after it, exits at once with that
# status, saying why). 69, 75 and a first 1 resume.
chain_verdict() {
    [ -n "${CHAIN_ID:-}" ] && [ -n "${CKPT_DIR:-}" ] && [ -f "$CKPT_DIR/status" ] || return 0
    [ "$(status_field chain)" = "$CHAIN_ID" ] || return 0
    local status
    status=$(status_field status)
    if [ "$status" = 0 ] && [ "$(status_field finished)" = 1 ]; then
        echo "job $JOB_NUM: the run in $CKPT_DIR is finished (step $(status_field step)); nothing to train"
        exit 0
    fi
    case "$status" in
        65 | 74 | 2)
            echo "job $JOB_NUM: the chain stops: an earlier job ended with $status: $(status_field line)" >&2
            exit "$status" ;;
        1)
            if [ "$(status_field failures)" -ge 2 ] 2>/dev/null; then
                echo "job $JOB_NUM: the chain stops: two jobs in a row failed unexpectedly (exit 1): $(status_field line)" >&2
                exit 1
            fi ;;
    esac
}

# After mpirun: the chain's id on the run's record (written during this job), for the next job.
stamp_chain() {
    local before=$1 tmp
    [ -n "${CHAIN_ID:-}" ] && [ -n "${CKPT_DIR:-}" ] && recorded_since "$before" || return 0
    tmp=$(mktemp "$CKPT_DIR/.status.XXXXXX.tmp")
    { grep -v '^chain=' "$CKPT_DIR/status"; echo "chain=$CHAIN_ID"; } >"$tmp" && mv "$tmp" "$CKPT_DIR/status"
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

# Leave the hosts the run found straggling (CKPT_DIR/slow_hosts.json) out of the chain's next
# job, where the scheduler can: Slurm's pending job takes an ExcNodeList (scontrol update). PBS
# Professional and Grid Engine offer no exclusion a pending job can be given without replacing
# its whole resource request (qalter -l): there the hosts are named for the user to act on.
exclude_slow_hosts() {
    local hosts next
    [ -n "${CHAIN_ID:-}" ] && [ -n "${CKPT_DIR:-}" ] && [ -f "$CKPT_DIR/slow_hosts.json" ] || return 0
    hosts=$(grep -o '"hosts": \[[^]]*\]' "$CKPT_DIR/slow_hosts.json" | grep -o '"[^"]*"' | tr -d '"' |
        grep -v '^hosts$' | paste -sd, -)
    [ -n "$hosts" ] || return 0
    next=$(grep -A1 -x "${SLURM_JOB_ID:-none}" "${SUBMIT_DIR:-$REPO/.submit}/$CHAIN_ID.jobs" 2>/dev/null | tail -n +2)
    if [ -n "${SLURM_JOB_ID:-}" ] && [ -n "$next" ] && command -v scontrol >/dev/null 2>&1; then
        scontrol update "JobId=$next" "ExcNodeList=$hosts" &&
            echo "job $JOB_NUM: the chain's next job ($next) leaves out the hosts that straggled: $hosts"
    else
        echo "job $JOB_NUM: these hosts straggled (CKPT_DIR/slow_hosts.json): $hosts; this scheduler's queued" \
            "jobs cannot be told to avoid them: tell your site's support if it repeats" >&2
    fi
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
# goes to a file, where the run's last error line is found for the record (reconciled_status).
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
    local rc=0 before copy copier
    before=$(status_print)
    job_tmp OUTPUT output
    # The copy ignores Ctrl-C and SIGTERM: were it to die, mpirun's output would have nowhere to go.
    exec {copy}> >(trap '' INT TERM; exec tee "$OUTPUT")
    copier=$!
    run_stoppable "${cmd[@]}" >&"$copy" 2>&1 {copy}>&- || rc=$?
    exec {copy}>&-
    wait_for_copy "$copier"
    rc=$(reconciled_status "$rc" "$before")
    stamp_chain "$before"
    exclude_slow_hosts
    explain_exit "$rc"
    return "$rc"
}
