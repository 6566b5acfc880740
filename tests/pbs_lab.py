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
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from ddp_abci.compare.netlab import attach_host, free_subnet
from helpers import REPO, give_back_modes, kill_in_netns, let_others_in, sh, stop_by_pid

SHARED = Path(os.environ.get("DDP_ABCI_PBS", REPO.parent / "shared" / "pbs"))
PBS_BIN = Path("/opt/pbs/bin")
USER = "ddpjobs"
DAEMONS = ("/opt/pbs/sbin/", "postgres -D /var/spool/pbs/datastore")
# The second host: a network namespace on a bridge, with a MOM of its own (its own PBS_HOME and
# pbs.conf, and its own host name), which PBS's server knows as one more node.
SECOND = "pbsnode2"
HOSTS_MARK = "# ddp_abci pbs lab"


class PBSLab:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.work = root / "work"         # the job user's: checkpoints, logs, settings files
        self.pids: list[int] = []
        self.modes: dict[Path, int] = {}  # folders given o+x, and their modes before
        self.tag = secrets.token_hex(2)
        self.ns, self.bridge = f"dpb{self.tag}", f"dpbr{self.tag}"
        self.second_home = Path(f"/var/spool/pbs-{SECOND}")
        self.second_conf = Path(f"/etc/pbs.conf.{SECOND}")
        self.second_up = False
        self.net = self.bridge_addr = self.second_addr = ""  # set by add_second_host(): a /24 free then

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
        let_others_in(self.modes)
        self.root.chmod(0o755)  # a mkdtemp folder: only its owner could enter it
        self.work.mkdir(parents=True)
        shutil.chown(self.work, USER, USER)

    @staticmethod
    def _daemon_pids() -> list[int]:
        out = subprocess.run(["ps", "-eo", "pid=,args="], stdout=subprocess.PIPE, text=True).stdout
        return [int(line.split()[0]) for line in out.splitlines() if any(d in line for d in DAEMONS)]

    def qmgr(self, command: str) -> None:
        subprocess.run([str(PBS_BIN / "qmgr"), "-c", command], check=True, stdout=subprocess.DEVNULL)

    def add_second_host(self) -> None:
        """A second node: its namespace (reaching the server's host through the bridge), its
        MOM started inside it under the host name SECOND, and the node known to the server."""
        subnet = free_subnet("10.77", int(self.tag, 16))
        self.net, self.bridge_addr, self.second_addr = f"{subnet}.0/24", f"{subnet}.254", f"{subnet}.2"
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        attach_host(self.ns, self.bridge, f"dpi{self.tag}", f"dpo{self.tag}", self.second_addr)
        sh("ip", "-n", self.ns, "route", "add", "default", "via", self.bridge_addr)  # to the server's address
        server = subprocess.run(["hostname"], stdout=subprocess.PIPE, text=True).stdout.strip()
        server_addr = next(line.split()[0] for line in Path("/etc/hosts").read_text().splitlines()
                           if line.split()[1:2] == [server] and not line.startswith("127."))
        # `ip netns exec` binds this over /etc/hosts inside: the server's name to its address, not 127.0.0.1
        Path(f"/etc/netns/{self.ns}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{self.ns}/hosts").write_text(f"127.0.0.1 localhost\n{server_addr} {server}\n"
                                                      f"{self.second_addr} {SECOND}\n")
        # Names from that file alone: a DNS server it cannot reach made each lookup wait out the
        # resolver's timeout (5 s: a rank there missed rank 0's store within --timeout 6).
        Path(f"/etc/netns/{self.ns}/nsswitch.conf").write_text("hosts: files\n")
        self._hosts_file(add=True)
        self._second_mom_home(server)
        sh("ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
           f"hostname {SECOND}; PBS_CONF_FILE={self.second_conf} exec {PBS_BIN.parent}/sbin/pbs_mom")
        self.second_up = True
        lock, deadline = self.second_home / "mom_priv" / "mom.lock", time.monotonic() + 10
        while not (lock.exists() and lock.read_text().split()) and time.monotonic() < deadline:
            time.sleep(0.1)  # written by the MOM once it has left its starter
        self.pids.append(int(lock.read_text().split()[0]))
        subprocess.run([str(PBS_BIN / "qmgr"), "-c", f"delete node {SECOND}"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # a lab's before this one, stopped short, left it (unresolvable)
        self.qmgr(f"create node {SECOND}")
        self.qmgr(f"set node {SECOND} resources_available.ncpus = {os.cpu_count()}")
        deadline = time.monotonic() + 60
        while "state = free" not in subprocess.run([str(PBS_BIN / "pbsnodes"), SECOND], stdout=subprocess.PIPE,
                                                   text=True).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {SECOND} not free within 60 s")
            time.sleep(0.5)

    def _second_mom_home(self, server: str) -> None:
        """PBS_HOME for the second MOM, laid out as the first one's (modes included), empty."""
        home, first = self.second_home, Path("/var/spool/pbs")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(mode=0o755)
        for part in ("mom_priv", "mom_logs", "spool", "undelivered", "aux", "checkpoint", "pbs_environment"):
            subprocess.run(["cp", "-a", str(first / part), str(home)], check=True)
        for leftover in ("mom_priv/jobs", "mom_logs", "spool", "undelivered", "aux"):
            for path in (home / leftover).iterdir():
                path.unlink() if path.is_file() else shutil.rmtree(path)
        (home / "mom_priv" / "mom.lock").unlink(missing_ok=True)
        self.second_conf.write_text(f"PBS_EXEC={PBS_BIN.parent}\nPBS_HOME={home}\nPBS_SERVER={server}\n"
                                    "PBS_START_SERVER=0\nPBS_START_SCHED=0\nPBS_START_COMM=0\nPBS_START_MOM=1\n")

    def _hosts_file(self, add: bool) -> None:
        hosts = Path("/etc/hosts")  # the server and the first MOM reach the second by its name
        kept = [line for line in hosts.read_text().splitlines() if HOSTS_MARK not in line]
        hosts.write_text("\n".join(kept + ([f"{self.second_addr} {SECOND} {HOSTS_MARK}"] if add else [])) + "\n")

    def second_host_pids(self, program: str) -> list[int]:
        """The processes running `program` on the second host."""
        pids = subprocess.run(["ip", "netns", "pids", self.ns], stdout=subprocess.PIPE, text=True).stdout.split()
        return [int(p) for p in pids if program.encode() in Path(f"/proc/{p}/cmdline").read_bytes()]

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
        if self.second_up:
            subprocess.run([str(PBS_BIN / "qmgr"), "-c", f"delete node {SECOND}"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            kill_in_netns(self.ns, spare=self.pids)
        stop_by_pid(self.pids + self._daemon_pids(), grace_s=10)
        subprocess.run(["pkill", "-KILL", "-u", USER], stderr=subprocess.DEVNULL)  # what its jobs left
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", self.bridge], stderr=subprocess.DEVNULL)
        shutil.rmtree(f"/etc/netns/{self.ns}", ignore_errors=True)
        self._hosts_file(add=False)
        shutil.rmtree(self.second_home, ignore_errors=True)
        self.second_conf.unlink(missing_ok=True)
        give_back_modes(self.modes)

    @staticmethod
    def _job_ids() -> list[str]:
        out = subprocess.run([str(PBS_BIN / "qselect")], stdout=subprocess.PIPE, text=True).stdout
        return out.split() or ["none"]
