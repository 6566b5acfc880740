"""Training started again inside the same job after a fault that may mend, so that a lost rank
costs the job minutes, not the rest of its allocation and a queue wait. The job script loops;
after each try it asks `decide` here (python -m ddp_abci.jobs after-try), which says whether to
train again, on which hosts, after what pause, or to leave it to the chain's next job.

    what mends     a rank lost or hung (69), a rank killed by a signal (recorded as 69, naming its
                   host), an unexpected failure (1, once a job: a transport error may pass, a bug
                   will not). A refusal (2), a divergence (65), failing storage (74), a stop (75)
                   and a finished run (0) end the job as before.
    how often      RESTARTS tries after the first (default 3 a job: DEFAULT_RESTARTS says why)
    when           only while the walltime left, less the margin, holds the restart's cost
                   (measured: this job's start-up to its first step, from progress.json) twice
                   over; a pause of RESTART_PAUSE_S (default 3 s) between tries
    which hosts    a host named by the watchdog's verdict, one that fails the quick check between
                   tries, or one blamed by two failures in a row, is left out; the rest train on
                   (a smaller world, which the checkpoints allow) where the global batch divides
                   by the ranks left, else the job ends and says why

Each try is a line of CKPT_DIR/tries.jsonl (its hosts, start, first step, end, status, the steps
it redid), and each host left out a line of bad_hosts.json: the status command reads both (the
restarts, the time each cost, the effective training time ratio), and the chain's next job
leaves the hosts out where the scheduler can.
"""
from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .. import run_folder
from ..exits import EXIT_FAILED, EXIT_RANK_LOST

# With the Llama 3 rate (DEFAULT in goodput.py: about 2e-5 failures a GPU-hour), a 12-hour job of
# 32 GPUs expects 0.008 faults and one of 4,096 GPUs about one: three tries more cover a cluster of
# faults, and a fault that does not mend (a bug that looks like a lost rank) costs three start-ups
# before the chain's next job takes it up.
DEFAULT_RESTARTS = 3
DEFAULT_PAUSE_S = 3.0
ASSUMED_START_S = 120.0  # a restart's cost before this job has measured one (no try reached a step)


@dataclass(frozen=True)
class Decision:
    again: bool
    hosts: tuple[str, ...]   # the next try's hosts (all the job's, less those left out)
    pause_s: float
    line: str                # what the job's log says ("" for nothing)
    left_out: tuple[tuple[str, str], ...] = ()  # (host, why) newly left out


def mends(status: int, tries_this_job: Sequence[dict]) -> bool:
    """Whether training may go on after this end: a lost or hung rank (69), or a first unexpected
    failure (1) of this job."""
    if status == EXIT_RANK_LOST:
        return True
    return status == EXIT_FAILED and not any(t["status"] == EXIT_FAILED for t in tries_this_job[:-1])


def blamed_host(line: str, hosts: Sequence[str] = ()) -> tuple[str | None, bool]:
    """The host a try's end names, and whether the watchdog's verdict named it (then it is left
    out at once): "rank 3 (host h2) stopped answering ... (last seen 10 s ago", "rank 1 on host h2
    was killed by signal 9", "Open MPI lost its daemon on h2". A verdict may name ranks of several
    hosts (a live rank starved of its core looks late too): the speaker's own host is alive, and
    of the others the one whose ranks went unseen longest is blamed. "a rank on h1 found its link
    to another rank closed" names a survivor: of the try's `hosts`, the one other host if there is
    one alone (a closed socket is a rank on another host: on its own host a rank talks through
    shared memory), else none."""
    named = re.findall(r"\(host (\S+)\) (?:stopped answering|is alive but never reached)[^;(]*"
                       r"(?:\(last seen (\d+) s ago)?", line)
    speaker = re.search(r"rank \d+ \(host (\S+)\) waited", line)
    candidates = [(int(age or 0), host) for host, age in named if not speaker or host != speaker[1]]
    if candidates:
        return max(candidates)[1], True
    other = re.search(r"on host (\S+) was killed by signal|lost its daemon on (\S+)", line)
    if other:
        return next(g for g in other.groups() if g), False
    survivor = re.search(r"a rank on (\S+) found its link to another rank closed", line)
    others = [h for h in hosts if survivor and h != survivor[1]]
    return (others[0], False) if len(others) == 1 else (None, False)


def restart_cost(tries_this_job: Sequence[dict]) -> tuple[float, bool]:
    """(seconds from a try's start to its first step, measured: the largest in this job;
    whether it was measured). None measured yet: ASSUMED_START_S."""
    measured = [t["first_step_unix"] - t["started_unix"] for t in tries_this_job
                if t.get("first_step_unix") is not None and t.get("started_unix") is not None]
    return (max(measured), True) if measured else (ASSUMED_START_S, False)


def decide(status: int, tries_this_job: Sequence[dict], job_hosts: Sequence[str], left_out: Sequence[str],
           unanswered: Sequence[str], *, per_node: int, global_batch: int | None, time_left_s: float | None,
           restarts: int = DEFAULT_RESTARTS, pause_s: float = DEFAULT_PAUSE_S, job: str = "?",
           have_checkpoints: bool = True) -> Decision:
    """What the job does after a try that ended with `status`.

    Args:
        tries_this_job: this job's tries so far, the one that just ended last (tries.jsonl lines).
        job_hosts: the job's hosts; left_out: those left out by earlier tries of this job.
        unanswered: hosts that failed the quick check just now.
        per_node: ranks a host; global_batch: the run's (progress.json), None when unknown.
        time_left_s: walltime left less the margin (None: no walltime known).
    Returns: the Decision; its line says why whenever it is not simply to train again."""
    stay = Decision(False, tuple(h for h in job_hosts if h not in left_out), 0.0, "")
    if not mends(status, tries_this_job) or not have_checkpoints:
        if mends(status, tries_this_job):
            return Decision(False, stay.hosts, 0.0, f"job {job}: no CKPT_DIR to resume from: no restart in the job")
        return stay
    if len(tries_this_job) > restarts:
        return Decision(False, stay.hosts, 0.0, f"job {job}: {restarts} restart(s) in this job already (RESTARTS): "
                                                "the chain's next job resumes")
    host, named = blamed_host(tries_this_job[-1].get("line", ""), tries_this_job[-1].get("hosts", ()))
    previous = blamed_host(tries_this_job[-2].get("line", ""), tries_this_job[-2].get("hosts", ()))[0] \
        if len(tries_this_job) > 1 else None
    out: list[tuple[str, str]] = [(h, "it did not answer the quick check between tries") for h in unanswered
                                  if h in stay.hosts]
    if host in stay.hosts and host not in dict(out):
        if named:
            out.append((host, "the watchdog named it: " + _cut(tries_this_job[-1]["line"])))
        elif host == previous:
            out.append((host, "two tries in a row ended with it: " + _cut(tries_this_job[-1]["line"])))
    hosts = tuple(h for h in stay.hosts if h not in dict(out))
    if not hosts:
        return Decision(False, stay.hosts, 0.0, f"job {job}: no host left to train on ({_said(out)})", tuple(out))
    ranks = len(hosts) * per_node
    if out and global_batch and global_batch % ranks:
        return Decision(False, stay.hosts, 0.0, f"job {job}: without {_said(out)} the {len(hosts)} host(s) left make "
                                                f"{ranks} ranks, and the global batch {global_batch} does not divide "
                                                "by them: no restart in this job; the chain's next job resumes",
                        tuple(out))
    cost, measured = restart_cost(tries_this_job)
    if time_left_s is not None and time_left_s < 2 * cost + pause_s:
        how = "measured in this job" if measured else "not measured yet: assumed"
        return Decision(False, hosts, 0.0, f"job {job}: {time_left_s:.0f} s of walltime left, and a restart takes "
                                           f"{cost:.0f} s ({how}): the chain's next job resumes", tuple(out))
    without = f" without {_said(out)}" if out else ""
    return Decision(True, hosts, pause_s, f"job {job}: training again in this job{without}, try "
                                          f"{len(tries_this_job) + 1} of at most {restarts + 1}, on {len(hosts)} "
                                          f"host(s) x {per_node} rank(s) (the try ended with {status})", tuple(out))


def _said(out: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{host} ({why})" for host, why in out)


def _cut(line: str) -> str:
    return line[:200] + ("..." if len(line) > 200 else "")


# -- the run folder's records -------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line a crash cut short
    return out


def record_try(ckpt_dir: str, entry: Mapping) -> None:
    """One line of tries.jsonl, appended whole (a line is written with one write)."""
    with open(run_folder.path(ckpt_dir, run_folder.TRIES), "a") as f:
        f.write(json.dumps(dict(entry)) + "\n")


def record_left_out(ckpt_dir: str, job: str, out: Sequence[tuple[str, str]]) -> None:
    """bad_hosts.json: every host an in-job restart left out, why, and when."""
    path = run_folder.path(ckpt_dir, run_folder.BAD_HOSTS)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {"hosts": []}
    known["hosts"] += [{"host": host, "why": why, "job": job, "unix": time.time()} for host, why in out]
    path.write_text(json.dumps(known, indent=1))


def bad_hosts(ckpt_dir: str) -> list[dict]:
    try:
        return json.loads(run_folder.path(ckpt_dir, run_folder.BAD_HOSTS).read_text()).get("hosts", [])
    except (OSError, ValueError):
        return []


# -- the quick check between tries ----------------------------------------------------------------

CHECK_BUDGET_S = 30.0


def unanswered_hosts(mpirun: str, hosts: Sequence[str], mpi_args: Sequence[str],
                     budget_s: float = CHECK_BUDGET_S) -> list[str]:
    """The hosts where mpirun (the training's, with its MPI_ARGS: the same remote shell) could
    not start a process that answers within `budget_s`: all hosts in one launch, and where that
    fails, each host alone, side by side, within the same budget."""
    if _answers(mpirun, hosts, mpi_args, budget_s / 2):
        return []
    answered: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda h=host: answered.update({h: _answers(mpirun, [h], mpi_args,
                                                                                   budget_s / 2)}))
               for host in hosts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [host for host in hosts if not answered.get(host)]


def _answers(mpirun: str, hosts: Sequence[str], mpi_args: Sequence[str], budget_s: float) -> bool:
    """Whether one process on each of `hosts` (rank i on the i-th: --map-by node, a slot each)
    said its rank within `budget_s`."""
    with tempfile.NamedTemporaryFile("w", prefix="ddp_abci_check.", suffix=".hosts") as hostfile:
        hostfile.write("".join(f"{host} slots=1\n" for host in hosts))
        hostfile.flush()
        try:
            done = subprocess.run([mpirun, "-np", str(len(hosts)), "--hostfile", hostfile.name, "--map-by", "node",
                                   "--stdin", "none", *mpi_args, "sh", "-c",
                                   "echo rank-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-}}}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=budget_s)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0 and set(done.stdout.split()) == {f"rank-{i}" for i in range(len(hosts))}


# -- what the tries cost ------------------------------------------------------------------------

def goodput(tries: Sequence[dict], steps_per_s: float | None) -> dict:
    """From tries.jsonl: the allocation's seconds (each job's first try's start to its last try's
    end), each in-job restart (the try that ended, its status and line, the seconds from its end
    to the next try's first step, the steps redone), and the effective training time ratio
    (ETTR): the time the run's counted steps take at its steady speed (`steps_per_s`), over the
    allocation's. Keys: allocation_s, counted_steps, useful_s, ettr, restarts."""
    jobs: dict[str, list[dict]] = {}
    for entry in tries:
        jobs.setdefault(str(entry.get("job")), []).append(entry)
    allocation = sum(each[-1]["ended_unix"] - each[0]["started_unix"] for each in jobs.values())
    restarted = []
    for each in jobs.values():
        for ended, next_try in zip(each, each[1:]):  # noqa: B905  (Python 3.9 on login nodes: no strict=)
            back = next_try.get("first_step_unix")
            restarted.append({"job": ended["job"], "try": ended["try"], "status": ended["status"],
                              "line": ended.get("line", ""), "step": ended.get("step_reached"),
                              "back_after_s": round(back - ended["ended_unix"], 1) if back else None,
                              "steps_redone": max(0, (ended.get("step_reached") or 0) - (next_try.get("step_from")
                                                                                          or 0))})
    first = tries[0].get("step_from") or 0 if tries else 0
    counted = max([t.get("step_reached") or 0 for t in tries] + [first]) - first
    useful = counted / steps_per_s if steps_per_s else None
    return {"allocation_s": round(allocation, 1), "counted_steps": counted,
            "useful_s": None if useful is None else round(useful, 1),
            "ettr": round(useful / allocation, 4) if useful is not None and allocation > 0 else None,
            "restarts": restarted}
