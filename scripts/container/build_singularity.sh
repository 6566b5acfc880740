#!/usr/bin/env bash
# Route 2: Singularity alone, from the definition file (on ABCI: singularity build --fakeroot).
#   bash scripts/container/build_singularity.sh [OUTPUT.sif]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-ddp_abci.sif}
singularity build --fakeroot "$out" scripts/container/ddp_abci.def
echo "built $out"
