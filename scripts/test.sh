#!/usr/bin/env bash
# Set up .venv, lint the tree with ruff ([tool.ruff] in pyproject.toml), then run the tests.
#   scripts/test.sh           the full suite (what .ci/run runs), in two lanes (below)
#   scripts/test.sh --quick   the tests that start no mpirun, namespace or scheduler, in the
#                                  same two lanes (tests/conftest.py marks the others from their fixtures)
# Other arguments go to one pytest run (--quick among them: -m "not launcher").
# pytest's exit 5 ("no tests collected") fails too. DRY_RUN=1 prints the commands instead of running them.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
args=()
for a in "$@"; do
    if [ "$a" = --quick ]; then args+=(-m "not launcher"); else args+=("$a"); fi
done
quick=""
if [ "$*" = --quick ]; then quick=" and not launcher"; fi  # --quick alone: the lanes, less the launchers
if [ "${DRY_RUN:-}" = 1 ]; then
    lanes="chrt --idle 0 .venv/bin/python -m pytest -m 'untimed$quick' ... & .venv/bin/python -m pytest -m 'not untimed and not alone$quick'"
    if [ -n "$quick" ]; then run=$lanes; elif [ "$#" -gt 0 ]; then run=".venv/bin/python -m pytest ${args[*]}"; else
        run="$lanes; then .venv/bin/python -m pytest -m alone"; fi
    echo "dry run: scripts/setup.sh beside apt-get install of the schedulers' packages (root); .venv/bin/ruff check .; $run"
    exit 0
fi
# The scheduler tests run a real Slurm (and Grid Engine) from Debian's packages: install them
# when missing, as root (CI runs as root); elsewhere those tests skip, and in CI they fail.
install_schedulers() {
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 0
    local missing=() pair
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
}
# OpenPBS for the PBS lab (tests/test_pbs.py): its own start script installs Debian's runtime
# packages and unpacks the build (about 70 s on a bare machine), then it is stopped again; the lab
# starts it in 15 s. Where the project's shared/pbs is absent the PBS tests say so and skip.
install_pbs() {
    local pbs=../shared/pbs
    [ "$(id -u)" = 0 ] && [ -x "$pbs/start-pbs.sh" ] && [ ! -x /opt/pbs/sbin/pbs_server ] || return 0
    echo "test.sh: installing OpenPBS from $pbs for the PBS tests"
    { bash "$pbs/start-pbs.sh" && bash "$pbs/stop-pbs.sh"; } >/dev/null 2>&1 ||
        echo "test.sh: OpenPBS did not install; the PBS tests will say so" >&2
}
# Beside the venv's set-up, which keeps one core busy (45 core-seconds in 46 s on a fresh clone
# here) while the machine has two.
{ install_schedulers; install_pbs; } &
schedulers=$!
bash scripts/setup.sh || exit 1
wait "$schedulers"
.venv/bin/ruff check . || { echo "test.sh: ruff found the problems above: fix them first" >&2; exit 1; }
pytest_ok() {  # pytest's exit status, with 5 ("no tests collected") a failure too
    if [ "$1" -eq 5 ]; then echo "test.sh: pytest collected no tests${2:+ $2}: failing" >&2; return 1; fi
    return "$1"
}
if [ "$#" -gt 0 ] && [ -z "$quick" ]; then
    .venv/bin/python -m pytest "${args[@]}"
    pytest_ok $?
    exit
fi
# The suite in two lanes. The suite is CPU-bound launch by launch, yet run as one pytest it
# left a quarter of the two cores' time idle (scheduler waits, watchdog timeouts: docs/testing.md;
# with the lanes they are 94 to 100 % busy). The tests that assert nothing about time (marked
# untimed) fill it at SCHED_IDLE priority, which runs only where a core would otherwise idle: the
# timed tests get the cores whenever they want them. Only a core: the idle lane still runs where a
# rank waits, so the tests that compare ranks' speeds (marked alone) run after both lanes (not in
# --quick: each starts mpirun).
lane=$(mktemp -d)
chrt --idle 0 .venv/bin/python -m pytest -m "untimed$quick" -p no:cacheprovider --basetemp "$lane/tmp" >"$lane/log" 2>&1 &
untimed=$!
.venv/bin/python -m pytest -m "not untimed and not alone$quick"
timed_rc=$?
wait "$untimed"
untimed_rc=$?
echo "=== the untimed tests (at idle priority beside the above) ==="
cat "$lane/log"
rm -rf "$lane"
if [ -n "$quick" ]; then
    pytest_ok "$timed_rc" "(timed)" && pytest_ok "$untimed_rc" "(untimed)"
    exit
fi
echo "=== the tests that compare ranks' speeds (alone, after both lanes) ==="
.venv/bin/python -m pytest -m alone -p no:cacheprovider
alone_rc=$?
pytest_ok "$timed_rc" "(timed)" && pytest_ok "$untimed_rc" "(untimed)" && pytest_ok "$alone_rc" "(alone)"
