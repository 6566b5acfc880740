"""The test tiers. A test that starts processes through a launcher asks for its fixture:
`mpirun` (real ranks), `two_hosts` (network namespaces), `slurm` or `grid_engine` (a real
scheduler). Those tests are marked `launcher` here, from what they ask for, so that
`scripts/test.sh --quick` (pytest -m "not launcher") runs all the others: no test is
tiered by hand."""
import os
import shutil

import pytest

# A test process must not look like an MPI rank to the library (it would try mpi4py).
for _var in [v for v in os.environ if v.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))]:
    del os.environ[_var]

LAUNCHERS = {"mpirun", "two_hosts", "slurm", "grid_engine"}


def pytest_configure(config):
    config.addinivalue_line("markers", "launcher: starts processes through mpirun, namespaces or a scheduler "
                                       "(set by conftest.py from the fixtures a test uses)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LAUNCHERS & set(item.fixturenames):
            item.add_marker(pytest.mark.launcher)


@pytest.fixture(scope="session")
def mpirun() -> str:
    """The venv's mpirun (Open MPI 5 from pip): the tests that start real ranks ask for it."""
    from helpers import MPIRUN

    if not MPIRUN or not shutil.which(MPIRUN):
        pytest.fail("mpirun not found: run scripts/setup.sh (installs the mpi extra)")
    return MPIRUN
