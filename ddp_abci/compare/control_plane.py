"""The control plane at scale, simulated: rank 0's rendezvous store, every rank's heartbeat and
watchdog, and the verdict on a frozen rank, with thousands of ranks and no model.

    python -m ddp_abci.compare.control_plane [--ranks 256 1024 4096] [--timeout 60] [--out FILE.json]

This process is rank 0: the store (process_group.rendezvous_store, as a run opens it), its
Watchdog and heartbeat. Worker processes hold the other ranks, each rank a real Watchdog (its
watch thread) and a real Heartbeat (its thread, its own client of the store, its signed beats),
the same classes a run uses; only the hang report's stacks are left out (a rank answers with
its place). Each world size runs two windows:

    steady   every rank at local work: the store's load at the heartbeat's cadence
             (every 5 s from --timeout 40 up, as at the default --timeout 120)
    frozen   the highest rank stops (its threads block, as SIGSTOP leaves them) while every other
             enters the gradient all-reduce it never joins: the time until the first verdict
             (whichever rank claims it, as in a run), and the store's load meanwhile

Measured: this process's CPU (the store's server threads, rank 0's heartbeat and watch threads)
as a share of one core; the store's latency (a set and a get from a client here, every 0.1 s);
the time from the freeze to the verdict, and that the verdict names the frozen rank. --readers
all makes every waiting rank read every heartbeat (the design before heartbeat.READERS), to show
the growth it had.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

from ..parallel import heartbeat as heartbeat_module
from ..parallel import signing
from ..parallel.launch import Launch
from ..parallel.process_group import rendezvous_store
from ..parallel.watchdog import Watchdog

# Ranks a worker process holds: at 512 (8 processes for 4,096 ranks) a rank's heartbeat thread
# waited seconds for the GIL among a thousand others, which no rank of a real run (a process of
# its own) does, and the verdict's rank found its own store call "stuck".
RANKS_PER_WORKER = 128
STEADY_S = 20.0


class SimulatedRank(Watchdog):
    """A rank without a model: its place is its phase, no stacks are written, and it can freeze."""

    def __init__(self, launch: Launch, timeout_s: float, end: object, record: object) -> None:
        super().__init__(launch, timeout_s, end=end, record=record)
        self.frozen = threading.Event()
        beat = self.heartbeat._beat

        def beat_unless_frozen(store: object, seq: int) -> None:
            while self.frozen.is_set():  # a stopped process: no beat, no answer, no store call
                time.sleep(3600)
            beat(store, seq)

        self.heartbeat._beat = beat_unless_frozen

    def _report(self, step: str) -> str:
        return f"in the {self.phases.top[0]} at step {step}"

    def freeze(self) -> None:
        self.frozen.set()
        self._stop.set()  # its watch thread stops judging: a stopped process sees nothing


def launch_of(rank: int, world: int, addr: str, port: int, secret: bytes) -> Launch:
    return Launch(rank, world, 0, 1, addr, port, "simulated", False, None, secret)


# -- a worker: ranks FIRST..LAST ---------------------------------------------------------------

def worker(first: int, last: int, world: int, addr: str, port: int, timeout_s: float, readers: str) -> None:
    """Ranks first..last of `world`; the secret comes on stdin (never a command line), then the
    commands: "collective" (every rank enters the all-reduce; the world's last rank freezes)."""
    if readers == "all":
        heartbeat_module.READERS = world
    secret = bytes.fromhex(sys.stdin.readline().strip())
    def record(status: int, line: str) -> None:  # a verdict, whichever rank claimed it: to rank 0's process
        print(f"verdict {time.time()} {line}", flush=True)

    ranks = [SimulatedRank(launch_of(r, world, addr, port, secret), timeout_s, end=lambda status: None,
                           record=record) for r in range(first, last + 1)]
    for rank in ranks:
        rank.working("loss_fn").__enter__()
        rank.start()
    while any(rank.heartbeat.store is None and not rank.heartbeat.store_error for rank in ranks):
        time.sleep(0.1)
    print("ready", flush=True)
    for command in sys.stdin:
        if command.strip() == "collective":
            for rank in ranks:
                if rank.launch.rank == world - 1:
                    rank.freeze()
                else:
                    rank.waiting("gradient all-reduce").__enter__()
    os._exit(0)


# -- rank 0 and the measuring ------------------------------------------------------------------

class Meter:
    """This process's CPU and the store's latency over a window."""

    def __init__(self, store: dist.TCPStore) -> None:
        self.store, self.latencies, self.running = store, [], False
        self.cpu0 = self.wall0 = 0.0

    def start(self) -> None:
        self.latencies, self.running = [], True
        self.cpu0, self.wall0 = _cpu_s(), time.monotonic()
        threading.Thread(target=self._probe, daemon=True).start()

    def _probe(self) -> None:
        while self.running:
            began = time.perf_counter()
            self.store.set("probe", "x")
            self.store.get("probe")
            self.latencies.append((time.perf_counter() - began) * 1e3)
            time.sleep(0.1)

    def stop(self) -> dict:
        self.running = False
        wall = time.monotonic() - self.wall0
        lat = sorted(self.latencies) or [float("nan")]
        return {"cpu_share": round((_cpu_s() - self.cpu0) / wall, 4),
                "latency_ms_p50": round(statistics.median(lat), 2),
                "latency_ms_p99": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2), "window_s": round(wall, 1)}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def simulate(world: int, timeout_s: float, readers: str) -> dict:
    """One world size: the steady window, then the frozen rank's verdict. Returns its figures."""
    secret, began = signing.draw(), time.monotonic()
    launch = launch_of(0, world, "127.0.0.1", _free_port(), secret)
    server = rendezvous_store(launch, timeout_s)
    verdicts: list[tuple[float, str]] = []
    rank0 = SimulatedRank(launch, timeout_s, end=lambda status: None,
                          record=lambda status, line: verdicts.append((time.time(), line)))
    rank0.working("loss_fn").__enter__()
    rank0.start()
    workers = [_start_worker(first, min(first + RANKS_PER_WORKER - 1, world - 1), world, launch, timeout_s, readers)
               for first in range(1, world, RANKS_PER_WORKER)]
    try:
        for proc in workers:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a worker of simulated ranks did not start")
            threading.Thread(target=_verdicts_of, args=(proc, verdicts), daemon=True).start()
        started_s, meter = time.monotonic() - began, Meter(dist.TCPStore("127.0.0.1", launch.master_port, None, False))
        meter.start()
        time.sleep(STEADY_S)
        steady = meter.stop()
        meter.start()
        frozen_at = time.time()
        for proc in workers:
            proc.stdin.write("collective\n")
            proc.stdin.flush()
        with rank0.waiting("gradient all-reduce"):
            while not verdicts and time.time() - frozen_at < timeout_s + 120:
                time.sleep(0.2)
        waiting = meter.stop()
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()
    rank0.stop()
    del server
    when, line = min(verdicts) if verdicts else (float("nan"), "")
    return {"ranks": world, "readers": readers, "timeout_s": timeout_s, "interval_s": rank0.interval,
            "start_s": round(started_s, 1), "steady": steady, "frozen": waiting,
            "verdict_s": round(when - frozen_at, 1), "names_the_frozen_rank": f"rank {world - 1} (host" in line,
            "verdict": line[:300]}


def _verdicts_of(proc: subprocess.Popen, verdicts: list) -> None:
    """A worker's ranks' verdicts (any rank may claim it: the first to decide), as they come."""
    for line in proc.stdout:
        if line.startswith("verdict "):
            _, when, text = line.rstrip("\n").split(" ", 2)
            verdicts.append((float(when), text))


def _start_worker(first: int, last: int, world: int, launch: Launch, timeout_s: float, readers: str,
                  ) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "ddp_abci.compare.control_plane", "--worker", str(first), str(last),
                             str(world), launch.master_addr, str(launch.master_port), str(timeout_s), readers],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    proc.stdin.write(launch.secret.hex() + "\n")
    proc.stdin.flush()
    return proc


def _free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NAMES_FROM_FILES = "DDP_ABCI_NAMES_FROM_FILES"


def _with_names_from_files(argv: list[str]) -> int:
    """This command again in a mount namespace of its own whose name service reads /etc/hosts
    alone. The store's server looks up each client's name as it connects (torch's socket.cpp),
    and where the resolver's server does not answer (this machine's) each lookup waits out its
    5 s timeout: 255 ranks connecting at once then missed the store's 10 s (154 of them)."""
    import tempfile  # noqa: PLC0415

    with tempfile.NamedTemporaryFile("w", suffix=".conf") as conf:
        conf.write("hosts: files\n")
        conf.flush()
        os.chmod(conf.name, 0o644)
        command = " ".join([sys.executable, "-m", "ddp_abci.compare.control_plane", *map(_quoted, argv)])
        return subprocess.run(["unshare", "--mount", "sh", "-c", f"mount --bind {conf.name} /etc/nsswitch.conf && "
                               f"exec {command}"], env=dict(os.environ, **{NAMES_FROM_FILES: "1"})).returncode


def _quoted(arg: str) -> str:
    import shlex  # noqa: PLC0415

    return shlex.quote(arg)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.compare.control_plane", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--timeout", type=float, default=60.0, help="the simulated runs' --timeout (s)")
    p.add_argument("--readers", choices=["3", "all"], default="3", help="who reads every beat while waiting")
    p.add_argument("--out", type=Path, help="also write the results as JSON here")
    p.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        first, last, world, addr, port, timeout_s, readers = args.worker
        worker(int(first), int(last), int(world), addr, int(port), float(timeout_s), readers)
    if os.geteuid() == 0 and not os.environ.get(NAMES_FROM_FILES):
        return _with_names_from_files(argv if argv is not None else sys.argv[1:])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * max(args.ranks) + 1024)), hard))
    results = []
    for world in args.ranks:
        results.append(simulate(world, args.timeout, args.readers))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
