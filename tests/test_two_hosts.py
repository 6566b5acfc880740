"""Two hosts on one machine: the multi-node path end to end.

Two network namespaces joined by a veth pair stand for two nodes, each with its own
address and host name. mpirun runs on the first; an ssh stand-in starts the second
host's daemon inside the other namespace. Everything made here is removed afterwards.
"""
import os
import re
import secrets
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from helpers import MPIRUN, PYTHON, REPO, env, kill_in_netns, load, sh, wait_for_line

NET, A, B, UNREACHABLE = "10.77.0.0/24", "10.77.0.1", "10.77.0.2", "10.77.1.1"


class TwoHosts:
    def __init__(self, tmp: Path) -> None:
        tag = secrets.token_hex(2)
        self.ns = {"hosta": f"dab{tag}a", "hostb": f"dab{tag}b"}
        self.iface_a, self.iface_b = f"dab{tag}a", f"dab{tag}b"
        self.agent = tmp / "ssh-agent"
        self.made: list[str] = []

    def up(self) -> None:
        for ns in self.ns.values():
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            # IPv4-mapped entries too: the rendezvous store listens on IPv6 and looks peers up by them.
            Path(f"/etc/netns/{ns}/hosts").write_text(
                f"127.0.0.1 localhost\n{A} hosta\n{B} hostb\n::ffff:{A} hosta\n::ffff:{B} hostb\n")
        a, b = self.ns["hosta"], self.ns["hostb"]
        sh("ip", "link", "add", self.iface_a, "netns", a, "type", "veth", "peer", "name", self.iface_b, "netns", b)
        sh("ip", "-n", a, "addr", "add", f"{A}/24", "dev", self.iface_a)
        sh("ip", "-n", b, "addr", "add", f"{B}/24", "dev", self.iface_b)
        # An address of host A's that host B has no route to.
        sh("ip", "-n", a, "addr", "add", f"{UNREACHABLE}/32", "dev", "lo")
        for ns, iface in ((a, self.iface_a), (b, self.iface_b)):
            sh("ip", "-n", ns, "link", "set", iface, "up")
            # A cut link: TCP retransmits an unanswered send 15 times by default, about 15
            # minutes, and Open MPI's mpirun waits that long for the cut-off host's daemon
            # (measured). These hosts give up after 3, in seconds, as a site tuned for it does.
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_retries2=3")
        self.agent.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            # ssh stand-in for Open MPI: AGENT [options] HOST COMMAND runs COMMAND on HOST's namespace.
            while [ "${{1#-}}" != "$1" ]; do shift; done
            host=$1; shift
            case $host in hosta) ns={a} ;; hostb) ns={b} ;; *) echo "no host $host" >&2; exit 255 ;; esac
            exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec sh -c "$1"' "$host" "$*"
            """))
        self.agent.chmod(0o755)

    def down(self) -> None:
        for ns in self.made:
            kill_in_netns(ns)
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)

    def mpi_args(self) -> list[str]:
        # OMP_NUM_THREADS=1: both "hosts" share this machine's 2 cores; a rank alone on its host
        # would take both (parallel/process_group.cpu_threads) and the two would crawl.
        return ["--prtemca", "plm_ssh_agent", str(self.agent), "--mca", "btl_tcp_if_include", NET,
                "--prtemca", "oob_tcp_if_include", NET, "-x", "PATH", "-x", "OMP_NUM_THREADS=1"]

    def _as_host_a(self, cmd: list[str]) -> list[str]:
        return self.as_host("hosta", cmd)

    def as_host(self, host: str, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "sh", "-c", f'hostname {host}; exec "$@"',
                "sh", *cmd]

    def on_host_a(self, cmd: list[str], timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
        """Run cmd as host A (its namespace and host name), output merged."""
        return subprocess.run(self._as_host_a(cmd), cwd=REPO, env=env(**extra_env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)

    def start_on_host_a(self, cmd: list[str], **extra_env: str) -> subprocess.Popen:
        return subprocess.Popen(self._as_host_a(cmd), cwd=REPO, env=env(**extra_env), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def mpirun_cmd(self, *train_args: str, mpi_extra=()) -> list[str]:
        hostfile = self.agent.with_name("hosts")
        hostfile.write_text("hosta slots=1\nhostb slots=1\n")
        return [MPIRUN, "-n", "2", "--hostfile", str(hostfile), "--map-by", "ppr:1:node", *self.mpi_args(),
                *mpi_extra, PYTHON, "-m", "ddp_abci.train", *train_args]

    def mpirun(self, *train_args: str, mpi_extra=(), **extra_env: str) -> subprocess.CompletedProcess:
        return self.on_host_a(self.mpirun_cmd(*train_args, mpi_extra=mpi_extra), **extra_env)

    def trainer_pid(self, host: str) -> int:
        pids = subprocess.run(["ip", "netns", "pids", self.ns[host]], stdout=subprocess.PIPE, text=True).stdout
        for pid in pids.split():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ddp_abci.train" in f.read():
                    return int(pid)
        raise AssertionError(f"no rank on {host}")

    def link(self, state: str) -> None:
        sh("ip", "-n", self.ns["hosta"], "link", "set", self.iface_a, state)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("two-host test needs root for network namespaces")
    for tool in ("ip", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"two-host test needs `{tool}` (iproute2 / util-linux)")
    h = TwoHosts(tmp_path_factory.mktemp("two-hosts"))
    try:
        h.up()
    except subprocess.CalledProcessError as e:
        h.down()
        pytest.skip(f"cannot make network namespaces here: {e.stdout.strip()}")
    yield h
    h.down()


SMALL = ["--epochs", "2", "--num-items", "400", "--timeout", "30"]


def test_two_hosts_meet_at_host_a_network_address_and_end_with_identical_weights(two_hosts, tmp_path):
    proc = two_hosts.mpirun(*SMALL, "--ckpt-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout
    assert "world size 2 (local 1)" in proc.stdout  # one rank per host: the job spans hosts
    assert re.search(rf"rendezvous {re.escape(A)}:\d+ \(from mpi4py\)", proc.stdout), proc.stdout
    assert "replicas agree: identical weights on all 2 ranks" in proc.stdout
    for bad in ("Traceback", "terminate called", "[W", "[E"):
        assert bad not in proc.stdout, proc.stdout
    assert load(tmp_path / "last.pt")["step"] == 16


def test_a_named_interface_gives_rank_0s_address(two_hosts):
    proc = two_hosts.mpirun(*SMALL, "--interface", two_hosts.iface_a)
    assert proc.returncode == 0, proc.stdout
    assert f"rendezvous {A}:" in proc.stdout


def test_without_mpi4py_a_named_interface_gives_every_rank_rank_0s_address(two_hosts):
    # torchrun's way: each host starts its rank with RANK, WORLD_SIZE, MASTER_ADDR and
    # MASTER_PORT, no mpirun. Each rank is told its own host's interface, as a cluster whose
    # nodes all call it bond0 does; only rank 0's is the rendezvous address, and rank 1 learns
    # it from rank 0 (taking its own, 10.77.0.2, was the bug).
    port = "29517"  # host A's network namespace is this module's own: nothing else listens there
    procs = [subprocess.Popen(two_hosts.as_host(host, [PYTHON, "-m", "ddp_abci.train", *SMALL, "--interface", iface]),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                                      MASTER_ADDR="hosta", MASTER_PORT=port))
             for rank, (host, iface) in enumerate((("hosta", two_hosts.iface_a), ("hostb", two_hosts.iface_b)))]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert f"rendezvous {A}:{port} (from torchrun)" in outputs[0], outputs[0]
    assert "replicas agree: identical weights on all 2 ranks" in outputs[0]


def test_a_master_address_host_b_cannot_reach_fails_within_the_timeout_naming_it(two_hosts):
    proc = two_hosts.mpirun("--epochs", "1", "--timeout", "5", mpi_extra=["-x", f"MASTER_ADDR={UNREACHABLE}"])
    assert proc.returncode != 0
    pattern = rf"rank 1 could not meet the others at {re.escape(UNREACHABLE)}:\d+ within 5s"
    assert re.search(pattern, proc.stdout), proc.stdout


def test_the_abci3_job_script_trains_across_both_hosts(two_hosts, tmp_path):
    nodefile = tmp_path / "PBS_NODEFILE"
    nodefile.write_text("hosta\nhostb\n")
    venv_bin = str(Path(PYTHON).parent)
    proc = two_hosts.on_host_a(
        ["bash", "scripts/abci/train_abci3.sh", *SMALL],
        PATH=f"{venv_bin}:{os.environ['PATH']}", PBS_NODEFILE=str(nodefile), PBS_JOBID="4321.pbs1",
        CONTAINER="none", NPROC_PER_NODE="1", PYTHON=PYTHON, MPIRUN=MPIRUN, MPI_ARGS=" ".join(two_hosts.mpi_args()))
    assert proc.returncode == 0, proc.stdout
    assert "job 4321: 2 node(s) x 1 rank(s) = 2" in proc.stdout
    assert f"rendezvous {A}:" in proc.stdout and "replicas agree" in proc.stdout


def _ended_within(proc, limit):
    started = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=limit)
    finally:
        proc.kill()
    return out, time.monotonic() - started


TIMEOUT = 4


def test_a_frozen_host_ends_the_job_within_the_timeout_naming_its_rank(two_hosts, tmp_path):
    proc = two_hosts.start_on_host_a(two_hosts.mpirun_cmd("--epochs", "1000", "--num-items", "400", "--timeout",
                                                          str(TIMEOUT), "--ckpt-dir", str(tmp_path)))
    wait_for_line(proc, "epoch 10/1000")
    os.kill(two_hosts.trainer_pid("hostb"), signal.SIGSTOP)  # host B stalls: a file system, a GPU, a kernel
    out, took = _ended_within(proc, TIMEOUT + 30)
    print(f"frozen host: ended {took:.1f} s after the stop")
    lines = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode == 69 and took < TIMEOUT + 30 and len(lines) == 1, out
    assert lines[0].startswith("error: rank 1 (host hostb) stopped answering at step ")
    assert load(tmp_path / "last.pt")["step"] > 0


def test_a_cut_link_ends_the_job_script_within_the_timeout_with_exit_69(two_hosts, tmp_path):
    nodefile = tmp_path / "PBS_NODEFILE"
    nodefile.write_text("hosta\nhostb\n")
    venv_bin = str(Path(PYTHON).parent)
    proc = two_hosts.start_on_host_a(
        ["bash", "scripts/abci/train_abci3.sh", "--epochs", "1000", "--num-items", "400", "--timeout", str(TIMEOUT)],
        PATH=f"{venv_bin}:{os.environ['PATH']}", PBS_NODEFILE=str(nodefile), PBS_JOBID="4322.pbs1",
        CONTAINER="none", NPROC_PER_NODE="1", PYTHON=PYTHON, MPIRUN=MPIRUN, CKPT_DIR=str(tmp_path / "ck"),
        OMP_NUM_THREADS="1",
        MPI_ARGS=" ".join(two_hosts.mpi_args()))
    try:
        wait_for_line(proc, "epoch 10/1000")
        two_hosts.link("down")  # a network partition between the two hosts
        out, took = _ended_within(proc, TIMEOUT + 30)
        print(f"cut link: ended {took:.1f} s after the cut")
    finally:
        two_hosts.link("up")
    assert proc.returncode == 69 and took < TIMEOUT + 30, f"exit {proc.returncode} after {took:.1f} s:\n{out}"
    status = dict(line.split("=", 1) for line in (tmp_path / "ck" / "status").read_text().splitlines())
    # The watchdog's verdict, or, when Open MPI's TCP transport gives up on the cut link first
    # (its errors are fatal to the rank: no Python runs to record anything), the job script's.
    assert status["status"] == "69" and ("stopped answering" in status["line"] or "was lost" in status["line"]), status
    assert "resubmit with the same CKPT_DIR" in out and load(tmp_path / "ck" / "last.pt")["step"] > 0
