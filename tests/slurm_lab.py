"""A real Slurm for the tests: Debian's slurm-wlm (22.05) and munge, two nodes on one machine.

Each node is a network namespace with its own address and host name (h1, h2), its slurmd
started inside it; slurmctld runs outside, on a bridge that joins them. mpirun inside a job
starts the other node's daemon through Slurm itself, as on a cluster. Every daemon started
here is stopped by its PID, and everything made is removed.

What worked, and why each step is there: ../shared/real-schedulers.md (read 2026-12).
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import textwrap
import time
from pathlib import Path

from ddp_abci.compare.netlab import attach_host, free_subnet
from helpers import kill_in_netns, sh, stop_by_pid

NODES = ("h1", "h2")
HOSTS_MARK = "# ddp_abci slurm lab"


class SlurmLab:
    def __init__(self, root: Path) -> None:
        self.root, self.tag = root, secrets.token_hex(2)
        self.bridge = f"dsb{self.tag}"
        self.ns = {node: f"dsl{self.tag}{node}" for node in NODES}
        self.conf = root / "slurm.conf"
        self.pids: list[int] = []
        self.made_ns: list[str] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.net = self.bridge_addr = ""  # set by up(): a /24 free when it starts
        self.addr: dict[str, str] = {}

    # -- up ---------------------------------------------------------------------------

    def up(self) -> None:
        subnet = free_subnet("10.78", int(self.tag, 16))
        self.net, self.bridge_addr = f"{subnet}.0/24", f"{subnet}.254"
        self.addr = {node: f"{subnet}.{i + 1}" for i, node in enumerate(NODES)}
        self._network()
        self._hosts_file(add=True)
        self._munge()
        self._write_conf()
        self.pids.append(self._daemon(["slurmctld", "-D", "-f", str(self.conf)], self.root / "slurmctld.out"))
        for node in NODES:
            # nsenter, not `ip netns exec`: that mounts a fresh /sys, and slurmd then cannot
            # initialise its cgroup plugin. unshare --uts: the node's own host name.
            self.pids.append(self._daemon(
                ["nsenter", f"--net=/var/run/netns/{self.ns[node]}", "unshare", "--uts", "sh", "-c",
                 f'hostname {node}; exec slurmd -D -f "$0" -N {node}', str(self.conf)],
                self.root / f"slurmd-{node}.out"))
        self._wait_idle(60)

    def _network(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for node, addr in self.addr.items():
            ns = self.ns[node]
            self.made_ns.append(ns)  # first: the stop removes one made half-way
            attach_host(ns, self.bridge, f"dsi{self.tag}{node}", f"dso{self.tag}{node}", addr)

    def _hosts_file(self, add: bool) -> None:
        # mpirun inside a job reaches the other node by the name Slurm gives it.
        hosts = Path("/etc/hosts")
        kept = [line for line in hosts.read_text().splitlines() if HOSTS_MARK not in line]
        if add:
            kept += [f"{addr} {node} {HOSTS_MARK}" for node, addr in self.addr.items()]
        hosts.write_text("\n".join(kept) + "\n")

    def _munge(self) -> None:
        if subprocess.run(["munge", "-n"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
            return  # a munged already runs: use it, and leave it
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if not Path("/etc/munge/munge.key").exists():
            sh("mungekey", "-c")
            shutil.chown("/etc/munge/munge.key", "munge", "munge")
        pid_file = Path("/run/munge/munged.pid")
        sh("runuser", "-u", "munge", "--", "munged", "--num-threads=4")
        for _ in range(50):
            if pid_file.exists():
                self.pids.append(int(pid_file.read_text().split()[0]))
                return
            time.sleep(0.1)
        raise RuntimeError("munged did not start")

    def _write_conf(self) -> None:
        nodes = "\n".join(f"NodeName={node} NodeAddr={addr} CPUs=2 RealMemory=4000 State=UNKNOWN"
                          for node, addr in self.addr.items())
        r = self.root
        self.conf.write_text(textwrap.dedent(f"""\
            ClusterName=ddplab
            SlurmctldHost={socket.gethostname()}({self.bridge_addr})
            SlurmctldPort={6817 + int(self.tag, 16) % 500}
            SlurmdPort={7318 + int(self.tag, 16) % 500}
            AuthType=auth/munge
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            SlurmUser=root
            SlurmctldPidFile={r}/slurmctld.pid
            SlurmdPidFile={r}/slurmd-%n.pid
            SlurmdSpoolDir={r}/spool-%n
            StateSaveLocation={r}/state
            SlurmctldLogFile={r}/slurmctld.log
            SlurmdLogFile={r}/slurmd-%n.log
            SelectType=select/cons_tres
            ReturnToService=2
            MpiDefault=none
            KillWait=5
            MinJobAge=600
            InactiveLimit=0
            {nodes}
            PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
            """))
        for folder in ("state", *(f"spool-{node}" for node in NODES)):
            (r / folder).mkdir(exist_ok=True)

    def _daemon(self, cmd: list[str], log: Path) -> int:
        proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)
        return proc.pid

    def _wait_idle(self, limit: float) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], stdout=subprocess.PIPE, text=True,
                                 env=self.env).stdout.split()
            if out.count("idle") == len(NODES):
                return
            time.sleep(0.5)
        logs = "".join(p.read_text()[-800:] for p in self.root.glob("*.log"))
        raise RuntimeError(f"Slurm's nodes did not become idle within {limit:.0f}s: {out}\n{logs}")

    # -- jobs -------------------------------------------------------------------------

    def run(self, *cmd: str, **extra_env: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(self.env, **extra_env))

    def sbatch(self, *args: str, **extra_env: str) -> int:
        out = self.run("sbatch", "--parsable", *args, **extra_env)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed: {out.stdout}")
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, ...)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def wait(self, job_id: int, limit: float) -> dict[str, str]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} did not end within {limit:.0f}s: {self.job(job_id)}")

    def wait_running(self, job_id: int, limit: float = 60) -> None:
        deadline = time.monotonic() + limit
        while self.job(job_id).get("JobState") != "RUNNING":
            assert time.monotonic() < deadline, self.job(job_id)
            time.sleep(0.3)

    # -- down -------------------------------------------------------------------------

    def down(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        for ns in self.made_ns:  # the jobs' processes first: they live in the nodes' namespaces
            kill_in_netns(ns, spare=self.pids)
        stop_by_pid(self.pids, grace_s=10)
        for ns in self.made_ns:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "del", self.bridge], stderr=subprocess.DEVNULL)
        self._hosts_file(add=False)

