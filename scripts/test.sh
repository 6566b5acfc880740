#!/usr/bin/env bash
# Set up .venv, lint the tree with ruff ([tool.ruff] in pyproject.toml), then run the tests.
#   scripts/test.sh           the full suite (what .ci/run runs): the scheduler labs beside the
#                                  tests that start no process, then the other launcher tests
#   scripts/test.sh --quick   the tests that start no mpirun, namespace or scheduler
#                                  (tests/conftest.py marks the others from their fixtures)
# Other arguments go to pytest, in one run. pytest's exit 5 ("no tests collected") fails too.
# DRY_RUN=1 prints the commands instead of running them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
args=()
for a in "$@"; do
    if [ "$a" = --quick ]; then args+=(-m "not launcher"); else args+=("$a"); fi
done
if [ "${DRY_RUN:-}" = 1 ]; then
    echo -n "dry run: scripts/setup.sh; apt-get install the schedulers' packages (root); .venv/bin/ruff check .; "
    if [ "${#args[@]}" -gt 0 ]; then
        echo ".venv/bin/python -m pytest ${args[*]}"
    else
        echo "pytest -m 'not launcher' beside pytest -m scheduler; then pytest -m 'launcher and not scheduler'"
    fi
    exit 0
fi
bash scripts/setup.sh || exit 1
# The scheduler tests run a real Slurm (and Grid Engine) from Debian's packages: install them
# when missing, as root (CI runs as root); elsewhere those tests skip, and in CI they fail.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    missing=()
    for pair in slurmctld:slurm-wlm munged:munge sge_qmaster:gridengine-master sge_execd:gridengine-exec \
        qsub:gridengine-client; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "test.sh: installing ${missing[*]} for the scheduler tests"
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; } ||
            echo "test.sh: could not install ${missing[*]}; the scheduler tests will say so" >&2
    fi
fi
.venv/bin/ruff check . || { echo "test.sh: ruff found the problems above: fix them first" >&2; exit 1; }

# pytest ARGS...: 0, or 1 for any failure, "no tests collected" (pytest's exit 5) included.
pytest() {
    .venv/bin/python -m pytest "$@"
    local rc=$?
    [ "$rc" -eq 5 ] && echo "test.sh: pytest $* collected no tests: failing" >&2
    [ "$rc" -eq 0 ]
}
if [ "${#args[@]}" -gt 0 ]; then
    pytest "${args[@]}"
    exit $?
fi
# The full suite in two lanes, then the rest (conftest.py marks the tiers). The scheduler labs'
# jobs wait on walltimes and on the schedulers' cycles, so the tests that start no process run
# beside them, at the lowest priority (nice 19): they take the cores the labs leave idle, and the
# labs' jobs, sized by the time they have, train at their own speed (at nice 0 a Slurm chain's
# 12-s jobs trained a third of their steps and the chain ran out of jobs). The other launcher
# tests run alone: they time things, and beside more ranks than cores they fail (docs/testing.md).
quick_log=$(mktemp)
nice -n 19 .venv/bin/python -m pytest -m "not launcher" -p no:cacheprovider >"$quick_log" 2>&1 &
quick=$!
pytest -m scheduler
labs=$?
wait "$quick"
quick_rc=$?
[ "$quick_rc" -eq 5 ] && echo "test.sh: pytest -m 'not launcher' collected no tests: failing" >&2
cat "$quick_log"
rm -f "$quick_log"
pytest -m "launcher and not scheduler"
rest=$?
[ "$labs" -eq 0 ] && [ "$quick_rc" -eq 0 ] && [ "$rest" -eq 0 ]
