#!/usr/bin/env bash
# Set up .venv, lint the tree with ruff ([tool.ruff] in pyproject.toml), then run the tests.
#   bash scripts/test.sh           the full suite (what .ci/run runs)
#   bash scripts/test.sh --quick   the tests that start no mpirun, namespace or scheduler
#                                  (tests/conftest.py marks the others from their fixtures)
# Other arguments go to pytest. pytest's exit 5 ("no tests collected") fails too.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
args=()
for a in "$@"; do
    if [ "$a" = --quick ]; then args+=(-m "not launcher"); else args+=("$a"); fi
done
bash scripts/setup.sh || exit 1
.venv/bin/ruff check . || { echo "test.sh: ruff found the problems above: fix them first" >&2; exit 1; }
.venv/bin/python -m pytest "${args[@]}"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
