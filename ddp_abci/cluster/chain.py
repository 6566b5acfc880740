"""The rules of a chain of jobs: what a job makes of the end of the one before it, how long it
may train, what its own end means, and what it leaves for the next. The run writes its end in
CKPT_DIR/status (run_folder.py); a job writes its own where the run could not.
"""
from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from .. import run_folder
from ..atomic_text import replace_text
from ..exits import (
    EXIT_DIVERGED,
    EXIT_DONE,
    EXIT_FAILED,
    EXIT_RANK_LOST,
    EXIT_SAVE_FAILED,
    EXIT_STOPPED,
    EXIT_USAGE,
    MEANINGS,
)
from .schedulers import Scheduler
from .walltime import margin_s

# These do not mend by themselves: the chain stops.
STOPS_THE_CHAIN = {EXIT_USAGE: "refused", EXIT_DIVERGED: "diverged", EXIT_SAVE_FAILED: "storage failing"}


def say(line: str) -> None:
    """A line for the person reading the job's log or the terminal (stderr; stdout first, in order)."""
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value or default)
    except ValueError:
        return default


# -- before the run --------------------------------------------------------------------------

def verdict(ckpt_dir: str, chain: str, job: str) -> tuple[int | None, str]:
    """What a job of chain `chain` makes of the record the jobs before it left: (None, "") to
    train; (0, why) when the run is finished; (status, why) when an earlier end does not mend
    by itself: refused (2), diverged (65), storage failing (74), or an unexpected failure (1)
    twice in a row. 69, 75 and a first 1 resume. Another chain's record is not this one's."""
    record = run_folder.read_status(ckpt_dir)
    if not record or record.get("chain") != chain:
        return None, ""
    status = _int(record.get("status"), -1)
    if status == EXIT_DONE and record.get("finished") == "1":
        return 0, f"job {job}: the run in {ckpt_dir} is finished (step {record.get('step')}); nothing to train"
    if status in STOPS_THE_CHAIN:
        return status, f"job {job}: the chain stops: an earlier job ended with {status}: {record.get('line', '')}"
    if status == EXIT_FAILED and _int(record.get("failures")) >= 2:
        return EXIT_FAILED, (f"job {job}: the chain stops: two tries in a row failed unexpectedly (exit 1): "
                   f"{record.get('line', '')}")
    return None, ""


def deadline(scheduler: type[Scheduler] | None, environ: Mapping[str, str], job: str, margin: int | None,
             elapsed_s: float = 0.0, now: float | None = None) -> tuple[float | None, str]:
    """(the wall-clock time the trainer stops by, the line saying so), or (None, why not): the
    scheduler's end less `margin` (margin_s() by default). Absolute, so that what runs before
    the trainer (the doctor, mpirun starting 32 ranks) comes out of the job's time, not after it."""
    left = scheduler.walltime_left(environ, elapsed_s) if scheduler is not None else None
    if left is None:
        return None, ""
    keep = margin_s(left) if margin is None else margin
    if left - keep < 10:
        return None, f"job {job}: only {left}s of walltime left; no deadline, the scheduler's signal is the only stop"
    at = (time.time() if now is None else now) + left - keep
    return at, (f"job {job}: {left}s of walltime left; the trainer stops, saves and exits 75 within "
                f"{left - keep}s (by {time.strftime('%H:%M:%S', time.localtime(at))})")


# -- the record ------------------------------------------------------------------------------

def record(ckpt_dir: str, status: int, line: str, chain: str = "") -> None:
    """The job's own record where the run made none (a refusal before it could write, an
    unexpected failure, a lost host): the step the run last recorded is kept, `failures`
    counts exits 1 in a row, and `chain` (else the record's own) names the chain."""
    with contextlib.suppress(OSError):
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    before = run_folder.read_status(ckpt_dir)
    failures = _int(before.get("failures")) if status == EXIT_FAILED and before.get("status") == str(EXIT_FAILED) \
        else 0
    run_folder.write_status(ckpt_dir, status, finished=False, step=before.get("step", ""),
                            line=line or f"exit {status}", rank="-", host=socket.gethostname(),
                            failures=failures + (status == EXIT_FAILED), chain=chain or before.get("chain", ""))


def stamp(ckpt_dir: str, chain: str) -> None:
    """The chain's id on the record this job's run wrote, for the next job."""
    before = run_folder.read_status(ckpt_dir)
    if before:
        run_folder.write_status(ckpt_dir, _int(before.get("status")), finished=before.get("finished") == "1",
                                step=before.get("step", ""), line=before.get("line", ""), rank=before.get("rank", ""),
                                host=before.get("host", ""), failures=_int(before.get("failures")), chain=chain)


# -- after the run ---------------------------------------------------------------------------

def mpirun_output(path: str | None) -> str:
    """mpirun's copied output as text. Open MPI 5 ends its MPI_ABORT banner with a NUL byte
    (1 run in 6 of a failing fit()): a rank's line that comes after it would start with one."""
    if not path:
        return ""
    try:
        return Path(path).read_bytes().replace(b"\0", b"").decode(errors="replace")
    except OSError:
        return ""


def lost_daemon_host(output: str) -> str | None:
    """The host whose Open MPI daemon was lost after the ranks started, from mpirun's output, or
    None. Cut off from a host, mpirun either gives up on its own send ("lost communication with
    a remote daemon") or first hears that the daemon there ended ("A daemon failed to report
    back", exit 1); the same cut gave either between two hosts. Before the ranks start the same
    lines mean a launch that cannot work (no daemon there), not a lost host."""
    started = re.search(r"^ddp_abci: world size", output, re.M)
    lost = "lost communication with a remote daemon" in output or "A daemon failed to report back" in output
    if not (started and lost):
        return None
    named = re.search(r"Remote daemon: .* on node (\S+)|Remote host: *(\S+)", output)
    return next((g for g in named.groups() if g), None) if named else "a host"


def killed_rank(output: str) -> tuple[str, str, str] | None:
    """(rank, host, signal) of a rank Open MPI saw die by a signal ("prterun noticed that process
    rank 1 with PID 21776 on node h2 exited on signal 9 (Killed)."), or None."""
    found = re.search(r"process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)", output)
    return (found[1], found[2], found[3]) if found else None


def aborted_on_a_closed_link(output: str) -> str | None:
    """The host of a rank whose MPI call failed because a peer's socket closed during training
    ("[h1:00000] *** An error occurred in Socket closed" ... "MPI_ERRORS_ARE_FATAL"), or None.
    That rank is a survivor, not the culprit: when its abort reaches mpirun before the news of
    the dead rank on another host (Open MPI 5 then exits 14, "calling abort"), the dead rank is
    never named."""
    started = re.search(r"^ddp_abci: world size", output, re.M)
    found = re.search(r"^\[([^:\]]+):\d+\] \*\*\* An error occurred in Socket closed", output, re.M)
    return found[1] if started and found and "MPI_ERRORS_ARE_FATAL" in output else None


def finish(ckpt_dir: str, rc: int, before: str, output: str | None, job: str, chain: str = "") -> int:
    """The job's status after mpirun, said and recorded. mpirun's own status is not always the
    run's (cut off from a host, Open MPI 5's mpirun exited 0): a status the run recorded during
    this job wins; without one a 0 is a lost rank or launcher, a rank killed by a signal is that
    rank lost, a rank's abort on a closed link is a rank elsewhere lost, and an exit after mpirun
    lost a host's daemon is that host lost (each 69, recorded:
    the next try or job resumes, its host named). A refusal (2) and an
    unexpected failure (1) that the run could not record are recorded with its last error line,
    so that a chain stops on them."""
    if not ckpt_dir:
        return rc
    text = mpirun_output(output)
    if run_folder.fingerprint(ckpt_dir) != before:
        recorded = _int(run_folder.read_status(ckpt_dir).get("status"), rc)
        if recorded != rc:
            say(f"job {job}: mpirun exited {rc}; the run recorded {recorded}: "
                f"{run_folder.read_status(ckpt_dir).get('line')}")
        status = recorded
    elif rc == EXIT_DONE:
        status = _lost(ckpt_dir, f"job {job}: mpirun exited 0 but the run recorded no end in {ckpt_dir}/status: a "
                                 "rank or the launcher was lost (Open MPI's lines above name the host); treated as 69")
    elif killed_rank(text):
        rank, host, signum = killed_rank(text)
        status = _lost(ckpt_dir, f"job {job}: rank {rank} on host {host} was killed by signal {signum} (Open MPI's "
                                 "lines above); treated as 69")
    elif aborted_on_a_closed_link(text):
        status = _lost(ckpt_dir, f"job {job}: mpirun exited {rc} after a rank on {aborted_on_a_closed_link(text)} "
                                 "found its link to another rank closed (Open MPI's lines above): a rank elsewhere "
                                 "was lost; treated as 69")
    elif lost_daemon_host(text):
        status = _lost(ckpt_dir, f"job {job}: mpirun exited {rc} after Open MPI lost its daemon on "
                                 f"{lost_daemon_host(text)} (its lines above) during training: that host, or the "
                                 "link to it, was lost; treated as 69")
    else:
        if rc in (EXIT_FAILED, EXIT_USAGE):
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            record(ckpt_dir, rc, errors[-1] if errors else "")
        status = rc
    if chain and run_folder.fingerprint(ckpt_dir) != before:
        stamp(ckpt_dir, chain)
    return status


def _lost(ckpt_dir: str, line: str) -> int:
    say(line)
    record(ckpt_dir, EXIT_RANK_LOST, line)
    return EXIT_RANK_LOST


def explain(status: int, job: str, ckpt_dir: str = "") -> str:
    """What the job's exit status means for the next step (docs/abci.md, "when a job fails"):
    exits.MEANINGS' advice for a job, with what only a job knows (a checkpoint folder or none)."""
    if status == EXIT_STOPPED and not ckpt_dir:
        return (f"job {job}: stopped early with no checkpoint (no CKPT_DIR): its work is lost; set CKPT_DIR to carry "
                "a run from job to job")
    meaning = MEANINGS.get(status)
    return f"job {job}: {meaning.for_a_job}" if meaning is not None and status != EXIT_DONE else ""


# -- what the next job gets --------------------------------------------------------------------

def leave_out_hosts(ckpt_dir: str, chain: str, scheduler: type[Scheduler] | None, environ: Mapping[str, str],
                    submit_dir: str) -> str:
    """The hosts the run found straggling (DIR/slow_hosts.json) and those an in-job restart left
    out (DIR/bad_hosts.json), left out of the chain's next job where the scheduler allows it;
    elsewhere named for the user to act on. The line said."""
    hosts = list(dict.fromkeys(_json(run_folder.path(ckpt_dir, run_folder.SLOW_HOSTS)).get("hosts", []) +
                               [h["host"] for h in _json(run_folder.path(ckpt_dir, run_folder.BAD_HOSTS)).get("hosts",
                                                                                                             [])]))
    if not chain or not hosts:
        return ""
    names = ",".join(hosts)
    following = next_job(chain, scheduler.job_id(environ) if scheduler else None, submit_dir)
    if following and scheduler is not None and scheduler.exclude_hosts(following, hosts):
        return f"the chain's next job ({following}) leaves out the hosts that straggled or failed: {names}"
    return (f"these hosts straggled or failed ({run_folder.SLOW_HOSTS}, {run_folder.BAD_HOSTS} in CKPT_DIR): "
            f"{names}; this scheduler's queued jobs cannot be told to avoid them: leave them out of the next "
            "submission if your site lets you, and tell its support if it repeats")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def next_job(chain: str, this: str | None, submit_dir: str) -> str:
    """The job of `chain` submitted after `this` ("" for none): from SUBMIT_DIR/CHAIN.jobs."""
    try:
        jobs = (Path(submit_dir) / f"{chain}.jobs").read_text().split()
    except OSError:
        return ""
    return jobs[jobs.index(this) + 1] if this in jobs and jobs.index(this) + 1 < len(jobs) else ""


def write_chain(ckpt_dir: str, site: str, ids: Sequence[str], node_hours: str, walltime_s: int) -> None:
    """CKPT_DIR/chain.json: the jobs submit.sh submitted for this run, for `python -m ddp_abci.status`."""
    with contextlib.suppress(OSError):
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
        state = {"site": site, "jobs": list(ids), "node_hours": node_hours, "walltime_s": walltime_s,
                 "submitted_unix": time.time()}
        replace_text(run_folder.path(ckpt_dir, run_folder.CHAIN), json.dumps(state))
