"""Shared helpers for the tests: real mpirun processes with the venv's Python."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
MPIRUN = shutil.which("mpirun", path=str(Path(PYTHON).parent)) or shutil.which("mpirun")
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")


# Open MPI spins while a rank waits for the others, and yields the core instead when it sees its
# node oversubscribed (ompi_info: mpi_yield_when_idle). The suite's two lanes, and the labs' nodes,
# share this machine's 2 cores among more ranks than any one mpirun sees: two 2-rank --comm mpi
# trainings side by side took 6.6 s and 12 to 13 core-seconds yielding, 8.1 to 9.8 s and 15 to 19
# spinning (docs/testing.md, which also says why the yield stays a sched_yield).
YIELDING_MPI = {"OMPI_MCA_mpi_yield_when_idle": "1"}


def env(**extra: str) -> dict[str, str]:
    """The test process's environment, minus launcher variables that would leak into the job,
    plus what Open MPI needs to start as root (tests and scripts set it, never the library)."""
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    e.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1",
             OMPI_MCA_btl="self,sm,tcp", **YIELDING_MPI)  # btl: MPI_Init 0.1 s, not 1.1 s (scripts/run_local.sh)
    e.update(extra)
    return e


def on_ranks(n: int, *program: str, mpirun_args: tuple[str, ...] = ()) -> list[str]:
    """mpirun starting the venv's Python on n ranks of this machine: on_ranks(2, "script.py", ...)."""
    return [MPIRUN, "-n", str(n), "--oversubscribe", *mpirun_args, PYTHON, *program]


def mpirun_cmd(n: int, *args: str, module: str = "ddp_abci.train") -> list[str]:
    return on_ranks(n, "-m", module, *args)


def run(cmd: list[str], timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    """Run to completion; stdout and stderr merged into .stdout. The limit is a hang's backstop,
    not a measurement: the untimed tests' jobs (scripts/test.sh) can wait a minute for a core."""
    kw.setdefault("env", env())
    try:
        return subprocess.run(cmd, cwd=kw.pop("cwd", REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:  # what it printed before it hung: where it hung
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        raise AssertionError(f"{' '.join(map(str, cmd))} did not end within {timeout:g} s; its last lines:\n"
                             f"{out[-4000:]}") from None


def run_mpi(n: int, *args: str, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    return run(mpirun_cmd(n, *args), timeout=timeout, **kw)


def train(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """One process, no mpirun."""
    return run([PYTHON, "-m", "ddp_abci.train", *args], timeout=timeout, **kw)


def train_here(*args: str) -> subprocess.CompletedProcess:
    """`python -m ddp_abci.train ARGS` on one rank, run in this process: the same code and
    output (stdout and stderr merged) without a new interpreter loading torch. For what
    one rank shows; signals and several ranks need real processes."""
    from ddp_abci import train as command

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = command.main(list(args))
        except SystemExit as e:  # argparse's own exit for a bad flag
            status = e.code
    return subprocess.CompletedProcess(["python", "-m", "ddp_abci.train", *args], status, out.getvalue())


def error_lines(out: str) -> list[str]:
    # Open MPI 5 ends its MPI_ABORT banner with a NUL byte: a rank's line arriving after it starts with one.
    return [line for line in out.replace("\0", "").splitlines() if line.startswith("error:")]


def one_error(proc: subprocess.CompletedProcess, status: int = 2) -> str:
    """The run was refused before any training in exactly one `error:` line: that line."""
    lines = error_lines(proc.stdout)
    assert proc.returncode == status and len(lines) == 1, proc.stdout
    assert "Traceback" not in proc.stdout and "training:" not in proc.stdout, proc.stdout
    return lines[0]


def start_mpi(n: int, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(mpirun_cmd(n, *args), cwd=REPO, env=kw.pop("env", env()), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    """Read the job's output until a line containing `needle`; returns the lines read."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"no line with {needle!r} within {timeout}s:\n{''.join(lines)}")


def rank_pids(mpirun_pid: int) -> list[int]:
    """The ranks are the children of Open MPI 5's mpirun (prterun)."""
    out = subprocess.run(["pgrep", "-P", str(mpirun_pid)], stdout=subprocess.PIPE, text=True).stdout
    return [int(p) for p in out.split()]


def end_job(proc: subprocess.Popen) -> None:
    """Kill an mpirun job that may still run, ranks first, and reap it. Open MPI 5 starts each
    rank in a process group of its own, and a rank whose mpirun was SIGKILLed is not killed with
    it: a rank of a gloo run killed so lived on, orphaned and waiting, for over 100 s."""
    if proc.poll() is None:
        for pid in rank_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
    proc.wait()


def signal_ranks(mpirun_pid: int, sig: signal.Signals) -> None:
    for pid in rank_pids(mpirun_pid):
        os.kill(pid, sig)


def assert_clean(proc: subprocess.CompletedProcess, rc: int = 0) -> None:
    """Exit status as expected and none of the texts a broken teardown or a crash prints."""
    assert proc.returncode == rc, proc.stdout
    for bad in ("terminate called", "Traceback", "Segmentation", "core dumped"):
        assert bad not in proc.stdout, proc.stdout


def assert_no_thread_outlives_the_process_group(proc: subprocess.CompletedProcess, ranks: int = 2) -> None:
    """For a job run through tests/threads_at_exit.py: every rank reported, and no gloo or
    TCPStore thread was left once main() returned (the group was really freed)."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("threads at exit:")]
    assert len(lines) == ranks, proc.stdout
    for line in lines:
        assert "gloo" not in line and "tcpstore" not in line, line


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    """A set-up command of the labs (namespaces, links, keys): its failure fails the set-up."""
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def kill_in_netns(ns: str, spare: tuple[int, ...] | list[int] = ()) -> None:
    """SIGKILL every process in network namespace `ns` but those in `spare`, so that it can go."""
    for pid in subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, text=True).stdout.split():
        if int(pid) not in spare:
            _kill(int(pid), signal.SIGKILL)


def stop_by_pid(pids: list[int], grace_s: float) -> None:
    """Stop the daemons a lab started: SIGTERM, the newest first, then SIGKILL to any still
    there after `grace_s` seconds in all."""
    for pid in reversed(pids):
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _kill(pid, signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reaps it when it is our child (a zombie would look alive)
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


BENCH_SMALL = ("--num-items", "400", "--bs", "50", "--epochs", "1")  # one small epoch: 8 steps of 50


def bench(tmp_path: Path, *args: str, sides: str) -> tuple[subprocess.CompletedProcess, dict]:
    """One round of `python -m ddp_abci.bench` (no floor probes): its output and its JSON report."""
    out = tmp_path / "bench.json"
    proc = run([PYTHON, "-m", "ddp_abci.bench", "--rounds", "1", "--sides", sides, "--no-probes", *args,
                "--out", str(out)], timeout=400)
    return proc, json.loads(out.read_text())


def job_story(outs: list[str]) -> str:
    """A chain's job logs cut to the lines that tell where each job started, how long it had
    and where it stopped: what a chain test that fails shows."""
    keys = ("walltime left", "resume:", "deadline:", "stopped", "done:", "finished", "error")
    return "\n\n".join("\n".join(line for line in out.splitlines() if any(k in line for k in keys)) for out in outs)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def let_others_in(modes: dict[Path, int]) -> None:
    """o+x on each folder above the venv's interpreter and the checkout that other users cannot
    enter (a mkdtemp clone's is 0700), each folder's mode before kept in `modes` for
    give_back_modes: another Linux user can then run this checkout's Python."""
    for target in (Path(os.path.realpath(PYTHON)), REPO):
        for folder in target.parents:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH and folder not in modes:
                modes[folder] = mode
                folder.chmod(mode | stat.S_IXOTH)


def give_back_modes(modes: dict[Path, int]) -> None:
    for folder, mode in modes.items():
        folder.chmod(mode)


OUTSIDER = "ddpoutsider"  # another Linux user, with no part in any job (the outsider fixture makes it)


def outsider_cmd(*args: str) -> list[str]:
    """tests/outsider_script.py run as OUTSIDER, with nothing of this process's environment."""
    return ["runuser", "-u", OUTSIDER, "--", "env", "-i", f"PYTHONPATH={REPO}", "PATH=/usr/bin:/bin", PYTHON,
            str(REPO / "tests" / "outsider_script.py"), *args]
