"""The trainer under `mpirun -n 2` on gloo: real processes, real all-reduce."""
import re

import pytest
import torch
from reference import reference_run

from helpers import (
    REPO,
    assert_clean,
    assert_no_thread_outlives_the_process_group,
    load,
    on_ranks,
    run,
    run_mpi,
    same_tensors,
)

pytestmark = [pytest.mark.usefixtures("mpirun"), pytest.mark.untimed]

# 400 items, global batch 50 on 2 ranks: 8 steps an epoch, 2 epochs (a reshuffle between).
# --comm mpi, not auto: on a loaded machine (the untimed lane runs at idle priority) auto may
# measure gloo faster and take it, and two runs that sum in different orders differ.
SMALL = ["--num-items", "400", "--bs", "50", "--epochs", "2", "--seed", "3", "--comm", "mpi"]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    ckpt_dir = tmp_path_factory.mktemp("run")
    proc = run_mpi(2, *SMALL, "--ckpt-dir", str(ckpt_dir))
    return proc, load(ckpt_dir / "last.pt")


@pytest.fixture(scope="module")
def reference():
    return reference_run(steps_per_epoch=8, epochs=2, num_items=400, global_batch=50, world=2, seed=3)


def test_two_ranks_train_and_exit_0_with_a_clean_log(two_rank_run):
    proc, _ = two_rank_run
    assert_clean(proc)
    assert "world size 2 (local 2), backend gloo, gradients via mpi, device cpu" in proc.stdout
    assert re.search(r"rendezvous 127\.0\.0\.1:\d+ \(from mpi4py\)", proc.stdout)
    assert proc.stdout.count("epoch 2/2:") == 1  # rank 0 logs, rank 1 does not


def test_the_logged_epoch_loss_is_the_mean_over_all_ranks(two_rank_run, reference):
    proc, _ = two_rank_run
    logged = [float(v) for v in re.findall(r"epoch \d/2: loss ([\d.]+)", proc.stdout)]
    expected = reference[2]
    assert logged == pytest.approx(expected, rel=1e-4)


def test_the_checkpoint_holds_the_documented_keys(two_rank_run):
    from ddp_abci.checkpointing.checkpoint import KEYS, OPTIONAL_KEYS

    _, state = two_rank_run
    assert set(state) == set(KEYS)
    documented = (REPO / "docs" / "reliability.md").read_text()
    missing = [key for key in (*KEYS, *OPTIONAL_KEYS) if f"`{key}`" not in documented]
    assert not missing, missing
    assert (state["epoch"], state["step"], state["world_size"]) == (2, 16, 2)
    assert state["config"]["global_batch"] == 50
    assert set(state["model"]) == {"net.0.weight", "net.0.bias", "net.1.weight", "net.1.bias"}


def test_ddp_weights_equal_the_averaged_per_rank_gradients_of_a_single_process(two_rank_run, reference):
    _, state = two_rank_run
    model, opt, _ = reference
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(state["model"][name], tensor, rtol=1e-4, atol=1e-5)
    ours = state["optimizer"]["state"]
    for i, p in enumerate(model.parameters()):
        torch.testing.assert_close(ours[i]["exp_avg_sq"], opt.state[p]["exp_avg_sq"], rtol=1e-4, atol=1e-3)
        assert float(ours[i]["step"]) == 16


def test_the_same_seed_gives_identical_weights(two_rank_run, tmp_path):
    proc = run_mpi(2, *SMALL, "--ckpt-dir", str(tmp_path))
    assert_clean(proc)
    assert same_tensors(load(tmp_path / "last.pt")["model"], two_rank_run[1]["model"])


def test_a_batch_that_does_not_divide_is_one_line_before_any_work():
    proc = run_mpi(2, "--bs", "51")
    assert proc.returncode != 0
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert errors == ["error: global_batch (--bs) 51 does not divide by world size 2; use a multiple of 2, "
                      "e.g. global_batch=50 (--bs 50)"]
    assert "training:" not in proc.stdout


@pytest.fixture(scope="module")
def via_gloo(tmp_path_factory):
    """SMALL with gradients through gloo, to its end, reporting the threads left at exit."""
    ckpt_dir = tmp_path_factory.mktemp("gloo")
    proc = run(on_ranks(2, "tests/threads_at_exit.py", "ddp_abci.train", *SMALL, "--comm", "gloo",
                        "--ckpt-dir", str(ckpt_dir)))
    return proc, load(ckpt_dir / "last.pt")


def test_gradients_through_mpi_equal_the_gloo_path_to_float_precision(two_rank_run, via_gloo):
    proc, state = via_gloo
    assert_clean(proc)
    assert "gradients via gloo" in proc.stdout and "gradients via mpi" in two_rank_run[0].stdout
    for name, tensor in two_rank_run[1]["model"].items():
        torch.testing.assert_close(state["model"][name], tensor, rtol=1e-6, atol=1e-7)


def test_closing_the_process_group_ends_gloos_threads_before_exit_at_the_end_of_a_run(via_gloo):
    assert_clean(via_gloo[0])
    assert_no_thread_outlives_the_process_group(via_gloo[0])


def test_closing_the_process_group_ends_gloos_threads_before_exit_after_a_mid_epoch_stop(tmp_path):
    # The path that saves, checks the replicas and gathers the summary last; gradients via MPI,
    # so that gloo serves the group's other collectives only
    proc = run(on_ranks(2, "tests/threads_at_exit.py", "ddp_abci.train",
                        *SMALL, "--comm", "mpi", "--max-steps", "11", "--ckpt-dir", str(tmp_path)))
    assert_clean(proc)
    assert_no_thread_outlives_the_process_group(proc)


def test_a_resumed_run_keeps_the_gradient_path_its_checkpoint_was_made_with(tmp_path):
    first = run_mpi(2, "--max-steps", "5", "--ckpt-dir", str(tmp_path))
    assert first.returncode == 0 and "(--comm auto)" in first.stdout, first.stdout
    chosen = re.search(r"gradients via (\w+)", first.stdout)[1]
    assert load(tmp_path / "last.pt")["gradients"] == chosen
    again = run_mpi(2, "--max-steps", "10", "--ckpt-dir", str(tmp_path), "--resume")
    assert f"gradients: via {chosen}, as the checkpoint's run chose (--comm auto)" in again.stdout, again.stdout
    assert "took" not in again.stdout.split("training:")[0]  # no measurement: the checkpoint's path

