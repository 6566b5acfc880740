#!/usr/bin/env bash
# GPU check, a few minutes on a GPU machine: the NCCL process group, fp16 steps with a
# GradScaler and bf16 steps, then the benchmark at the seed's configuration and at a larger
# one that fills the GPU. Writes $OUT_DIR/gpu_check.json (default bench-results/gpu).
# On a machine without a GPU it says so and exits 3.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT_DIR=${OUT_DIR:-bench-results/gpu}
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: no GPU visible to torch (torch.cuda.is_available() is False): nothing to check here" >&2
    exit 3
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,sm,tcp}
MPIRUN=${MPIRUN:-$(dirname "$PYTHON")/mpirun}
NGPU=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
mkdir -p "$OUT_DIR"

for amp in fp16 bf16; do  # NCCL group, one rank per GPU; fp16 goes through GradScaler
    "$MPIRUN" -n "$NGPU" "$PYTHON" -m ddp_abci.train --epochs 3 --amp "$amp" --summary-json "$OUT_DIR/train_$amp.json"
done
"$PYTHON" -m ddp_abci.bench --world-size "$NGPU" --bs 50 --amp fp16 --epochs 5 --rounds 2 \
    --sides raw,accelerate --out "$OUT_DIR/bench_seed.json"
"$PYTHON" -m ddp_abci.bench --world-size "$NGPU" --bs 16384 --num-items 400000 --amp bf16 --epochs 3 --rounds 2 \
    --sides raw,accelerate --out "$OUT_DIR/bench_large.json"

"$PYTHON" - "$OUT_DIR" <<'PY'
import json, sys, pathlib, torch
out = pathlib.Path(sys.argv[1])
summary = {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
for name in ("train_fp16", "train_bf16", "bench_seed", "bench_large"):
    data = json.loads((out / f"{name}.json").read_text())
    summary[name] = data.get("sides", data) if name.startswith("bench") else {
        k: data[k] for k in ("samples_per_s", "final_loss", "precision", "steps", "peak_mem_mib_per_rank")}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
PY
