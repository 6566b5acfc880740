"""Long runs lose nothing: checkpoints every N steps or minutes, mid-epoch, written in the
background, kept K deep, with the user's scheduler and state inside; a hard kill costs at most
the save interval and the resumed run ends bit for bit where the uninterrupted one does."""
import os
import random
import re
import signal
import subprocess
import time

import pytest
import torch

from helpers import (
    assert_clean,
    end_job,
    load,
    on_ranks,
    rank_pids,
    run,
    run_mpi,
    same_tensors,
    start_mpi,
    train_here,
    wait_for_line,
)

EPOCH = ["--epochs", "1", "--num-items", "75000", "--bs", "50", "--timeout", "10"]  # one epoch of 1500 steps
SAVE = ["--save-every-steps", "250"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, mpirun):
    folder = tmp_path_factory.mktemp("whole")
    assert_clean(run_mpi(2, *EPOCH, "--ckpt-dir", str(folder), *SAVE))
    return load(folder / "last.pt")


def test_a_killed_rank_costs_at_most_the_save_interval_and_the_resume_ends_bit_for_bit(uninterrupted, tmp_path):
    proc = start_mpi(2, *EPOCH, "--ckpt-dir", str(tmp_path), *SAVE)
    try:
        # said when its write is confirmed, at step 500: the kill comes with 1000 steps to go
        seen = wait_for_line(proc, "checkpoint: step 250 ")
        time.sleep(random.uniform(0.0, 1.0))
        killed = time.monotonic()
        os.kill(random.choice(rank_pids(proc.pid)), signal.SIGKILL)  # an OOM kill, a lost node
        out, _ = proc.communicate(timeout=10 + 30)
        took = time.monotonic() - killed
    finally:
        end_job(proc)
    assert proc.returncode != 0 and took < 10 + 30, (took, "".join(seen) + out)
    resumed = run_mpi(2, *EPOCH, "--ckpt-dir", str(tmp_path), *SAVE, "--resume")
    assert_clean(resumed)
    step = int(re.search(r"resume: \S+ at epoch 0, batch (\d+), step \1", resumed.stdout)[1])
    confirmed = max(int(s) for s in re.findall(r"checkpoint: step (\d+) ", "".join(seen) + out))
    assert step % 250 == 0 and step >= confirmed >= 250, (step, confirmed)  # not step 0
    final = load(tmp_path / "last.pt")
    assert final["step"] == uninterrupted["step"] == 1500 and same_tensors(final["model"], uninterrupted["model"])


def test_a_save_every_few_steps_keeps_k_checkpoints_and_resumes_from_the_newest_that_loads(tmp_path):
    assert_clean(train_here("--epochs", "1", "--num-items", "4000", "--bs", "50", "--ckpt-dir", str(tmp_path),
                            "--save-every-steps", "10", "--keep", "3"))
    kept = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert kept == ["last.pt", "prev.pt", "prev2.pt"], kept
    assert [load(tmp_path / n)["step"] for n in ("last.pt", "prev.pt", "prev2.pt")] == [80, 70, 60]
    (tmp_path / "last.pt").write_bytes(b"torn")
    (tmp_path / "prev.pt").write_bytes(b"torn too")
    again = train_here("--epochs", "2", "--num-items", "4000", "--bs", "50", "--ckpt-dir", str(tmp_path), "--resume")
    assert_clean(again)
    assert f"falling back to {tmp_path / 'prev2.pt'}" in again.stdout and "step 60" in again.stdout


def test_saves_every_few_seconds_happen_mid_epoch_and_auto_says_its_interval(tmp_path):
    slow = ["--epochs", "1", "--num-items", "400000", "--bs", "50", "--dim-hidden", "300"]  # 8000 steps an epoch
    timed = train_here(*slow, "--max-steps", "1000", "--ckpt-dir", str(tmp_path / "a"), "--save-every-minutes", "0.003")
    assert_clean(timed)
    steps = [int(s) for s in re.findall(r"checkpoint: step (\d+) ", timed.stdout)]
    assert len(steps) >= 3 and all(0 < s < 8000 for s in steps), timed.stdout  # every 0.18 s, mid-epoch
    # --mtbf-hours 0.001 with a save's stall of milliseconds: Young's interval is its floor, 1 s
    auto = train_here(*slow, "--max-steps", "2000", "--ckpt-dir", str(tmp_path / "b"), "--save-every-minutes", "auto",
                      "--mtbf-hours", "0.001")
    assert_clean(auto)
    line = next(x for x in auto.stdout.splitlines() if x.startswith("save interval: auto chose"))
    assert "auto chose 0.0167 min = sqrt(2 x" in line and "x 0.001 h MTBF) (Young 1974)" in line, line
    assert len(re.findall(r"checkpoint: step", auto.stdout)) >= 2, auto.stdout


def test_the_summary_counts_the_saves_and_their_stall(tmp_path):
    summary = tmp_path / "summary.json"
    assert_clean(train_here("--epochs", "2", "--num-items", "400", "--ckpt-dir", str(tmp_path / "ck"),
                            "--save-every-steps", "3", "--summary-json", str(summary)))
    import json

    figures = json.loads(summary.read_text())
    assert figures["checkpoints_saved"] == 7 and 0 < figures["checkpoint_stall_s"] < 10, figures  # 3,6,8,9,12,15,16


def test_a_failed_background_write_ends_the_run_at_the_next_save_point_with_74(tmp_path, mpirun):
    d = tmp_path / "fs"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    filler = None
    try:
        proc = start_mpi(2, "--epochs", "1000", "--num-items", "4000", "--ckpt-dir", str(d), "--save-every-steps",
                         "20")
        wait_for_line(proc, "checkpoint: step 40 ")
        # Another writer keeps taking every free block, as a group quota filling up does (each
        # save's rotation frees the checkpoint before prev.pt: filling once is not enough).
        filler = subprocess.Popen(["sh", "-c", f"while :; do cat /dev/zero >> {d}/filler; sleep 0.001; done"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out, _ = proc.communicate(timeout=60)
    finally:
        end_job(proc)
        if filler is not None:
            filler.kill()
            filler.wait()
        (d / "filler").unlink(missing_ok=True)
        kept = load(d / "last.pt")["step"]
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
    lines = [x for x in out.splitlines() if x.startswith("error:")]
    assert "Exit code:    74" in out and len(lines) == 1, out
    assert "No space left on device" in lines[0] and kept >= 40
    failed = int(re.search(r"\(step (\d+)\)", lines[0])[1])  # the write that failed, said at the save point after
    assert failed > kept, lines[0]


STATE_SCRIPT = """\
import sys
import torch
from ddp_abci import TrainConfig, fit


class EMA:
    def __init__(self, model):
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items()}
    def update(self, model):
        for k, v in model.state_dict().items():
            self.shadow[k].mul_(0.9).add_(v.detach(), alpha=0.1)
    def state_dict(self):
        return {"shadow": self.shadow}
    def load_state_dict(self, state):
        self.shadow = state["shadow"]


class Calls:  # differs by rank: each rank's count starts at its rank
    def __init__(self, rank):
        self.n = rank
    def state_dict(self):
        return {"n": self.n}
    def load_state_dict(self, state):
        self.n = state["n"]


torch.manual_seed(0)
rank = int(__import__("os").environ["OMPI_COMM_WORLD_RANK"])
model, ema, calls = torch.nn.Linear(8, 8), None, Calls(rank)
ema = EMA(model)


def loss_fn(m, x):
    ema.update(m.module if hasattr(m, "module") else m)  # the weights after the step before
    calls.n += 1
    return ((m(x) - x) ** 2).mean()


out, max_steps = sys.argv[1], int(sys.argv[2])
onecycle = lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=60)
status = fit(model, torch.arange(800.0).reshape(100, 8) / 800, loss_fn,
             TrainConfig(epochs=10, global_batch=8, max_steps=max_steps, ckpt_dir=out, resume=True, lr=0.01),
             scheduler=onecycle, state={"ema": ema, "calls": calls})
torch.save({"ema": ema.shadow, "calls": calls.n}, f"{out}/state-{rank}.pt")
sys.exit(status)
"""


def test_the_users_scheduler_and_state_resume_to_an_uninterrupted_runs_end(tmp_path, mpirun):
    script = tmp_path / "state_script.py"
    script.write_text(STATE_SCRIPT)
    for folder, steps in (("stopped", (23, 60)), ("whole", (60,))):
        for max_steps in steps:  # 23: mid-epoch (12 steps an epoch)
            proc = run(on_ranks(2, str(script), str(tmp_path / folder), str(max_steps)))
            assert_clean(proc)
    a, b = load(tmp_path / "stopped" / "last.pt"), load(tmp_path / "whole" / "last.pt")
    assert same_tensors(a["model"], b["model"]) and a["scheduler"] == b["scheduler"]
    assert "state/ema" in a and "state/ema_per_rank" not in a  # the same on every rank: rank 0's
    assert [s["n"] for s in a["state/calls_per_rank"]] == [b["state/calls_per_rank"][r]["n"] for r in range(2)]
    for rank in range(2):
        mine, theirs = (torch.load(tmp_path / f / f"state-{rank}.pt") for f in ("stopped", "whole"))
        assert mine["calls"] == theirs["calls"] and same_tensors(mine["ema"], theirs["ema"])


def test_a_scheduler_of_ones_own_and_the_built_in_schedule_together_are_refused(tmp_path):
    from ddp_abci import TrainConfig, fit

    status = fit(torch.nn.Linear(2, 2), torch.ones(8, 2), lambda m, x: m(x).sum(),
                 TrainConfig(global_batch=2, warmup_steps=5),
                 scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1))
    assert status == 2


