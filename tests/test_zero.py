"""--zero: the optimizer's state sharded over the ranks (ZeRO-1, ddp_abci/parallel/zero.py). It
trains as without it, holds its share of the state on each rank, and its checkpoints hold the
whole state: they resume at any world size, with or without --zero. Real ranks under mpirun."""
import json

import pytest
import torch

from helpers import assert_clean, load, run_mpi, same_tensors

pytestmark = pytest.mark.usefixtures("mpirun")

RUN = ["--epochs", "2", "--num-items", "384", "--bs", "48", "--clip-norm", "1.0", "--accum", "2"]  # 8 steps


@pytest.fixture(scope="module")
def plain_and_zero(tmp_path_factory):
    """The same run on 2 ranks without and with --zero, each with a checkpoint at step 4 kept."""
    out = {}
    for name, extra in (("plain", ()), ("zero", ("--zero",))):
        folder = tmp_path_factory.mktemp(name)
        assert_clean(run_mpi(2, *RUN, *extra, "--ckpt-dir", str(folder / "ck"), "--max-steps", "4"))
        (folder / "step4.pt").write_bytes((folder / "ck" / "last.pt").read_bytes())
        proc = run_mpi(2, *RUN, *extra, "--ckpt-dir", str(folder / "ck"), "--resume",
                       "--summary-json", str(folder / "summary.json"))
        assert_clean(proc)
        out[name] = folder
    return out


def test_a_zero_run_trains_bit_for_bit_as_the_same_run_without_it(plain_and_zero):
    plain, zero = (load(plain_and_zero[k] / "ck" / "last.pt") for k in ("plain", "zero"))
    assert plain["step"] == zero["step"] == 8 and same_tensors(plain["model"], zero["model"])


def test_each_rank_holds_half_the_optimizer_state_within_five_percent(plain_and_zero):
    plain = json.loads((plain_and_zero["plain"] / "summary.json").read_text())
    zero = json.loads((plain_and_zero["zero"] / "summary.json").read_text())
    whole = plain["optimizer_state_bytes_per_rank"][0]
    assert plain["optimizer_state_bytes_per_rank"] == [whole, whole] and not plain["zero"] and zero["zero"]
    assert all(abs(b - whole / 2) <= 0.05 * whole / 2 for b in zero["optimizer_state_bytes_per_rank"]), zero


def test_a_zero_checkpoint_holds_the_whole_state_as_an_unsharded_one_does(plain_and_zero):
    plain, zero = (load(plain_and_zero[k] / "step4.pt")["optimizer"] for k in ("plain", "zero"))
    assert plain["param_groups"] == zero["param_groups"] and plain["state"].keys() == zero["state"].keys()
    for index, state in plain["state"].items():
        assert state.keys() == zero["state"][index].keys()
        assert all(torch.equal(state[k], zero["state"][index][k]) for k in state), index


@pytest.mark.parametrize("ranks, extra", [(4, ("--zero",)), (1, ())])
def test_a_zero_checkpoint_resumes_at_another_world_size_with_or_without_zero(plain_and_zero, tmp_path, ranks, extra):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "last.pt").write_bytes((plain_and_zero["zero"] / "step4.pt").read_bytes())
    proc = run_mpi(ranks, *RUN, *extra, "--ckpt-dir", str(tmp_path / "ck"), "--resume")
    assert_clean(proc)
    assert f"world size {ranks}" in proc.stdout and "resume: " in proc.stdout, proc.stdout
    assert load(tmp_path / "ck" / "last.pt")["step"] == 8


def test_a_checkpoint_made_without_zero_resumes_with_it_bit_for_bit(plain_and_zero, tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "last.pt").write_bytes((plain_and_zero["plain"] / "step4.pt").read_bytes())
    assert_clean(run_mpi(2, *RUN, "--zero", "--ckpt-dir", str(tmp_path / "ck"), "--resume"))
    resumed, plain = load(tmp_path / "ck" / "last.pt"), load(plain_and_zero["plain"] / "ck" / "last.pt")
    assert same_tensors(resumed["model"], plain["model"])
