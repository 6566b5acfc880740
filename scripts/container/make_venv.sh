#!/usr/bin/env bash
# Your packages without a rebuild: a virtual environment (on the group disk, which every node
# sees) whose Python sees the image's packages after its own, with PIP ARGS installed into it,
# never moving the image's stack (ddp_abci/cluster/extras.py says why not ~/.local).
#   scripts/container/make_venv.sh VENV [PIP ARGS]     e.g. /groups/GROUP/venvs/lm datasets==5.2.0 tokenizers
# then VENV=/groups/GROUP/venvs/lm for the job scripts (submit.sh carries it). Made inside the
# image (CONTAINER, default ddp_abci.sif; `none`: with PYTHON on the host), so its Python is the
# image's. Run again to add packages. DRY_RUN=1 prints the command.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: scripts/container/make_venv.sh VENV [PIP ARGS]" >&2; exit 2; }
venv=$(realpath -m "$1")
shift
container=${CONTAINER:-$PWD/ddp_abci.sif}
if [ "$container" = none ]; then
    cmd=(env PYTHONPATH="$PWD" "${PYTHON:-python3}" -m ddp_abci.cluster.extras venv "$venv" "$@")
else
    cmd=(singularity exec --env PYTHONPATH="$PWD" --bind "$PWD,$(dirname "$venv")" "$container" python3 -m
        ddp_abci.cluster.extras venv "$venv" "$@")
fi
if [ "${DRY_RUN:-}" = 1 ]; then
    echo "dry run: $(printf '%q ' "${cmd[@]}")"
    exit 0
fi
mkdir -p "$(dirname "$venv")"  # Singularity binds only a folder that exists
exec "${cmd[@]}"
