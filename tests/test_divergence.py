"""Nothing lost to a diverged run: the guard stops every rank together, keeps the last good
checkpoint byte for byte, and a resume takes this run's hyper-parameters."""
import json
import math

import pytest
import torch

from ddp_abci.parallel.agreement import FP16_SKIPS, GRAD_NORM, LOSS, OK, Agreement
from ddp_abci.parallel.gradients import gradient_path
from ddp_abci.parallel.signals import StopRequest
from helpers import assert_clean, error_lines, load, run_mpi, train_here

pytestmark = pytest.mark.untimed

SMALL = ["--num-items", "400", "--bs", "50", "--seed", "3"]  # 8 steps an epoch


def test_a_diverging_resume_exits_65_in_one_line_and_leaves_last_pt_byte_for_byte(tmp_path, mpirun):
    assert_clean(run_mpi(2, *SMALL, "--epochs", "1", "--ckpt-dir", str(tmp_path)))
    good = (tmp_path / "last.pt").read_bytes()
    out = run_mpi(2, *SMALL, "--epochs", "5", "--lr", "1e10", "--ckpt-dir", str(tmp_path), "--resume").stdout
    errors = error_lines(out)
    assert len(errors) == 1 and errors[0].startswith("error: diverged:"), out
    assert "--lr" in errors[0] and "--clip-norm" in errors[0]
    assert "Exit code:    65" in out and "Traceback" not in out
    assert (tmp_path / "last.pt").read_bytes() == good


def test_a_diverging_fresh_run_exits_65_and_writes_no_checkpoint(tmp_path):
    proc = train_here(*SMALL, "--epochs", "3", "--lr", "inf", "--ckpt-dir", str(tmp_path))
    assert proc.returncode == 2 and error_lines(proc.stdout), proc.stdout  # inf is refused before work
    proc = train_here(*SMALL, "--epochs", "3", "--lr", "1e10", "--ckpt-dir", str(tmp_path))
    assert proc.returncode == 65, proc.stdout
    assert not (tmp_path / "last.pt").exists()


def test_a_non_finite_gradient_norm_is_divergence_when_clipping(tmp_path):
    proc = train_here(*SMALL, "--epochs", "3", "--lr", "1e30", "--clip-norm", "1e38", "--ckpt-dir", str(tmp_path))
    assert proc.returncode == 65, proc.stdout
    assert "error: diverged:" in proc.stdout


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0"])
def test_a_non_finite_or_non_positive_lr_is_one_line_with_exit_2(value):
    proc = train_here("--lr", value)
    assert proc.returncode == 2, proc.stdout
    assert len(error_lines(proc.stdout)) == 1 and "--lr" in proc.stdout and "Traceback" not in proc.stdout


def test_on_resume_this_runs_hyperparameters_win_and_the_optimizer_state_is_kept(tmp_path):
    assert_clean(train_here(*SMALL, "--epochs", "1", "--ckpt-dir", str(tmp_path)))
    log = tmp_path / "m.jsonl"
    resumed = train_here(*SMALL, "--epochs", "2", "--lr", "1e-5", "--betas", "0.5", "0.9", "--ckpt-dir", str(tmp_path),
                    "--resume", "--metrics-jsonl", str(log))
    assert_clean(resumed)
    assert "lr 0.0001 -> 1e-05" in resumed.stdout and "betas (0, 0.99) -> (0.5, 0.9)" in resumed.stdout
    assert {json.loads(line)["lr"] for line in log.read_text().splitlines()} == {1e-5}
    state = load(tmp_path / "last.pt")
    group = state["optimizer"]["param_groups"][0]
    assert group["lr"] == 1e-5 and tuple(group["betas"]) == (0.5, 0.9)
    assert all(float(s["step"]) == 16 for s in state["optimizer"]["state"].values())  # moments kept: 8 + 8 steps


def test_a_resumed_schedule_keeps_its_position_and_takes_the_new_base_rate(tmp_path):
    args = [*SMALL, "--schedule", "cosine", "--warmup-steps", "4", "--ckpt-dir", str(tmp_path)]
    assert_clean(train_here(*args, "--epochs", "1", "--max-steps", "16"))  # one epoch: 8 of the 16 steps planned
    log = tmp_path / "m.jsonl"
    assert_clean(train_here(*args, "--epochs", "2", "--max-steps", "16", "--lr", "1e-3", "--resume",
                            "--metrics-jsonl", str(log)))
    lrs = [json.loads(line)["lr"] for line in log.read_text().splitlines()]
    # The line of step 9 logs the rate after its schedule step: 16 steps, 4 of warm-up, cosine at
    # (9 - 4) / 12 of the new 1e-3.
    assert lrs[0] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 5 / 12)))


def _rates(tmp_path, name: str, *args: str) -> tuple[list[float], str]:
    log = tmp_path / f"{name}.jsonl"
    proc = train_here(*SMALL, "--schedule", "cosine", "--warmup-steps", "2", "--metrics-jsonl", str(log), *args)
    assert_clean(proc)
    return [json.loads(line)["lr"] for line in log.read_text().splitlines()], proc.stdout


def test_a_chain_extended_with_more_steps_keeps_the_curve_its_first_job_planned(tmp_path):
    planned, _ = _rates(tmp_path, "planned", "--max-steps", "16", "--epochs", "2")
    ck = ["--ckpt-dir", str(tmp_path / "ck")]
    first, _ = _rates(tmp_path, "first", *ck, "--max-steps", "16", "--epochs", "1")  # a job that stops at step 8
    rest, said = _rates(tmp_path, "rest", *ck, "--max-steps", "24", "--epochs", "3", "--resume")  # extended
    assert first + rest[:8] == planned  # every step of the 16 at the rate the first job planned
    assert rest[8:] == [0.0] * 8  # past it: cosine's last rate
    assert "the schedule keeps its length, 16 steps, as the run's first job planned it" in said, said
    assert "pass --schedule-steps 24" in said


def test_a_schedule_re_planned_with_schedule_steps_is_named_in_the_resume_line(tmp_path):
    ck = ["--ckpt-dir", str(tmp_path / "ck")]
    _rates(tmp_path, "first", *ck, "--max-steps", "16", "--epochs", "1")
    rest, said = _rates(tmp_path, "rest", *ck, "--max-steps", "24", "--epochs", "3", "--schedule-steps", "24",
                        "--resume")
    assert "the schedule re-planned to 24 steps (--schedule-steps), from 16" in said, said
    assert rest[0] == pytest.approx(1e-4 * 0.5 * (1 + math.cos(math.pi * 7 / 22)))  # step 9 of the new 24
    assert rest[-1] == 0.0


def test_an_unreadable_last_pt_falls_back_to_prev_pt_and_says_so(tmp_path):
    assert_clean(train_here(*SMALL, "--epochs", "2", "--ckpt-dir", str(tmp_path)))
    assert load(tmp_path / "prev.pt")["epoch"] == 1 and load(tmp_path / "last.pt")["epoch"] == 2
    (tmp_path / "last.pt").write_bytes(b"torn write")
    resumed = train_here(*SMALL, "--epochs", "3", "--ckpt-dir", str(tmp_path), "--resume")
    assert_clean(resumed)
    assert "falling back to" in resumed.stdout and "prev.pt at epoch 1" in resumed.stdout
    assert load(tmp_path / "last.pt")["epoch"] == 3
    assert load(tmp_path / "prev.pt")["epoch"] == 2  # the bad last.pt never became prev.pt


def _agreement(**kw) -> Agreement:
    options = dict(guard_finite=True, max_fp16_skips=0)
    options.update(kw)
    return Agreement(StopRequest(), 8, gradient_path("gloo"), torch.device("cpu"), 0, 1, **options)


def test_the_guard_reads_the_epochs_running_loss_sum_which_keeps_any_bad_step():
    agreement = _agreement()
    total = torch.tensor(0.0)
    for loss in (1.0, float("inf"), 2.0, -float("inf"), 3.0):
        total += loss
    assert agreement.agree(8, torch.tensor(5.0))[:2] == (0, OK)
    assert agreement.agree(16, total)[:2] == (0, LOSS)


def test_the_guard_flags_a_non_finite_gradient_norm_and_counts_fp16_skips_in_a_row():
    norm = _agreement()
    norm.watch(float("nan"), skipped=False)
    assert norm.agree(8, torch.tensor(1.0)).diverged == GRAD_NORM
    fp16 = _agreement(guard_finite=False, max_fp16_skips=3)
    for skipped in (True, True, False, True, True):
        fp16.watch(None, skipped)
    assert fp16.agree(8, torch.tensor(float("nan"))).diverged == OK  # fp16 losses may overflow by design
    fp16.watch(None, True)
    assert fp16.agree(16, torch.tensor(1.0)).diverged == FP16_SKIPS
