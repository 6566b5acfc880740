"""Watching a run: TensorBoard events, the picture of a run, and progress lines with time left."""
import json
import shutil

import pytest

from helpers import PYTHON, assert_clean, run, run_mpi, train_here

pytestmark = pytest.mark.untimed

RUN = ["--epochs", "3", "--num-items", "800", "--bs", "50"]  # 16 steps an epoch, 48 in all


def _loss_steps(tb_dir) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [event.step for event in acc.Scalars("loss")]


def test_tensorboard_gets_one_loss_per_step_and_a_resume_continues_it(tmp_path, mpirun):
    args = [*RUN, "--tensorboard", str(tmp_path / "tb"), "--ckpt-dir", str(tmp_path / "ck")]
    assert_clean(run_mpi(2, *args, "--max-steps", "20"))
    assert_clean(run_mpi(2, *args, "--resume"))
    assert _loss_steps(tmp_path / "tb") == list(range(1, 49))


def test_steps_logged_after_the_last_checkpoint_are_not_doubled_by_the_resume(tmp_path):
    # One rank is enough: what rank 0 logged and what the resume drops (the test above has 2)
    args = [*RUN, "--tensorboard", str(tmp_path / "tb"), "--ckpt-dir", str(tmp_path / "ck")]
    assert_clean(train_here(*args))
    # As if killed after logging all 48 steps but checkpointing only epoch 2 (step 32):
    shutil.copyfile(tmp_path / "ck" / "prev.pt", tmp_path / "ck" / "last.pt")
    assert_clean(train_here(*args, "--resume"))
    assert _loss_steps(tmp_path / "tb") == list(range(1, 49))


def test_tensorboard_without_its_package_is_one_line_naming_the_install(monkeypatch):
    import importlib.util

    from ddp_abci.errors import UsageError
    from ddp_abci.tracking import check_tensorboard_installed

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match=r"pip install 'ddp_abci\[tensorboard\]'"):
        check_tensorboard_installed()


def test_the_plot_draws_a_run_with_its_resume_marked(tmp_path):
    log = tmp_path / "run.jsonl"
    args = [*RUN, "--metrics-jsonl", str(log), "--ckpt-dir", str(tmp_path / "ck")]
    assert_clean(train_here(*args, "--max-steps", "20"))
    assert_clean(train_here(*args, "--resume"))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows if r["samples_per_s"] is None] == [1, 21]  # each run's first step
    proc = run([PYTHON, "-m", "ddp_abci.plot", str(log), "--out", str(tmp_path / "run.png")])
    assert proc.returncode == 0, proc.stdout
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_of_a_file_that_is_not_a_run_log_is_one_line():
    proc = run([PYTHON, "-m", "ddp_abci.plot", "setup.cfg"])
    assert proc.returncode == 2 and proc.stdout.startswith("error: ") and len(proc.stdout.splitlines()) == 1


def test_progress_lines_carry_the_loss_of_recent_steps_and_the_time_left():
    proc = train_here("--epochs", "2", "--log-every", "0.01")
    assert_clean(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("  epoch ")]
    assert lines and all("(mean of recent steps)" in line and " left" in line for line in lines), proc.stdout
    assert "\r" not in proc.stdout
