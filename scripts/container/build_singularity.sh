#!/usr/bin/env bash
# Route 2: Singularity alone, from the definition file (on ABCI: singularity build --fakeroot).
#   scripts/container/build_singularity.sh [OUTPUT.sif]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-ddp_abci.sif}
# The build unpacks several GB (torch's CUDA libraries): SINGULARITY_TMPDIR and
# SINGULARITY_CACHEDIR default to BUILD_DIR (default $TMPDIR, else /tmp); on ABCI, inside an
# interactive job, point it at the node's local disk, BUILD_DIR=$PBS_LOCALDIR (set in jobs only).
# EXTRA_REQUIREMENTS, EXTRA_PACKAGES (your packages) and TORCH_INDEX: stage_build.sh.
# DRY_RUN=1 prints the commands.
BUILD_DIR=${BUILD_DIR:-${TMPDIR:-/tmp}}
export SINGULARITY_TMPDIR=${SINGULARITY_TMPDIR:-$BUILD_DIR/singularity-tmp}
export SINGULARITY_CACHEDIR=${SINGULARITY_CACHEDIR:-$BUILD_DIR/singularity-cache}
# shellcheck source=scripts/container/stage_build.sh
source scripts/container/stage_build.sh
stage_build
if [ "${DRY_RUN:-}" = 1 ]; then  # print what it would run
    run() { echo "dry run: $*"; }
else
    run() { "$@"; }
    mkdir -p "$SINGULARITY_TMPDIR" "$SINGULARITY_CACHEDIR"
fi
run singularity build --fakeroot "$out" scripts/container/ddp_abci.def
# The image's MPI beside the host's: they must be ABI-compatible (Open MPI 4.1 for HPC-X 2.20).
echo "host MPI: $(ompi_info --version 2>/dev/null | head -1 || echo 'no ompi_info: load the hpcx module first (module load hpcx/2.20)')"
run singularity exec "$out" python3 -c "import mpi4py.MPI as M; print('image MPI:', M.Get_library_version().splitlines()[0])"
[ "${DRY_RUN:-}" = 1 ] || echo "built $out"
