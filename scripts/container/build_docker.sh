#!/usr/bin/env bash
# Route 1: docker build, then convert the daemon's image to a .sif (needs Docker and Singularity).
#   bash scripts/container/build_docker.sh [OUTPUT.sif]
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=ddp_abci:$(python3 -c 'import re; print(re.search(r"__version__ = \"(.+)\"", open("ddp_abci/__init__.py").read())[1])')
out=${1:-ddp_abci.sif}
# Unpacking a ~20 GB NGC image needs room: SINGULARITY_TMPDIR and SINGULARITY_CACHEDIR
# default to BUILD_DIR (default $TMPDIR, else /tmp); on ABCI point it at a large file system,
# e.g. BUILD_DIR=$PBS_LOCALDIR (node-local) or a folder under /groups/GROUP.
BUILD_DIR=${BUILD_DIR:-${TMPDIR:-/tmp}}
export SINGULARITY_TMPDIR=${SINGULARITY_TMPDIR:-$BUILD_DIR/singularity-tmp}
export SINGULARITY_CACHEDIR=${SINGULARITY_CACHEDIR:-$BUILD_DIR/singularity-cache}
mkdir -p "$SINGULARITY_TMPDIR" "$SINGULARITY_CACHEDIR"
docker build -t "$tag" -f scripts/container/Dockerfile .
singularity build "$out" "docker-daemon://$tag"
# The image's MPI beside the host's: they must be ABI-compatible (Open MPI 4.1 for HPC-X 2.20).
echo "host MPI: $(ompi_info --version 2>/dev/null | head -1 || echo 'no ompi_info: load the hpcx module')"
singularity exec "$out" python3 -c "import mpi4py.MPI as M; print('image MPI:', M.Get_library_version().splitlines()[0])"
echo "built $out from $tag"
