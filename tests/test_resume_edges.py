"""Resume and stop at the edges: the resume contract, no endless loop, exit 75 only when
work is left, stale temporary files, and signals from the first moments of a rank."""
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from helpers import (
    REPO,
    assert_clean,
    end_job,
    env,
    load,
    one_error,
    run_mpi,
    same_tensors,
    start_mpi,
    train_here,
    wait_for_line,
)

SMALL = ["--num-items", "400", "--bs", "50", "--seed", "3"]  # 8 steps an epoch


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A finished one-epoch run's checkpoint folder; each test works on its own copy."""
    folder = tmp_path_factory.mktemp("one-epoch")
    assert_clean(train_here(*SMALL, "--epochs", "1", "--ckpt-dir", str(folder)))
    return folder


@pytest.fixture
def ckpt_dir(one_epoch, tmp_path):
    shutil.copytree(one_epoch, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_a_resume_with_fewer_items_fails_in_seconds_naming_num_items(ckpt_dir):
    started = time.monotonic()
    proc = train_here(*SMALL, "--epochs", "2", "--ckpt-dir", str(ckpt_dir), "--resume", "--num-items", "200")
    assert "--num-items 400" in one_error(proc) and time.monotonic() - started < 20


def test_a_resume_that_adds_eval_every_is_refused_as_another_epoch(ckpt_dir):
    assert "--eval-every" in one_error(train_here(*SMALL, "--epochs", "2", "--ckpt-dir", str(ckpt_dir), "--resume",
                                                  "--eval-every", "1"))


@pytest.mark.parametrize("flag, value", [("--seed", "7"), ("--bs", "100"), ("--split", "contiguous"),
                                         ("--drop-last", None)])
def test_a_resume_that_would_not_be_exact_is_refused_naming_the_saved_value(ckpt_dir, flag, value):
    before = (ckpt_dir / "last.pt").read_bytes()
    line = one_error(train_here(*SMALL, "--epochs", "2", "--ckpt-dir", str(ckpt_dir), "--resume", flag,
                                *([value] if value else [])))
    assert flag in line and "resume with" in line
    assert (ckpt_dir / "last.pt").read_bytes() == before


def test_a_loop_whose_resume_position_lies_past_the_epoch_is_an_error_not_a_spin(ckpt_dir):
    import torch

    state = load(ckpt_dir / "last.pt")
    state["epoch"], state["batch_in_epoch"] = 0, 99  # as if written by a run with a longer epoch, train_items alike
    torch.save(state, ckpt_dir / "last.pt")
    line = one_error(train_here(*SMALL, "--epochs", "2", "--ckpt-dir", str(ckpt_dir), "--resume"))
    assert "lies past the epoch" in line


def test_a_stop_agreed_on_the_last_step_saves_and_exits_0_saying_the_run_is_complete(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ddp_abci.train", *SMALL, "--epochs", "1", "--ckpt-dir",
                             str(tmp_path)], cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    time.sleep(0.3)  # inside torch's import: recorded, acted on at the first check, step 8, the last
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "SIGUSR1 arrived at the last step: the run is complete" in out
    assert load(tmp_path / "last.pt")["step"] == 8


def test_a_stop_signal_during_start_up_is_recorded_and_acted_on_at_the_first_check(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ddp_abci.train", *SMALL, "--epochs", "50", "--ckpt-dir",
                             str(tmp_path)], cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    assert load(tmp_path / "last.pt")["step"] == 8 and "stopped on SIGTERM" in out


def test_stop_check_every_beyond_its_cap_is_refused():
    proc = train_here("--stop-check-every", "100000")
    assert "--stop-check-every" in one_error(proc) and "1000" in proc.stdout


def test_summary_json_into_a_missing_folder_is_refused_before_training(tmp_path):
    line = one_error(train_here(*SMALL, "--epochs", "1", "--summary-json", str(tmp_path / "no" / "x.json")))
    assert "--summary-json" in line and "does not exist" in line


def test_stale_temporary_checkpoints_are_removed_by_the_next_run_and_nothing_else(tmp_path):
    stale = [tmp_path / ".last.pt.k3j2_x.tmp", tmp_path / ".prev.pt.abc.tmp"]
    for p in stale:
        p.write_bytes(b"x" * 1000)
    mine = tmp_path / ".notes.tmp"
    mine.write_text("keep")
    proc = train_here(*SMALL, "--epochs", "1", "--ckpt-dir", str(tmp_path))
    assert_clean(proc)
    assert "removed 2 temporary checkpoint file(s)" in proc.stdout
    assert not any(p.exists() for p in stale) and mine.exists()


@pytest.mark.parametrize("args, needle", [(["--bs", "20000"], "larger than the training set"),
                                          (["--num-items", "1"], "every rank needs at least one")])
def test_a_batch_or_dataset_that_cannot_be_shared_out_is_refused(args, needle, mpirun):
    assert needle in one_error(run_mpi(2, "--epochs", "1", *args))


def test_sigterm_to_a_bare_mpirun_leaves_a_whole_checkpoint(tmp_path, mpirun):
    # Open MPI 5 forwards SIGTERM to the ranks and SIGKILLs them about 0.25 s later
    # (measured; README "Stopping"): a save may be cut short, the file on disk is whole.
    proc = start_mpi(2, "--epochs", "1000", "--num-items", "400", "--ckpt-dir", str(tmp_path))
    try:
        wait_for_line(proc, "epoch 3/1000")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        end_job(proc)
    assert proc.returncode != 0
    assert load(tmp_path / "last.pt")["epoch"] >= 3
    assert_clean(run_mpi(2, "--epochs", "1", "--num-items", "400", "--ckpt-dir", str(tmp_path), "--resume"))
    assert not list(tmp_path.glob(".*.tmp"))


def test_stop_after_ends_a_long_run_with_75_inside_its_limit_and_resumes_exactly(tmp_path, mpirun):
    long_run = ["--epochs", "100000", "--num-items", "400"]  # hours of work: only the deadline ends it
    started = time.monotonic()
    proc = run_mpi(2, *long_run, "--ckpt-dir", str(tmp_path / "a"), "--stop-after", "6", timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 75 and "stopped on the --stop-after deadline" in proc.stdout, proc.stdout
    assert took < 20 and "deadline: --stop-after" in proc.stdout
    target = load(tmp_path / "a" / "last.pt")["step"] + 12
    assert_clean(run_mpi(2, *long_run, "--ckpt-dir", str(tmp_path / "a"), "--resume", "--max-steps", str(target)))
    assert_clean(run_mpi(2, *long_run, "--ckpt-dir", str(tmp_path / "b"), "--max-steps", str(target)))
    resumed, whole = load(tmp_path / "a" / "last.pt"), load(tmp_path / "b" / "last.pt")
    assert resumed["step"] == whole["step"] == target
    assert same_tensors(resumed["model"], whole["model"])


def evaluated_steps(out: str) -> list[int]:
    return [int(step) for step in re.findall(r"^eval after epoch \d+ \(step (\d+)\)", out, re.M)]


def test_evaluation_by_steps_is_neither_repeated_nor_skipped_across_a_resume(tmp_path):
    every = ["--eval-every-steps", "5", "--epochs", "10"]
    first = train_here(*SMALL, *every, "--ckpt-dir", str(tmp_path), "--max-steps", "12")
    rest = train_here(*SMALL, *every, "--ckpt-dir", str(tmp_path), "--resume", "--max-steps", "24")
    assert_clean(first)
    assert_clean(rest)
    # every fifth step once, mid-epoch too (8 steps an epoch), and each run's end
    assert (evaluated_steps(first.stdout), evaluated_steps(rest.stdout)) == ([5, 10, 12], [15, 20, 24])
