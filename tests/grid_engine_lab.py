"""A real Grid Engine for the tests: Debian's Son of Grid Engine 8.1.9 (gridengine-master,
-exec, -client), one host with 2 slots. The qmaster and the execd started here are stopped by
their PIDs; the cell's configuration (a parallel environment `mpi`, a queue, the `rt_AF`
resource ABCI 2.0's job script asks for) stays in the package's spool, made idempotently.

What worked, and why each step is there: ../shared/real-schedulers.md (read 2026-12).
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from helpers import stop_by_pid

SGE_ROOT = Path("/var/lib/gridengine")
COMMON = SGE_ROOT / "default" / "common"
RESOURCES = Path("/usr/share/gridengine/util/resources")


class GridEngineLab:
    def __init__(self, root: Path) -> None:
        self.root, self.host = root, socket.gethostname()
        self.env = dict(os.environ, SGE_ROOT=str(SGE_ROOT), SGE_CELL="default")
        self.pids: list[int] = []

    def qconf(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["qconf", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=self.env)
        if check and proc.returncode:
            raise RuntimeError(f"qconf {' '.join(args)}: {proc.stdout}")
        return proc.stdout

    def up(self) -> None:
        # The package leaves act_qmaster empty or "localhost", which /etc/hosts also maps to this
        # host's name: clients are then refused ("client IP resolved to host name localhost").
        (COMMON / "act_qmaster").write_text(self.host + "\n")
        (COMMON / "host_aliases").write_text(f"{self.host} localhost\n")
        self.pids.append(self._start("/usr/sbin/sge_qmaster", Path("/var/spool/gridengine/qmaster")))
        self._until(lambda: self.qconf("-sh", check=False).split() == [self.host], 30, "qmaster answering")
        self._configure()
        Path("/var/spool/gridengine/execd").mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", "sgeadmin:sgeadmin", "/var/spool/gridengine"], check=True)
        self.pids.append(self._start("/usr/sbin/sge_execd", Path("/var/spool/gridengine/execd")))
        self._until(self._host_reports, 60, "the execd reporting its load")

    def _configure(self) -> None:
        # Root may run jobs (min_uid/min_gid 0; the execd reads them when it starts); loads
        # reported every 5 s; the accounting file qacct reads written at once (by default it is
        # flushed every 15 s: a job's record came up to 9 s after its end); the scheduler runs
        # every second.
        settings = {"min_uid": "0", "min_gid": "0", "load_report_time": "00:00:05",
                    "reporting_params": "accounting=true reporting=false flush_time=00:00:15 joblog=false "
                                        "sharelog=00:00:00 accounting_flush_time=00:00:00"}
        current = (line.split(None, 1) for line in self.qconf("-sconf", "global").splitlines()
                   if line.strip() and not line.startswith("#"))
        conf = self.root / "global"
        conf.write_text("".join(f"{k} {settings.get(k, v)}\n" for k, v in current))
        self.qconf("-Mconf", str(conf))
        self.qconf("-as", self.host)
        sched = self.root / "sconf"
        sched.write_text("".join(line if not line.startswith("schedule_interval") else
                                 "schedule_interval 0:0:1\n" for line in self.qconf("-ssconf").splitlines(True)))
        self.qconf("-Msconf", str(sched))
        pe = self.root / "mpi"
        pe.write_text("".join({"slots": "slots 2\n", "job_is_first_task": "job_is_first_task FALSE\n"}.get(
            line.split()[0] if line.strip() and not line.startswith("#") else "", line)
            for line in (RESOURCES / "pe" / "mpi").read_text().splitlines(True)))
        self.qconf("-Mp" if "mpi" in self.qconf("-spl", check=False).split() else "-Ap", str(pe))
        complexes = self.qconf("-sc")
        if "rt_AF " not in complexes:  # ABCI 2.0's node resource, which train_abci2.sh asks for
            (self.root / "complex").write_text(complexes + "rt_AF rt_AF INT <= YES YES 0 0\n")
            self.qconf("-Mc", str(self.root / "complex"))
        queue = self.root / "all.q"
        queue.write_text(QUEUE.format(host=self.host))
        self.qconf("-Mq" if "all.q" in self.qconf("-sql", check=False).split() else "-Aq", str(queue))
        self.qconf("-mattr", "exechost", "complex_values", "rt_AF=1", self.host, check=False)

    def _start(self, binary: str, spool: Path) -> int:
        """Start a daemon and return its PID, from the PID file it writes in its spool (it
        forks twice, so the process started is not the daemon)."""
        for stale in spool.rglob("*.pid"):
            stale.unlink()
        subprocess.run([binary], check=True, env=self.env)
        for _ in range(100):
            for pid_file in spool.rglob("*.pid"):
                text = pid_file.read_text().strip()
                if text.isdigit():
                    return int(text)
            time.sleep(0.1)
        raise RuntimeError(f"{binary} wrote no PID file in {spool}")

    def _host_reports(self) -> bool:
        out = subprocess.run(["qhost", "-h", self.host], stdout=subprocess.PIPE, text=True, env=self.env).stdout
        return any(line.startswith(self.host) and line.split()[6] != "-" for line in out.splitlines())

    @staticmethod
    def _until(check, limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Grid Engine: no {what} within {limit:.0f}s")
            time.sleep(0.3)

    # -- jobs -------------------------------------------------------------------------

    def run(self, *cmd: str, **extra_env: str) -> subprocess.CompletedProcess:
        """From the repo root: the job scripts' #$ -cwd runs the jobs where qsub ran."""
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(self.env, **extra_env), cwd=Path(__file__).resolve().parents[1])

    def finished(self, job_id: int) -> dict[str, str] | None:
        """qacct's record of an ended job (exit_status, failed, ...), or None while it runs."""
        out = self.run("qacct", "-j", str(job_id))
        if out.returncode:
            return None
        return dict(line.split(None, 1) for line in out.stdout.splitlines() if len(line.split(None, 1)) == 2)

    def wait(self, job_id: int, limit: float) -> dict[str, str]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            record = self.finished(job_id)
            if record:
                return {k: v.strip() for k, v in record.items()}
            time.sleep(0.5)
        raise AssertionError(f"Grid Engine job {job_id} did not end within {limit:.0f}s: "
                             f"{self.run('qstat', '-j', str(job_id)).stdout[-1500:]}")

    def down(self) -> None:
        self.run("qdel", "-u", "root")
        # The execd ends within 3 s of SIGTERM; the qmaster took 8 s (11 s after qconf -km), and
        # starts again cleanly after a SIGKILL (checked: a job ran on the next start).
        stop_by_pid(self.pids, grace_s=3)


QUEUE = """qname all.q
hostlist {host}
seq_no 0
load_thresholds NONE
suspend_thresholds NONE
nsuspend 1
suspend_interval 00:05:00
priority 0
min_cpu_interval 00:05:00
processors UNDEFINED
qtype BATCH INTERACTIVE
ckpt_list NONE
pe_list mpi
rerun FALSE
slots 2
tmpdir /tmp
shell /bin/bash
prolog NONE
epilog NONE
shell_start_mode posix_compliant
starter_method NONE
suspend_method NONE
resume_method NONE
terminate_method NONE
notify 00:00:60
owner_list NONE
user_lists NONE
xuser_lists NONE
subordinate_list NONE
complex_values NONE
projects NONE
xprojects NONE
calendar NONE
initial_state default
s_rt INFINITY
h_rt INFINITY
s_cpu INFINITY
h_cpu INFINITY
s_fsize INFINITY
h_fsize INFINITY
s_data INFINITY
h_data INFINITY
s_stack INFINITY
h_stack INFINITY
s_core INFINITY
h_core INFINITY
s_rss INFINITY
h_rss INFINITY
s_vmem INFINITY
h_vmem INFINITY
"""
