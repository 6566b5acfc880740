"""Checkpoint storage that fails: too small, filled during the run, made read-only. Real
tmpfs mounts (root is available in CI); skipped where mounting is refused."""
import subprocess
import time

import pytest

from helpers import end_job, load, run_mpi, start_mpi, train_here, wait_for_line

LONG = ["--epochs", "1000", "--num-items", "400", "--bs", "50"]


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> the folder, a tmpfs of that size; unmounted afterwards."""
    mounted = []

    def mount(size: str):
        d = tmp_path / f"fs{len(mounted)}"
        d.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _one_error(out: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out
    assert "Traceback" not in out, out
    return lines[0]


def test_a_ckpt_dir_without_room_for_two_checkpoints_is_refused_before_the_first_step(tmpfs, mpirun):
    d = tmpfs("600k")
    proc = run_mpi(2, "--ckpt-dir", str(d))
    assert proc.returncode != 0 and "Exit code:    2" in proc.stdout, proc.stdout
    line = _one_error(proc.stdout)
    assert "free" in line and "MB" in line and "--ckpt-dir" in line
    assert "epoch 1/" not in proc.stdout
    assert list(d.iterdir()) == []


def _fail_mid_run(d, damage) -> subprocess.CompletedProcess:
    proc = start_mpi(2, *LONG, "--ckpt-dir", str(d))
    try:
        wait_for_line(proc, "epoch 2/1000")
        damage(d)
        out, _ = proc.communicate(timeout=60)
    finally:
        end_job(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out)


def test_a_disk_that_fills_during_the_run_ends_it_in_one_line_and_the_last_good_checkpoint_loads(tmpfs, mpirun):
    # Another writer keeps taking every free block, as a group quota filling up does: filling
    # once is not enough, because each save's rotation frees the checkpoint before prev.pt.
    d = tmpfs("8m")
    filler = []

    def fill(d):
        filler.append(subprocess.Popen(["sh", "-c", f"while :; do cat /dev/zero >> {d}/filler; sleep 0.001; done"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    try:
        proc = _fail_mid_run(d, fill)
    finally:
        for p in filler:
            p.kill()
            p.wait()
    (d / "filler").unlink()
    assert "Exit code:    74" in proc.stdout, proc.stdout
    line = _one_error(proc.stdout)
    assert "No space left on device" in line and str(d / "last.pt") in line
    assert load(d / "last.pt")["epoch"] >= 1  # "epoch 2/" is printed before its checkpoint
    assert not list(d.glob(".*.tmp"))


def test_a_folder_made_read_only_during_the_run_ends_it_in_one_line(tmpfs, mpirun):
    d = tmpfs("8m")

    def read_only(d):
        for _ in range(200):  # EBUSY while a save holds its temporary file open: try again
            if subprocess.run(["mount", "-o", "remount,ro", str(d)], capture_output=True).returncode == 0:
                return
            time.sleep(0.005)
        raise AssertionError("could not remount read-only")

    proc = _fail_mid_run(d, read_only)
    subprocess.run(["mount", "-o", "remount,rw", str(d)], check=True)
    assert "Exit code:    74" in proc.stdout, proc.stdout
    assert "Read-only file system" in _one_error(proc.stdout)
    assert load(d / "last.pt")["epoch"] >= 1  # "epoch 2/" is printed before its checkpoint


def test_metrics_and_summary_write_failures_warn_once_and_training_goes_on(tmp_path):
    started = time.monotonic()
    proc = train_here("--epochs", "2", "--num-items", "400", "--metrics-jsonl", "/dev/full", "--summary-json",
                      "/dev/full", "--ckpt-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count("warning: --metrics-jsonl /dev/full") == 1
    assert proc.stdout.count("warning: --summary-json /dev/full") == 1
    assert "done: 16 steps" in proc.stdout and "Traceback" not in proc.stdout
    assert load(tmp_path / "last.pt")["step"] == 16
    assert time.monotonic() - started < 60


def test_the_benchmarks_slow_disk_throttles_its_groups_writes_and_leaves_nothing_behind(tmp_path):
    from ddp_abci.compare.slowdisk import BLKIO, SlowDisk

    if not (BLKIO / "cgroup.procs").exists():
        pytest.skip("no cgroup v1 blkio controller here")
    with SlowDisk(tmp_path, megabytes_per_s=20, size_mb=200) as disk:
        write = ["dd", "if=/dev/zero", f"of={disk.mount}/x", "bs=1M", "count=40", "conv=fsync"]
        began = time.monotonic()
        subprocess.run(disk.throttled(write), check=True, capture_output=True)
        throttled = time.monotonic() - began
        group, device = disk.group, disk.device
    assert throttled >= 1.5  # 40 MB at 20 MB/s: 2 s, were it not throttled a fraction of that
    assert not group.exists() and not disk.mount.is_mount() and not (tmp_path / "slowdisk.img").exists()
    assert device not in subprocess.run(["losetup", "-a"], stdout=subprocess.PIPE, text=True).stdout
