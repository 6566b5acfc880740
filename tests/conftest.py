"""The test tiers. A test that starts processes through a launcher asks for its fixture:
`mpirun` (real ranks), `two_hosts` (network namespaces), `slurm`, `grid_engine` or `pbs` (a
real scheduler). Those tests are marked `launcher` here, from what they ask for, so that
`scripts/test.sh --quick` (pytest -m "not launcher") runs all the others: no test is
tiered by hand.

A module whose tests assert nothing about time (no bound on how long something took, no speed,
no timeout to be met, no namespaces) says so with `pytestmark = pytest.mark.untimed`, a single
test with `@pytest.mark.untimed`: the full suite runs those at idle CPU priority beside the
others (scripts/test.sh). A module that compares ranks' speeds with each other says
`pytestmark = pytest.mark.alone`: the full suite runs it after both lanes, on a machine of its own."""
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

# A test process must not look like an MPI rank to the library (it would try mpi4py).
for _var in [v for v in os.environ if v.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))]:
    del os.environ[_var]

LAUNCHERS = {"mpirun", "two_hosts", "slurm", "grid_engine", "pbs"}


def pytest_configure(config):
    config.addinivalue_line("markers", "launcher: starts processes through mpirun, namespaces or a scheduler "
                                       "(set by conftest.py from the fixtures a test uses)")
    config.addinivalue_line("markers", "untimed: asserts nothing about time; scripts/test.sh runs these at idle "
                                       "CPU priority beside the others")
    config.addinivalue_line("markers", "alone: compares ranks' speeds; scripts/test.sh runs these after the other "
                                       "tests, with nothing beside them")


# The modules whose tests mostly wait on clocks (walltimes, timeouts, report intervals) run first:
# in the full suite the untimed lane fills those waits, and the CPU-bound rest, last, keeps both
# cores busy after that lane has finished (a fresh clone's last minute, with them last, ran at
# 50 to 65 % of the two cores: docs/testing.md).
WAITING = ("test_pbs.py", "test_slurm.py", "test_grid_engine.py", "test_watchdog.py", "test_two_hosts.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LAUNCHERS & set(item.fixturenames):
            item.add_marker(pytest.mark.launcher)
    items.sort(key=lambda item: item.path.name not in WAITING)  # stable: each module's order kept


@pytest.fixture(scope="session")
def mpirun() -> str:
    """The venv's mpirun (Open MPI 5 from pip): the tests that start real ranks ask for it."""
    from helpers import MPIRUN

    if not MPIRUN or not shutil.which(MPIRUN):
        pytest.fail("mpirun not found: run scripts/setup.sh (installs the mpi extra)")
    return MPIRUN


@pytest.fixture(autouse=True)
def no_stale_mpi_sessions():
    """Tests SIGKILL mpirun, and Open MPI 5 then leaves its session folder (/tmp/ompi.PID): a later
    mpirun given that PID fails at once ("The PMIx server's listener thread failed to start"), and
    a suite's run goes through 23,000 PIDs in 12 minutes (of 32768 here). The job scripts remove
    them too (clear_stale_mpi_sessions); here after every test, those whose process is gone."""
    yield
    for folder in Path(os.environ.get("TMPDIR", "/tmp")).glob("ompi.[0-9]*"):
        if not Path("/proc", folder.name.split(".", 1)[1]).exists():
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def outsider() -> str:
    """Another Linux user (helpers.OUTSIDER): made if missing, let into this checkout's Python."""
    from helpers import OUTSIDER, give_back_modes, let_others_in

    if os.geteuid() != 0:
        pytest.skip("the outsider is another Linux user: making one needs root")
    try:
        pwd.getpwnam(OUTSIDER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OUTSIDER], check=True)
    modes: dict = {}
    let_others_in(modes)
    yield OUTSIDER
    give_back_modes(modes)
