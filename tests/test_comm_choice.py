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


class Store:
    """A store whose keys are set by hand: rank 1's answer may never come."""

    def __init__(self):
        self.keys = {}

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def wait(self, keys, timeout):
        if any(k not in self.keys for k in keys):
            raise RuntimeError("Socket Timeout")

    def get(self, key):
        return self.keys[key]


def test_the_probes_agree_on_each_paths_slowest_rank_and_a_silent_rank_puts_mpi_out(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    store = Store()
    store.set("ddp_abci/comm_choice/1", '{"mpi": 0.3, "gloo": 0.1}')
    assert comm_choice.agree(store, {"mpi": 0.2, "gloo": 0.4}) == {"mpi": 0.3, "gloo": 0.4}
    monkeypatch.setattr(comm_choice, "AGREE_S", 0.01)
    assert comm_choice.agree(Store(), {"mpi": 0.2, "gloo": 0.4})["mpi"] is None  # rank 1 never answered
