"""The embedding API: cheap to import, usable without mpi4py, and the README's example runs."""
import re

import pytest

from helpers import PYTHON, REPO, assert_clean, on_ranks, run

pytestmark = pytest.mark.untimed


def test_importing_the_package_loads_neither_torch_nor_mpi4py():
    code = "import sys, ddp_abci; print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules))"
    proc = run([PYTHON, "-c", code])
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_package_works_without_mpi4py():
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "from ddp_abci import discover_launch\n"
            "print(discover_launch(environ={'OMPI_COMM_WORLD_SIZE': '1', 'OMPI_COMM_WORLD_RANK': '0',"
            " 'OMPI_COMM_WORLD_LOCAL_RANK': '0', 'OMPI_COMM_WORLD_LOCAL_SIZE': '1'}).source)")
    proc = run([PYTHON, "-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "ompi-env", proc.stdout  # the fallback, no MPI_Init


def test_the_readme_embedding_example_trains_on_two_ranks(tmp_path, mpirun):
    example = re.search(r"### Embedding it\n\n```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)[1]
    script = tmp_path / "example.py"
    script.write_text(example + "\nprint('rank', launch.rank, 'loss', float(loss))\n")
    proc = run(on_ranks(2, str(script)))
    assert_clean(proc)
    assert "rank 0 loss" in proc.stdout and "rank 1 loss" in proc.stdout
