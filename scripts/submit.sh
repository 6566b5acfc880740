#!/bin/bash
# Submit ddp_abci, one job or a chain of them: scripts/submit.sh --help says how. Everything is
# checked and decided by ddp_abci/cluster/submission.py, with the checkout on PYTHONPATH and no
# torch needed: run by JOBS_PYTHON, else PYTHON where no container is used and it is there, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${JOBS_PYTHON:-}
if [ -z "$python" ] && [ "${CONTAINER:-}" = none ] && command -v "${PYTHON:-}" >/dev/null 2>&1; then
    python=$PYTHON
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "${python:-python3}" -m ddp_abci.jobs submit "$@"
