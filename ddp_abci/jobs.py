"""The rules of a chain of jobs, in one place: what a job makes of the end of the one before
it, how long it may train, what its own end means, and what it leaves for the next. The job
scripts (scripts/lib/job_common.sh) keep the node lists, the container, mpirun and its
signals, and call these at three points; scripts/submit.sh calls `plan` before it submits.

    python -m ddp_abci.jobs verdict DIR --chain ID --job N     before mpirun: prints `train`, or the
                                                              status the job ends with at once
    python -m ddp_abci.jobs deadline --job N [--margin S]      prints the trainer's --stop-at flag,
                                                              from the scheduler's own limit
    python -m ddp_abci.jobs fingerprint DIR                    the status file's, before mpirun
    python -m ddp_abci.jobs finish DIR RC --before F --output FILE --job N [--chain ID]
                                                              after mpirun: prints the job's status
    python -m ddp_abci.jobs record DIR STATUS LINE             the job's own record (no run made one)
    python -m ddp_abci.jobs explain STATUS --job N             what the status means for the next step
    python -m ddp_abci.jobs chain --site S DIR IDS...          DIR/chain.json, for python -m ddp_abci.status
    python -m ddp_abci.jobs plan SITE --walltime T --nodes N --per-node P --jobs C -- TRAINER ARGS
                                                              submit.sh's checks, as shell assignments

The status file, DIR/status, is one `key=value` line a field (FIELDS), written atomically by
write_status() alone: by the run at its end, or by the job where the run could not. Standard
library only, and no f-string or annotation newer than Python 3.9: it runs on login nodes.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from .atomic_text import replace_text
from .exits import EXIT_DIVERGED, EXIT_RANK_LOST, EXIT_SAVE_FAILED, EXIT_STOPPED, EXIT_USAGE

STATUS = "status"
FIELDS = ("status", "finished", "step", "rank", "host", "unix", "line", "failures", "chain")
# These do not mend by themselves: the chain stops.
STOPS_THE_CHAIN = {EXIT_USAGE: "refused", EXIT_DIVERGED: "diverged", EXIT_SAVE_FAILED: "storage failing"}


# -- the status file ---------------------------------------------------------------------

def write_status(ckpt_dir: str | os.PathLike, status: int, *, finished: bool, step: int | str, line: str,
                 rank: int | str, host: str, failures: int = 0, chain: str = "") -> None:
    """DIR/status, atomically (a temporary file renamed over it). Best effort: a folder that
    cannot take it (exit 74's) is left as it was."""
    values = {"status": status, "finished": int(finished), "step": step, "rank": rank, "host": host,
              "unix": int(time.time()), "line": line, "failures": failures, "chain": chain}
    text = "".join(f"{key}={' '.join(str(values[key]).split())}\n" for key in FIELDS)
    with contextlib.suppress(OSError):
        replace_text(Path(ckpt_dir) / STATUS, text)


def read_status(ckpt_dir: str | os.PathLike) -> dict[str, str]:
    """DIR/status's fields ({} when there is none)."""
    try:
        text = (Path(ckpt_dir) / STATUS).read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def fingerprint(ckpt_dir: str | os.PathLike) -> str:
    """The status file's digest: a record is this job's when it changed since. Its time cannot
    tell: a job that fails at once ends within the second the one before it recorded in."""
    try:
        return hashlib.sha1((Path(ckpt_dir) / STATUS).read_bytes()).hexdigest()
    except OSError:
        return "none"


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value or default)
    except ValueError:
        return default


# -- the chain's rules ---------------------------------------------------------------------

def verdict(ckpt_dir: str, chain: str, job: str) -> tuple[int | None, str]:
    """What a job of chain `chain` makes of the record the jobs before it left: (None, "") to
    train; (0, why) when the run is finished; (status, why) when an earlier end does not mend
    by itself: refused (2), diverged (65), storage failing (74), or an unexpected failure (1)
    twice in a row. 69, 75 and a first 1 resume. Another chain's record is not this one's."""
    record = read_status(ckpt_dir)
    if not record or record.get("chain") != chain:
        return None, ""
    status = _int(record.get("status"), -1)
    if status == 0 and record.get("finished") == "1":
        return 0, f"job {job}: the run in {ckpt_dir} is finished (step {record.get('step')}); nothing to train"
    if status in STOPS_THE_CHAIN:
        return status, f"job {job}: the chain stops: an earlier job ended with {status}: {record.get('line', '')}"
    if status == 1 and _int(record.get("failures")) >= 2:
        return 1, (f"job {job}: the chain stops: two jobs in a row failed unexpectedly (exit 1): "
                   f"{record.get('line', '')}")
    return None, ""


def record(ckpt_dir: str, status: int, line: str, chain: str = "") -> None:
    """The job's own record where the run made none (a refusal before it could write, an
    unexpected failure, a lost host): the step the run last recorded is kept, `failures`
    counts exits 1 in a row, and `chain` (else the record's own) names the chain."""
    with contextlib.suppress(OSError):
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    before = read_status(ckpt_dir)
    failures = _int(before.get("failures")) if status == 1 and before.get("status") == "1" else 0
    write_status(ckpt_dir, status, finished=False, step=before.get("step", ""), line=line or f"exit {status}",
                 rank="-", host=socket.gethostname(), failures=failures + (status == 1),
                 chain=chain or before.get("chain", ""))


def stamp(ckpt_dir: str, chain: str) -> None:
    """The chain's id on the record this job's run wrote, for the next job."""
    before = read_status(ckpt_dir)
    if before:
        write_status(ckpt_dir, _int(before.get("status")), finished=before.get("finished") == "1",
                     step=before.get("step", ""), line=before.get("line", ""), rank=before.get("rank", ""),
                     host=before.get("host", ""), failures=_int(before.get("failures")), chain=chain)


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


def finish(ckpt_dir: str, rc: int, before: str, output: str | None, job: str, chain: str = "") -> int:
    """The job's status after mpirun, said and recorded. mpirun's own status is not always the
    run's (cut off from a host, Open MPI 5's mpirun exited 0): a status the run recorded during
    this job wins; without one a 0 is a lost rank or launcher, and an exit after mpirun lost a
    host's daemon is that host lost (69, recorded: the next job resumes). A refusal (2) and an
    unexpected failure (1) that the run could not record are recorded with its last error line,
    so that a chain stops on them."""
    if not ckpt_dir:
        return rc
    text = mpirun_output(output)
    if fingerprint(ckpt_dir) != before:
        recorded = _int(read_status(ckpt_dir).get("status"), rc)
        if recorded != rc:
            say(f"job {job}: mpirun exited {rc}; the run recorded {recorded}: {read_status(ckpt_dir).get('line')}")
        status = recorded
    elif rc == 0:
        status = _lost(ckpt_dir, f"job {job}: mpirun exited 0 but the run recorded no end in {ckpt_dir}/status: a "
                                 "rank or the launcher was lost (Open MPI's lines above name the host); treated as 69")
    elif lost_daemon_host(text):
        status = _lost(ckpt_dir, f"job {job}: mpirun exited {rc} after Open MPI lost its daemon on "
                                 f"{lost_daemon_host(text)} (its lines above) during training: that host, or the "
                                 "link to it, was lost; treated as 69")
    else:
        if rc in (1, 2):
            errors = [line for line in text.splitlines() if line.startswith("error:")]
            record(ckpt_dir, rc, errors[-1] if errors else "")
        status = rc
    if chain and fingerprint(ckpt_dir) != before:
        stamp(ckpt_dir, chain)
    return status


def _lost(ckpt_dir: str, line: str) -> int:
    say(line)
    record(ckpt_dir, EXIT_RANK_LOST, line)
    return EXIT_RANK_LOST


def explain(status: int, job: str, ckpt_dir: str = "") -> str:
    """What the job's exit status means for the next step (docs/abci.md, "when a job fails")."""
    if status == EXIT_STOPPED:
        if ckpt_dir:
            return (f"job {job}: stopped early with a checkpoint; resubmit with the same CKPT_DIR to continue (Open "
                    "MPI's 'exited with non-zero status' block above is this exit 75: expected)")
        return (f"job {job}: stopped early with no checkpoint (no CKPT_DIR): its work is lost; set CKPT_DIR to carry "
                "a run from job to job")
    return {
        EXIT_DIVERGED: f"job {job}: diverged; the last good checkpoint is kept; do not resubmit as is: lower --lr or "
                       "add --clip-norm",
        EXIT_RANK_LOST: f"job {job}: a rank stopped answering (named above, with its host); the last checkpoint is "
                        "intact: resubmit with the same CKPT_DIR, and check that host",
        EXIT_SAVE_FAILED: f"job {job}: a checkpoint could not be written (disk full, quota, folder); free space, "
                          "then resubmit",
        EXIT_USAGE: f"job {job}: refused before training (bad setting, named above); fix it, then resubmit",
        1: f"job {job}: failed unexpectedly (the traceback above: CUDA out of memory, an NCCL error, a bug); the last "
           "checkpoint is intact; resubmit once for a passing fault, fix the cause if it repeats",
    }.get(status, "")


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the walltime ---------------------------------------------------------------------------

FORMS = "use HH:MM:SS, D-HH:MM:SS, or a number with d, h, m or s (12h, 90m)"


def to_seconds(text: str) -> int:
    """A walltime in seconds: 12:00:00, 1-00:00:00, 12h, 90m, 45s, 2d (what users type), or from
    the schedulers themselves MM:SS (squeue's %L) and plain seconds (qstat -j). ValueError
    naming the forms otherwise."""
    text = text.strip()
    unit = re.fullmatch(r"(\d+)([dhms])", text)
    if unit:
        return int(unit[1]) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[unit[2]]
    clock = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?(?:\.\d+)?", text)
    if not clock:
        raise ValueError(f"walltime {text}: {FORMS}")
    days, parts = int(clock[1] or 0), [int(p) for p in clock.groups()[1:] if p is not None]
    h, m, s = ([0] * (3 - len(parts)) + parts)
    return days * 86400 + h * 3600 + m * 60 + s


def hms(seconds: int) -> str:
    """HH:MM:SS, hours past 24 kept as hours (PBS and Grid Engine take 72:00:00)."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def slurm_time(seconds: int) -> str:
    """Slurm's -t: D-HH:MM:SS past a day, else HH:MM:SS."""
    return f"{seconds // 86400}-{hms(seconds % 86400)}" if seconds >= 86400 else hms(seconds)


def margin_s(walltime_s: int) -> int:
    """The time kept free before a walltime: 2 minutes, or a quarter of a short one."""
    return min(walltime_s // 4, 120)


def pbs_command(name: str, conf: str | None = None) -> str:
    """PBS's own command, where /etc/pbs.conf says PBS lives: a PBS job's PATH puts /opt/pbs/bin
    last, and another scheduler's qstat may come first."""
    try:
        text = Path(conf or os.environ.get("PBS_CONF_FILE", "/etc/pbs.conf")).read_text()
    except OSError:
        return name
    found = re.search(r"^PBS_EXEC=(.*)$", text, re.M)
    path = Path(found[1].strip()) / "bin" / name if found else None
    return str(path) if path is not None and os.access(path, os.X_OK) else name


def _ask(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def walltime_left(environ: Mapping[str, str], elapsed_s: float = 0.0) -> int | None:
    """Seconds before the scheduler ends this job, from the scheduler itself, or None:
    PBS qstat -f (Resource_List.walltime less resources_used.walltime), Slurm squeue's %L,
    Grid Engine qstat -j's s_rt (where its SIGUSR1 comes), else h_rt, less `elapsed_s`."""
    if environ.get("PBS_JOBID"):
        info = _ask(pbs_command("qstat"), "-f", environ["PBS_JOBID"])
        limit = re.search(r"Resource_List\.walltime = (\S+)", info)
        used = re.search(r"resources_used\.walltime = (\S+)", info)
        return to_seconds(limit[1]) - (to_seconds(used[1]) if used else 0) if limit else None
    if environ.get("SLURM_JOB_ID"):
        left = _ask("squeue", "-h", "-j", environ["SLURM_JOB_ID"], "-o", "%L").strip()
        return to_seconds(left) if re.match(r"\d", left) else None
    if environ.get("JOB_ID"):
        info = next((line for line in _ask("qstat", "-j", environ["JOB_ID"]).splitlines()
                     if "hard resource_list" in line), "")
        limit = re.search(r"s_rt=([\d:]+)", info) or re.search(r"h_rt=([\d:]+)", info)
        return int(to_seconds(limit[1]) - elapsed_s) if limit else None
    return None


def deadline(environ: Mapping[str, str], job: str, margin: int | None, elapsed_s: float = 0.0,
             now: float | None = None) -> tuple[float | None, str]:
    """(the wall-clock time the trainer stops by, the line saying so), or (None, why not): the
    scheduler's end less `margin` (margin_s() by default). Absolute, so that what runs before
    the trainer (the doctor, mpirun starting 32 ranks) comes out of the job's time, not after it."""
    left = walltime_left(environ, elapsed_s)
    if left is None:
        return None, ""
    keep = margin_s(left) if margin is None else margin
    if left - keep < 10:
        return None, f"job {job}: only {left}s of walltime left; no deadline, the scheduler's signal is the only stop"
    at = (time.time() if now is None else now) + left - keep
    return at, (f"job {job}: {left}s of walltime left; the trainer stops, saves and exits 75 within "
                f"{left - keep}s (by {time.strftime('%H:%M:%S', time.localtime(at))})")


# -- slow hosts ---------------------------------------------------------------------------

def leave_out_slow_hosts(ckpt_dir: str, chain: str, environ: Mapping[str, str], submit_dir: str) -> str:
    """The hosts the run found straggling (DIR/slow_hosts.json), left out of the chain's next
    job where the scheduler allows it (Slurm: scontrol update ExcNodeList); elsewhere named for
    the user to act on (PBS and Grid Engine give a queued job no exclusion). The line said."""
    try:
        hosts = json.loads((Path(ckpt_dir) / "slow_hosts.json").read_text()).get("hosts", [])
    except (OSError, ValueError):
        return ""
    if not chain or not hosts:
        return ""
    names = ",".join(hosts)
    jobs = _lines(Path(submit_dir) / f"{chain}.jobs")
    this = environ.get("SLURM_JOB_ID", "")
    following = jobs[jobs.index(this) + 1] if this in jobs and jobs.index(this) + 1 < len(jobs) else ""
    if this and following and subprocess.run(["scontrol", "update", f"JobId={following}", f"ExcNodeList={names}"],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
        return f"the chain's next job ({following}) leaves out the hosts that straggled: {names}"
    return (f"these hosts straggled (CKPT_DIR/slow_hosts.json): {names}; this scheduler's queued jobs cannot be told "
            "to avoid them: tell your site's support if it repeats")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


# -- submit.sh's plan -------------------------------------------------------------------------

def plan(site: str, walltime: str, nodes: int, per_node: int, jobs: int, trainer_args: Sequence[str],
         train_script: str = "", repo: str = "", binds: str = "", container: str = "none",
         default_bs: int = 256) -> dict[str, str]:
    """What submit.sh submits, checked before anything is queued: the walltime in each
    scheduler's form, the margin, the node-hours the chain asks for; the trainer's own flags
    parsed as the trainer parses them (a bad value or a global batch the ranks do not divide is
    refused here, not after the queue wait), for TRAIN_SCRIPT too; the script itself readable
    and where the job will see it. ValueError with the one line to print otherwise."""
    if not re.fullmatch(r"(\d+-)?\d+:\d{2}:\d{2}|\d+[dhms]", walltime):
        raise ValueError(f"walltime {walltime}: {FORMS}")  # a bare number is minutes to Slurm, seconds to PBS
    limit = to_seconds(walltime)
    if limit < 60:
        raise ValueError(f"-t {walltime} is too short: give at least 1m")
    ranks = nodes * per_node
    _check_trainer_args(trainer_args, ranks, nodes, per_node, default_bs if not train_script else None)
    if train_script:
        _check_script(train_script, repo, binds, container)
    margin = margin_s(limit)
    return {"limit": str(limit), "margin": str(margin), "walltime_hms": hms(limit), "slurm_time": slurm_time(limit),
            "slurm_warning": str(margin - 60), "node_hours": f"{nodes * jobs * limit / 3600:g}"}


def _check_trainer_args(args: Sequence[str], ranks: int, nodes: int, per_node: int, default_bs: int | None) -> None:
    """The trainer's flags among `args`, parsed as the trainer parses them: all of them for the
    seed's job (whose global batch the job scripts set to `default_bs` unless given), only the
    trainer's for a TRAIN_SCRIPT (its own flags are its own, and its default batch unknown here)."""
    from .autoencoder_job import AutoencoderJob  # noqa: PLC0415
    from .cli import add_options, build, unknown_flag  # noqa: PLC0415  (the trainer's own flags, no torch)
    from .config import TrainConfig  # noqa: PLC0415
    from .errors import RunError  # noqa: PLC0415
    from .parallel.launch import LaunchOptions  # noqa: PLC0415

    builtin = default_bs is not None
    parser = _Refusing(prog="the trainer", allow_abbrev=False)
    add_options(parser, TrainConfig, defaults={"global_batch": default_bs} if builtin else None)
    add_options(parser, LaunchOptions)
    if builtin:
        add_options(parser, AutoencoderJob)
    parsed, rest = parser.parse_known_args(list(args))
    strange = unknown_flag(parser, rest) if builtin else None  # a TRAIN_SCRIPT's own flags are its own
    if strange:
        raise ValueError(f"{strange} (the trainer's flags: python -m ddp_abci.train --help)")
    try:
        config = build(TrainConfig, parsed)
        if builtin:
            build(AutoencoderJob, parsed)
    except RunError as e:
        raise ValueError(str(e)) from None
    given = any(a == "--bs" or a.startswith("--bs=") for a in args)
    bs = config.global_batch
    if (builtin or given) and bs % ranks:
        raise ValueError(f"--bs {bs} does not divide by {nodes} node(s) x {per_node} rank(s) = {ranks}: use a "
                         f"multiple of {ranks}, e.g. --bs {max(bs // ranks, 1) * ranks}")


class _Refusing(argparse.ArgumentParser):
    """The trainer's parser, whose error is a ValueError naming the trainer's --help."""

    def error(self, message: str):  # type: ignore[override]
        raise ValueError(f"{message} (a flag for the trainer: see python -m ddp_abci.train --help)")


def _check_script(script: str, repo: str, binds: str, container: str) -> None:
    path = Path(script)
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ValueError(f"TRAIN_SCRIPT={script} {'cannot be read' if path.exists() else 'does not exist'}: give the "
                         "path of your fit() script")
    if container == "none":
        return
    seen = [Path(repo)] + [Path(b.split(":")[0]) for b in binds.split(",") if b]
    real = path.resolve()
    if not any(real == folder.resolve() or folder.resolve() in real.parents for folder in seen):
        raise ValueError(f"TRAIN_SCRIPT={script} is outside the checkout ({repo}) and every bound folder, so the "
                         f"ranks inside the container cannot see it: move it into the checkout, or bind its folder "
                         f"(BINDS={real.parent})")


def write_chain(ckpt_dir: str, site: str, ids: Sequence[str], node_hours: str, walltime_s: int) -> None:
    """CKPT_DIR/chain.json: the jobs submit.sh submitted for this run, for `python -m ddp_abci.status`."""
    with contextlib.suppress(OSError):
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
        state = {"site": site, "jobs": list(ids), "node_hours": node_hours, "walltime_s": walltime_s,
                 "submitted_unix": time.time()}
        replace_text(Path(ckpt_dir) / "chain.json", json.dumps(state))


# -- the command line -------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # plan: the trainer's arguments after --
    args = _parser().parse_args(argv[:cut])
    args.trainer_args = argv[cut + 1:]
    return args.run(args)


def _verdict(args: argparse.Namespace) -> int:
    status, line = verdict(args.dir, args.chain, args.job)
    if line:
        say(line)
    print("train" if status is None else status)
    return 0


def _deadline(args: argparse.Namespace) -> int:
    at, line = deadline(os.environ, args.job, args.margin, args.elapsed)
    if line:
        say(line)
    if at is not None:
        print(f"--stop-at {at:.0f}")
    return 0


def _finish(args: argparse.Namespace) -> int:
    status = finish(args.dir, args.rc, args.before, args.output, args.job, args.chain)
    line = leave_out_slow_hosts(args.dir, args.chain, os.environ, args.submit_dir) if args.dir else ""
    for said in (f"job {args.job}: {line}" if line else "", explain(status, args.job, args.dir)):
        if said:
            say(said)
    print(status)
    return 0


def _plan(args: argparse.Namespace) -> int:
    try:
        values = plan(args.site, args.walltime, args.nodes, args.per_node, args.jobs, args.trainer_args,
                      args.train_script, args.repo, args.binds, args.container, args.default_bs)
    except ValueError as e:
        print(f"submit.sh: error: {e}", file=sys.stderr)
        return 2
    print("".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items()), end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddp_abci.jobs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True)
    each = commands.add_parser("verdict", help="before mpirun: train, or the status to end with at once")
    each.add_argument("dir")
    each.add_argument("--chain", required=True)
    each.add_argument("--job", default="?")
    each.set_defaults(run=_verdict)
    each = commands.add_parser("deadline", help="the trainer's --stop-at, from the scheduler's own limit")
    each.add_argument("--job", default="?")
    each.add_argument("--margin", type=int, default=None)
    each.add_argument("--elapsed", type=float, default=0.0, help="seconds the job has run (Grid Engine)")
    each.set_defaults(run=_deadline)
    each = commands.add_parser("fingerprint", help="the status file's digest")
    each.add_argument("dir")
    each.set_defaults(run=lambda a: print(fingerprint(a.dir)) or 0)
    each = commands.add_parser("finish", help="after mpirun: the job's status, said and recorded")
    each.add_argument("dir")
    each.add_argument("rc", type=int)
    each.add_argument("--before", required=True)
    each.add_argument("--output")
    each.add_argument("--job", default="?")
    each.add_argument("--chain", default="")
    each.add_argument("--submit-dir", default=".submit")
    each.set_defaults(run=_finish)
    each = commands.add_parser("record", help="the job's own record in DIR/status")
    each.add_argument("dir")
    each.add_argument("status", type=int)
    each.add_argument("line")
    each.add_argument("--chain", default="")
    each.set_defaults(run=lambda a: record(a.dir, a.status, a.line, a.chain) or 0)
    each = commands.add_parser("chain", help="CKPT_DIR/chain.json: the jobs submitted, for the status command")
    each.add_argument("dir")
    each.add_argument("--site", required=True)
    each.add_argument("--node-hours", default="")
    each.add_argument("--walltime-s", type=int, default=0)
    each.add_argument("ids", nargs="*")
    each.set_defaults(run=lambda a: write_chain(a.dir, a.site, a.ids, a.node_hours, a.walltime_s) or 0)
    each = commands.add_parser("explain", help="what an exit status means for the next step")
    each.add_argument("status", type=int)
    each.add_argument("--job", default="?")
    each.add_argument("--dir", default="")
    each.set_defaults(run=lambda a: print(explain(a.status, a.job, a.dir)) or 0)
    each = commands.add_parser("plan", help="submit.sh's checks and values, as shell assignments")
    each.add_argument("site")
    each.add_argument("--walltime", required=True)
    each.add_argument("--nodes", type=int, required=True)
    each.add_argument("--per-node", type=int, required=True)
    each.add_argument("--jobs", type=int, default=1)
    each.add_argument("--train-script", default="")
    each.add_argument("--repo", default=os.getcwd())
    each.add_argument("--binds", default="")
    each.add_argument("--container", default="none")
    each.add_argument("--default-bs", type=int, default=256, help="the job scripts' --bs for the seed's job")
    each.set_defaults(run=_plan)
    return parser


if __name__ == "__main__":
    sys.exit(main())
