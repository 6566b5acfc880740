"""Slow ranks named while training: a rank given less CPU than its peer (a cgroup's CPU quota,
as a throttled host or a noisy neighbour does) is named within two report intervals, on the MPI
and the gloo gradient paths; a healthy run names nobody. Real ranks under mpirun."""
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, end_job, env, mpirun_cmd, rank_pids, wait_for_line

# Alone: a rank that blocks in gloo (or yields in MPI) leaves its core to the idle-priority lane,
# and beside that lane a healthy run's ranks differed by a third for seconds, on both paths.
pytestmark = [pytest.mark.usefixtures("mpirun"), pytest.mark.alone]
CPU = Path("/sys/fs/cgroup/cpu")
REPORT_S = 2  # --log-every: the report interval


@pytest.fixture
def throttle():
    """Put a process in a cpu cgroup of its own: 1 ms of CPU in every 3.3 ms (the kernel's shortest
    quota is 1 ms; a short period slows every step, not one step in many). Removed after."""
    if os.geteuid() != 0 or not (CPU / "cgroup.procs").exists():
        pytest.skip("needs root and cgroup v1's cpu controller")
    group = CPU / f"ddp_abci_slow_{secrets.token_hex(4)}"
    group.mkdir()

    def slow(pid):
        (group / "cgroup.procs").write_text(str(pid))
    try:
        (group / "cpu.cfs_period_us").write_text("3333")
        (group / "cpu.cfs_quota_us").write_text("1000")
        yield slow
    finally:
        # A killed rank leaves the group only once it has exited, at the quota's pace: retried.
        deadline = time.monotonic() + 10
        while True:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (CPU / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # it ended meanwhile
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def start(comm, *args):
    # --dim-hidden 1000: steps of a few ms of compute, longer than the quota's 1 ms, so that the
    # quota slows the compute itself, not only the waits between steps (the seed's 1 ms step fits
    # inside one quota, and the throttle then lands in the all-reduce, which is no one's compute).
    cmd = mpirun_cmd(2, "--epochs", "100000", "--num-items", "400", "--dim-hidden", "1000", "--comm", comm,
                     "--log-every", str(REPORT_S), *args)
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("comm", ["mpi", "gloo"])
def test_a_throttled_rank_is_named_within_two_report_intervals(throttle, comm):
    proc = start(comm)
    try:
        wait_for_line(proc, "epoch 20/")
        throttle(sorted(rank_pids(proc.pid))[1])
        throttled = time.monotonic()
        lines = wait_for_line(proc, "straggler: rank 1", timeout=3 * REPORT_S + 10)
        took = time.monotonic() - throttled
    finally:
        end_job(proc)
    named = lines[-1]
    assert "(host " in named and "score 0." in named and "its step compute" in named, named
    assert took < 2 * REPORT_S + 4, (took, "".join(lines))  # two intervals, and the agreement's few steps


@pytest.mark.parametrize("comm", ["mpi", "gloo"])
def test_a_healthy_run_names_nobody(tmp_path, comm):
    summary = tmp_path / "summary.json"
    # Steps of a few ms, as the throttled run's: the step compute compared is then long against
    # the scheduler's and the caches' noise.
    proc = subprocess.run(mpirun_cmd(2, "--epochs", "60", "--num-items", "400", "--dim-hidden", "1000", "--comm", comm,
                                     "--log-every", "1", "--summary-json", str(summary)),
                          cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    assert "straggler:" not in proc.stdout, proc.stdout
    import json

    ranks = json.loads(summary.read_text())["stragglers"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["median_step_compute_ms"] > 0 for r in ranks), ranks
