"""Hosts on one machine, for the benchmark's slow-link runs and the tests: each host a network
namespace with its own address and host name, all joined by a bridge, mpirun's ssh replaced by
an agent that starts a command in a host's namespace. A host's link can be shaped with tc
(a rate and a delay), and a folder made read-only on one host. Needs root; everything made
is removed by down(), the processes in the namespaces first.

    with NetLab(["hosta", "hostb"], workdir) as lab:
        lab.shape("hostb", "1gbit", "0.5ms")
        lab.run_on("hosta", lab.mpirun(2, [python, "-m", "ddp_abci.train"]))
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Sequence

from .lab_base import Lab

SUBNET_PREFIX = "10.79"


def sh(*cmd: str) -> str:
    """A set-up command: its failure is the lab's (a RuntimeError with its output)."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stdout.strip()}")
    return done.stdout


class NetLab(Lab):
    def __init__(self, hosts: Sequence[str], workdir: Path, *, read_only: dict[str, str] | None = None,
                 outsiders: Sequence[str] = ()) -> None:
        """`read_only`: host -> a folder that host sees read-only (a mount namespace of its own).
        `outsiders`: hosts on the same network that run no rank (another user's node)."""
        if os.geteuid() != 0:
            raise PermissionError("the network lab needs root (network namespaces, tc)")
        self.hosts, self.workdir, self.read_only = list(hosts), Path(workdir), dict(read_only or {})
        machines = self.hosts + list(outsiders)
        self.tag = secrets.token_hex(2)
        self.subnet = free_subnet(SUBNET_PREFIX, int(self.tag, 16))
        self.net = f"{self.subnet}.0/24"
        self.addr = {host: f"{self.subnet}.{i + 1}" for i, host in enumerate(machines)}
        self.ns = {host: f"dnl{self.tag}{i}" for i, host in enumerate(machines)}
        self.veth = {host: f"dnv{self.tag}{i}" for i, host in enumerate(machines)}  # the bridge's side
        self.iface = {host: f"dni{self.tag}{i}" for i, host in enumerate(machines)}  # the host's own
        self.bridge = f"dnb{self.tag}"
        self.agent = self.workdir / f"agent-{self.tag}"
        self.made: list[str] = []

    def up(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        self.made.append(f"link:{self.bridge}")
        sh("ip", "link", "set", self.bridge, "up")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {h}\n::ffff:{a} {h}\n" for h, a in self.addr.items())
        for host in self.ns:
            ns = self.ns[host]
            self.made.append(f"ns:{ns}")  # first: down() also removes one made half-way
            attach_host(ns, self.bridge, self.iface[host], self.veth[host], self.addr[host])
            Path(f"/etc/netns/{ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{ns}/hosts").write_text(hosts_file)  # names resolve inside (ip netns exec binds it)
            # A cut or slow link: TCP gives up on an unanswered send after 3 tries, not 15
            # (about 15 minutes), as a site tuned for it does (docs/reliability.md).
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_retries2=3")
        self._write_agent()

    def _write_agent(self) -> None:
        cases = "".join(f"    {h}) ns={self.ns[h]} ro={self.read_only.get(h, '')} ;;\n" for h in self.ns)
        self.agent.write_text(textwrap.dedent("""\
            #!/bin/sh
            # ssh stand-in: AGENT [options] HOST COMMAND runs COMMAND in HOST's namespace, as HOST.
            while [ "${1#-}" != "$1" ]; do shift; done
            host=$1; shift
            case $host in
            """) + cases + textwrap.dedent("""\
                *) echo "no host $host" >&2; exit 255 ;;
            esac
            if [ -n "$ro" ]; then  # the folder is read-only on this host: a mount namespace of its own
                exec ip netns exec "$ns" unshare --uts --mount sh -c \\
                    'mount --bind "$2" "$2" && mount -o remount,ro,bind "$2" && hostname "$0" && exec sh -c "$1"' \\
                    "$host" "$*" "$ro"
            fi
            exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec sh -c "$1"' "$host" "$*"
            """))
        self.agent.chmod(0o755)

    def shape(self, host: str, rate: str, delay: str | None = None) -> None:
        """tc on the host's link, both ways: a token bucket at `rate` (e.g. 100mbit), and `delay`."""
        for where, dev in ((["ip", "netns", "exec", self.ns[host]], self.iface[host]), ([], self.veth[host])):
            qdisc = ["netem", "delay", delay, "rate", rate] if delay else ["tbf", "rate", rate, "burst", "256kbit",
                                                                            "latency", "400ms"]
            try:
                sh(*where, "tc", "qdisc", "add", "dev", dev, "root", *qdisc)
            except RuntimeError as e:
                if delay and "unknown" in str(e):
                    raise SystemExit(f"error: a delay needs the kernel's netem qdisc (sch_netem), which this machine "
                                     f"lacks; shape the rate alone (--link {rate})") from None
                raise

    def mpi_args(self) -> list[str]:
        """Open MPI's options for these hosts: the agent for ssh, TCP on the lab's network."""
        return ["--prtemca", "plm_ssh_agent", str(self.agent), "--mca", "btl", "self,sm,tcp", "--mca",
                "btl_tcp_if_include", self.net, "--prtemca", "oob_tcp_if_include", self.net]

    def hostfile(self, slots: int = 1) -> Path:
        path = self.workdir / f"hosts-{self.tag}"
        path.write_text("".join(f"{h} slots={slots}\n" for h in self.hosts))
        return path

    def mpirun(self, mpirun: str, per_host: int, program: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
        """mpirun starting `program` on every host, `per_host` ranks each."""
        return [mpirun, "-n", str(per_host * len(self.hosts)), "--hostfile", str(self.hostfile(per_host)),
                "--map-by", f"ppr:{per_host}:node", "--bind-to", "none", *self.mpi_args(), *extra, *program]

    def as_host(self, host: str, cmd: Sequence[str]) -> list[str]:
        """cmd run as `host`: in its namespace, with its host name."""
        return [str(self.agent), host, " ".join(_quote(c) for c in cmd)]

    def run_on(self, host: str, cmd: Sequence[str], timeout: float, env: dict | None = None,
               ) -> subprocess.CompletedProcess:
        return subprocess.run(self.as_host(host, cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=env)

    def down(self) -> None:
        for item in reversed(self.made):
            kind, name = item.split(":", 1)
            if kind == "ns":
                pids = subprocess.run(["ip", "netns", "pids", name], stdout=subprocess.PIPE, text=True).stdout
                for pid in pids.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
                subprocess.run(["ip", "netns", "del", name], stderr=subprocess.DEVNULL)
                shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
            else:
                subprocess.run(["ip", "link", "del", name], stderr=subprocess.DEVNULL)
        self.made.clear()
        self.agent.unlink(missing_ok=True)


def free_subnet(prefix: str, first: int) -> str:
    """`prefix.k` (k in 1..199, tried from `first` on) whose /24 no address or route of this
    network namespace lies in. A lab killed before its down() leaves its bridge and addresses
    behind; a second bridge on the same /24 would route the new lab's packets to the old one.
    Raises RuntimeError when all 199 are taken."""
    taken = sh("ip", "-4", "-o", "addr", "show") + sh("ip", "-4", "route", "show", "table", "all")
    used = {word.split(".")[2] for word in taken.replace("/", " ").split() if word.startswith(prefix + ".")
            and word.count(".") == 3}
    for i in range(199):
        k = 1 + (first + i) % 199
        if str(k) not in used:
            return f"{prefix}.{k}"
    raise RuntimeError(f"every {prefix}.k.0/24 is in use here: remove the leftover labs' bridges (ip link)")


def attach_host(ns: str, bridge: str, inside: str, outside: str, addr: str) -> None:
    """A host: network namespace `ns`, its loopback up, and a veth pair from `bridge` (the
    `outside` end) to `inside` in the namespace, at `addr`/24 (tests/slurm_lab.py's nodes too)."""
    sh("ip", "netns", "add", ns)
    sh("ip", "-n", ns, "link", "set", "lo", "up")
    sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", ns)
    sh("ip", "link", "set", outside, "master", bridge)
    sh("ip", "link", "set", outside, "up")
    sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", inside)
    sh("ip", "-n", ns, "link", "set", inside, "up")


def _quote(text: str) -> str:
    import shlex  # noqa: PLC0415  (the one use)

    return shlex.quote(text)
