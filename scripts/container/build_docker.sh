#!/usr/bin/env bash
# Route 1: docker build, then convert the daemon's image to a .sif (needs Docker and Singularity).
#   bash scripts/container/build_docker.sh [OUTPUT.sif]
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=ddp_abci:$(python3 -c 'import re; print(re.search(r"__version__ = \"(.+)\"", open("ddp_abci/__init__.py").read())[1])')
out=${1:-ddp_abci.sif}
docker build -t "$tag" -f scripts/container/Dockerfile .
singularity build "$out" "docker-daemon://$tag"
echo "built $out from $tag"
