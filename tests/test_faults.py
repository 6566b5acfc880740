"""Nothing lost: exact resume, stop signals, a dead rank, and bad input refused before work."""
import os
import shutil
import signal
import socket
import time

import pytest

from helpers import (
    assert_clean,
    end_job,
    env,
    load,
    one_error,
    rank_pids,
    run_mpi,
    same_tensors,
    signal_ranks,
    start_mpi,
    train_here,
    wait_for_line,
)

SMALL = ["--num-items", "400", "--bs", "50", "--epochs", "2", "--seed", "3"]  # 8 steps an epoch
LONG = ["--epochs", "1000", "--num-items", "400", "--stop-check-every", "4"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, mpirun):
    d = tmp_path_factory.mktemp("whole")
    assert_clean(run_mpi(2, *SMALL, "--ckpt-dir", str(d)))
    return load(d / "last.pt")


def test_an_interrupted_and_resumed_run_ends_with_identical_weights(uninterrupted, tmp_path):
    first = run_mpi(2, *SMALL, "--ckpt-dir", str(tmp_path), "--max-steps", "11")  # stops in epoch 2
    assert_clean(first)
    mid = load(tmp_path / "last.pt")
    assert (mid["epoch"], mid["batch_in_epoch"], mid["step"]) == (1, 3, 11)
    second = run_mpi(2, *SMALL, "--ckpt-dir", str(tmp_path), "--resume")
    assert_clean(second)
    assert "resume: " in second.stdout and "at epoch 1, batch 3, step 11" in second.stdout
    end = load(tmp_path / "last.pt")
    assert end["step"] == 16
    assert same_tensors(end["model"], uninterrupted["model"])
    for a, b in zip(end["optimizer"]["state"].values(), uninterrupted["optimizer"]["state"].values(), strict=True):
        assert same_tensors(a, b)


def test_resuming_on_another_world_size_keeps_the_global_batch_and_says_so(tmp_path, mpirun):
    assert_clean(run_mpi(2, *SMALL, "--ckpt-dir", str(tmp_path), "--max-steps", "4"))
    proc = train_here(*SMALL, "--ckpt-dir", str(tmp_path), "--resume")
    assert_clean(proc)
    assert "world size changed 2 -> 1, global batch 50 kept, so each rank now takes 50" in proc.stdout
    assert load(tmp_path / "last.pt")["step"] == 16


def test_resume_with_no_checkpoint_starts_fresh_and_says_so(tmp_path):
    proc = train_here(*SMALL, "--ckpt-dir", str(tmp_path), "--resume", "--max-steps", "2")
    assert_clean(proc)
    assert f"resume: no checkpoint at {tmp_path}/last.pt; starting fresh" in proc.stdout


def _stop_test(tmp_path, send, args=LONG, after="epoch 2/1000"):  # the tests using it ask for mpirun
    proc = start_mpi(2, *args, "--ckpt-dir", str(tmp_path))
    try:
        wait_for_line(proc, after)
        sent = time.monotonic()
        send(proc)
        out, _ = proc.communicate(timeout=30)
        return proc.returncode, out, time.monotonic() - sent
    finally:
        end_job(proc)


def test_sigterm_to_every_rank_stops_at_one_step_saves_and_exits_75(tmp_path, mpirun):
    rc, out, took = _stop_test(tmp_path, lambda p: signal_ranks(p.pid, signal.SIGTERM))
    assert rc == 75, out
    assert took < 10
    state = load(tmp_path / "last.pt")
    where = f"epoch {state['epoch'] + 1} batch {state['batch_in_epoch']} (step {state['step']})"
    assert f"stopped on SIGTERM at {where}" in out
    assert state["step"] % 4 == 0  # both ranks agreed at a check step
    assert "Traceback" not in out and "terminate called" not in out
    resumed = run_mpi(2, *LONG[:1], str(state["epoch"] + 1), *LONG[2:], "--ckpt-dir", str(tmp_path), "--resume")
    assert_clean(resumed)


def test_sigusr1_to_mpirun_alone_is_forwarded_and_stops_cleanly(tmp_path, mpirun):
    rc, out, took = _stop_test(tmp_path, lambda p: p.send_signal(signal.SIGUSR1))
    assert rc == 75, out
    assert took < 10
    assert "stopped on SIGUSR1" in out


def test_sigterm_to_mpirun_alone_still_saves_the_stop_step(tmp_path, mpirun):
    # Open MPI 5 forwards SIGTERM to the ranks, then ends the job and its output
    # forwarding: the ranks' last lines are lost, but the checkpoint must be written.
    # Full 200-step epochs and a check every 7 steps: a stop in epoch 2 is mid-epoch, so
    # a checkpoint there can only come from the stop, not from an epoch's end.
    args = ["--epochs", "1000", "--stop-check-every", "7"]
    rc, out, took = _stop_test(tmp_path, lambda p: p.send_signal(signal.SIGTERM), args, after="epoch 1/1000")
    assert rc != 0 and took < 10
    state = load(tmp_path / "last.pt")
    assert state["batch_in_epoch"] > 0 and state["step"] % 7 == 0, out


def test_a_killed_rank_ends_the_job_non_zero_within_a_minute_and_the_checkpoint_loads(tmp_path, mpirun):
    proc = start_mpi(2, *LONG, "--ckpt-dir", str(tmp_path))
    try:
        wait_for_line(proc, "epoch 2/1000")
        victim = max(rank_pids(proc.pid))
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        proc.communicate(timeout=60)
        assert time.monotonic() - killed < 60
    finally:
        end_job(proc)
    assert proc.returncode != 0
    assert load(tmp_path / "last.pt")["epoch"] >= 1


@pytest.fixture(scope="module")
def a_checkpoint(tmp_path_factory):
    """One finished run's checkpoint folder; each test below works on its own copy."""
    folder = tmp_path_factory.mktemp("finished")
    assert_clean(train_here(*SMALL, "--ckpt-dir", str(folder), "--max-steps", "2"))
    return folder


@pytest.fixture
def finished_checkpoint(a_checkpoint, tmp_path):
    shutil.copytree(a_checkpoint, tmp_path / "ckpt")
    return tmp_path / "ckpt" / "last.pt"


def test_an_existing_checkpoint_is_not_overwritten_without_resume(finished_checkpoint):
    before = finished_checkpoint.read_bytes()
    proc = train_here(*SMALL, "--ckpt-dir", str(finished_checkpoint.parent))
    assert "pass --resume (resume=True) to continue it" in one_error(proc)
    assert finished_checkpoint.read_bytes() == before


def test_a_truncated_checkpoint_is_refused_and_left_as_it_is(finished_checkpoint):
    finished_checkpoint.write_bytes(finished_checkpoint.read_bytes()[:5000])
    before = finished_checkpoint.read_bytes()
    proc = train_here(*SMALL, "--ckpt-dir", str(finished_checkpoint.parent), "--resume")
    assert "truncated or not a ddp_abci checkpoint" in one_error(proc)
    assert finished_checkpoint.read_bytes() == before


def test_a_checkpoint_of_another_model_shape_is_refused(finished_checkpoint):
    proc = train_here(*SMALL, "--ckpt-dir", str(finished_checkpoint.parent), "--resume", "--dim-hidden", "64")
    assert "holds another model shape" in one_error(proc)


def test_a_checkpoint_folder_that_cannot_be_written_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    proc = train_here("--ckpt-dir", str(tmp_path / "a-file" / "ckpt"))
    assert "cannot be written" in one_error(proc)


def test_a_rendezvous_port_already_taken_is_named(mpirun):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_mpi(2, env=env(MASTER_PORT=str(port)))
    assert f"rendezvous port {port} on 127.0.0.1 is already in use" in one_error(proc)


def test_a_master_address_that_is_not_rank_0s_is_refused_before_waiting(mpirun):
    proc = run_mpi(2, env=env(MASTER_ADDR="192.0.2.254"))  # TEST-NET: only bound locally, never sent to
    assert "192.0.2.254 is not an address of rank 0's host" in one_error(proc)


def test_a_master_that_cannot_be_reached_fails_within_the_timeout_naming_it(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for var, value in dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(var, value)  # rank 1 of a torchrun-style launch whose rank 0 never came
    started = time.monotonic()
    proc = train_here("--timeout", "2")
    assert time.monotonic() - started < 20
    assert f"could not meet the others at 127.0.0.1:{port} within 2s" in one_error(proc)
