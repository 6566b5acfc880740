"""A real PBS for the tests: OpenPBS 23.06 (PBS Professional's open-source edition, ABCI 3.0's
scheduler) from ../shared/pbs, server, scheduler, comm and MOM on this host, and its jobs run by
an ordinary user, as on ABCI.

The queue is ABCI 3.0's rt_HF: a chunk of it is a whole node (default_chunk.ncpus = the node's
CPUs, as select=N on ABCI gives whole nodes), placed one a node. The MOM checks limits every
1-2 s (start-pbs.sh's PBS_FAST_POLL): the walltime's SIGTERM comes within 2 s of the limit, not
10 to 120 s. The job user reaches the venv's Python through the folders above it (the ones it
could not enter get o+x while the lab runs, and their modes back after). Every daemon started
here is stopped by its PID. What was observed under this PBS: ../shared/pbs/README.md.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path

from helpers import PYTHON, REPO, stop_by_pid

SHARED = Path(os.environ.get("DDP_ABCI_PBS", REPO.parent / "shared" / "pbs"))
PBS_BIN = Path("/opt/pbs/bin")
USER = "ddpjobs"
DAEMONS = ("/opt/pbs/sbin/", "postgres -D /var/spool/pbs/datastore")


class PBSLab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"         # the job user's: checkpoints, logs, settings files
        self.pids: list[int] = []
        self.modes: dict[Path, int] = {}  # folders given o+x, and their modes before

    # -- up ---------------------------------------------------------------------------

    def up(self) -> None:
        env = dict(os.environ, PBS_CREATE_USER=USER, PBS_FAST_POLL="1", PBS_QUEUES="rt_HF")
        out = subprocess.run(["bash", str(SHARED / "start-pbs.sh")], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"start-pbs.sh failed:\n{out.stdout[-2000:]}")
        self.pids = self._daemon_pids()
        ncpus = os.cpu_count()
        for setting in (f"set queue rt_HF default_chunk.ncpus = {ncpus}", "set queue rt_HF resources_default.place = "
                        "scatter:excl"):
            self.qmgr(setting)
        self._let_the_user_in()
        self.root.chmod(0o755)  # a mkdtemp folder: only its owner could enter it
        self.work.mkdir(parents=True)
        shutil.chown(self.work, USER, USER)

    @staticmethod
    def _daemon_pids() -> list[int]:
        out = subprocess.run(["ps", "-eo", "pid=,args="], stdout=subprocess.PIPE, text=True).stdout
        return [int(line.split()[0]) for line in out.splitlines() if any(d in line for d in DAEMONS)]

    def qmgr(self, command: str) -> None:
        subprocess.run([str(PBS_BIN / "qmgr"), "-c", command], check=True, stdout=subprocess.DEVNULL)

    def _let_the_user_in(self) -> None:
        """o+x on each folder above the venv's interpreter and the checkout that others cannot enter."""
        for target in (Path(os.path.realpath(PYTHON)), REPO):
            for folder in target.parents:
                mode = folder.stat().st_mode
                if not mode & stat.S_IXOTH and folder not in self.modes:
                    self.modes[folder] = mode
                    folder.chmod(mode | stat.S_IXOTH)

    # -- jobs -------------------------------------------------------------------------

    def as_user(self, *cmd: str, cwd: Path = REPO, **settings: str) -> subprocess.CompletedProcess:
        """A command run by the job user with PBS's commands first on PATH, and `settings`."""
        user = pwd.getpwnam(USER)
        env = {"PATH": f"{PBS_BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": user.pw_dir, "USER": USER,
               "LOGNAME": USER, "LANG": "C.UTF-8", **settings}
        return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *cmd],
                              cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)

    def user_folder(self, name: str) -> Path:
        folder = self.work / name
        folder.mkdir()
        shutil.chown(folder, USER, USER)
        return folder

    def job(self, job_id: str) -> dict:
        """qstat -fx's record of the job (finished ones too), as PBS gives it in JSON."""
        out = subprocess.run([str(PBS_BIN / "qstat"), "-fx", "-F", "json", job_id], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        jobs = json.loads(out.stdout).get("Jobs", {}) if out.returncode == 0 and out.stdout.strip() else {}
        return next(iter(jobs.values()), {})

    def wait(self, job_id: str, limit: float, state: str = "F") -> dict:
        """Until the job reaches `state` (F: finished, its Exit_status set; R: running)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("job_state") == state:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} did not reach {state} within {limit:.0f}s: {self.job(job_id)}")

    # -- down -------------------------------------------------------------------------

    def down(self) -> None:
        subprocess.run([str(PBS_BIN / "qdel"), "-Wforce", *self._job_ids()], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        subprocess.run(["bash", str(SHARED / "stop-pbs.sh")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120)
        stop_by_pid(self.pids + self._daemon_pids(), grace_s=10)
        subprocess.run(["pkill", "-KILL", "-u", USER], stderr=subprocess.DEVNULL)  # what its jobs left
        for folder, mode in self.modes.items():
            folder.chmod(mode)

    @staticmethod
    def _job_ids() -> list[str]:
        out = subprocess.run([str(PBS_BIN / "qselect")], stdout=subprocess.PIPE, text=True).stdout
        return out.split() or ["none"]
