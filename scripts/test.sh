#!/usr/bin/env bash
# Set up .venv, lint the tree with ruff ([tool.ruff] in pyproject.toml), then run the test
# suite. pytest's exit 5 ("no tests collected") fails too.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bash scripts/setup.sh || exit 1
.venv/bin/ruff check . || { echo "test.sh: ruff found the problems above: fix them first" >&2; exit 1; }
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
    echo "test.sh: pytest collected no tests: failing" >&2
    exit 1
fi
exit "$rc"
