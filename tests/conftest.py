import os
import shutil

import pytest

# A test process must not look like an MPI rank to the library (it would try mpi4py).
for _var in [v for v in os.environ if v.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))]:
    del os.environ[_var]


@pytest.fixture(scope="session")
def mpirun_available() -> None:
    from helpers import MPIRUN

    if not MPIRUN or not shutil.which(MPIRUN):
        pytest.fail("mpirun not found: run scripts/setup.sh (installs the mpi extra)")
