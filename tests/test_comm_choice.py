"""--comm auto's start-up measurement (ddp_abci/parallel/comm_choice.py): within a budget of
seconds whatever the transport does, the same verdict on every rank, gloo only when clearly faster."""
import pytest

from ddp_abci.parallel import comm_choice
from helpers import assert_clean, on_ranks, run

pytestmark = pytest.mark.usefixtures("mpirun")


def test_a_start_up_measurement_whose_mpi_stalls_takes_gloo_within_its_budget_and_says_why():
    proc = run(on_ranks(2, "tests/late_probe_script.py"), timeout=120)
    assert_clean(proc)
    line = next(line for line in proc.stdout.splitlines() if line.startswith("gradients: an all-reduce"))
    assert "(did not finish in time) through MPI" in line and "via gloo" in line, line
    assert f"MPI's first all-reduce did not finish within {comm_choice.PROBE_S:g} s on every rank" in line
    took_s = float(line.rsplit("measuring took ", 1)[1].split()[0]) / 1000
    assert took_s < 3 + comm_choice.PROBE_S + 5, line  # rank 1's 8 s late start, plus seconds: not minutes


def test_the_choice_takes_gloo_only_when_clearly_faster_and_when_mpi_did_not_answer():
    assert comm_choice.choose({"mpi": 1.0, "gloo": 0.85})[0] == "mpi"  # near a tie: MPI, runs stay alike
    assert comm_choice.choose({"mpi": 1.0, "gloo": 0.5})[0] == "gloo"
    name, why = comm_choice.choose({"mpi": None, "gloo": 0.5})
    assert name == "gloo" and "did not finish within" in why


def test_the_probes_agree_on_each_paths_slowest_rank_and_a_rank_without_mpi_puts_mpi_out(monkeypatch):
    import torch
    import torch.distributed as dist

    def all_reduce_with(other):  # the other rank's probes, as a MAX all-reduce meets them
        def all_reduce(tensor, op):
            tensor.copy_(torch.maximum(tensor, torch.tensor(other, dtype=tensor.dtype)))
        return all_reduce

    monkeypatch.setattr(dist, "all_reduce", all_reduce_with([0.1, 0.3]))  # sorted paths: gloo, mpi
    assert comm_choice.agree({"mpi": 0.2, "gloo": 0.4}) == {"mpi": 0.3, "gloo": 0.4}
    monkeypatch.setattr(dist, "all_reduce", all_reduce_with([0.1, float("inf")]))  # its MPI never finished
    assert comm_choice.agree({"mpi": 0.2, "gloo": 0.4})["mpi"] is None
