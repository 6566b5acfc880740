"""`python -m ddp_abci.jobs`: the commands the job scripts and scripts/submit.sh call, run by a
host Python with the checkout on PYTHONPATH (no torch, no image):

    submit SITE [OPTIONS] [-- TRAINER ARGS]        scripts/submit.sh itself (submission.py)
    prepare --site S --hostfile F [--script NAME] [--elapsed S] -- ARGS
                                                   before mpirun: bash assignments (job.py), or the
                                                   status the job ends with at once
    container IMAGE [--job N]                      after the modules: singularity there, and the
                                                   image's ddp_abci said where it is not the checkout's
    fingerprint DIR                                the status file's digest, before mpirun
    finish DIR RC --before F --output FILE --job N [--chain ID] [--submit-dir D]
                                                   after mpirun: prints the job's status (chain.py)
    after-try DIR STATUS --job N --started T --hostfile F --per-node P -- HOSTS
                                                   after a try: train again in the job, or not
                                                   (restarts.py), as bash assignments
    record DIR STATUS LINE [--chain ID]            the job's own record (no run made one)
    explain STATUS [--job N] [--dir DIR]           what the status means for the next step
    chain DIR --site S [--node-hours H] [--walltime-s S] IDS...
                                                   DIR/chain.json, for python -m ddp_abci.status
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

from .. import run_folder
from . import chain, restarts, submission
from .job import Refused, library_copies, prepare, refuse, shell
from .schedulers import SITES, detect_scheduler
from .walltime import margin_s


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["submit"]:  # its own options, as submit.sh takes them
        return submission.main(argv[1:])
    cut = argv.index("--") if "--" in argv else len(argv)
    args = _parser().parse_args(argv[:cut])
    args.rest = argv[cut + 1:]
    return args.run(args)


def _prepare(args: argparse.Namespace) -> int:
    try:
        status, values = prepare(SITES[args.site], os.environ, args.repo, args.script, args.hostfile, args.rest,
                                 args.elapsed)
    except Refused as e:
        return refuse(args.script, os.environ, str(e))
    print(shell(values) if status is None else f"EXIT_NOW={status}\n", end="")
    return 0


def _container(args: argparse.Namespace) -> int:
    """After the modules: singularity there, and the image's ddp_abci the checkout's (or said)."""
    if shutil.which("singularity") is None:
        return refuse(args.script, os.environ, "singularity not found: load its module or set CONTAINER=none")
    said = library_copies(args.image, args.repo, args.job)
    if said:
        chain.say(said)
    return 0


def _finish(args: argparse.Namespace) -> int:
    print(chain.finish(args.dir, args.rc, args.before, args.output, args.job, args.chain))
    return 0


def _the_end(args: argparse.Namespace, status: int, scheduler: object) -> None:
    """The job trains no more: what its status means, the hosts the chain's next job should
    avoid, and the chain's secrets gone when no job of it is left."""
    line = chain.leave_out_hosts(args.dir, args.chain, scheduler, os.environ, args.submit_dir) if args.dir else ""
    for said in (f"job {args.job}: {line}" if line else "", chain.explain(status, args.job, args.dir)):
        if said:
            chain.say(said)
    secrets = os.environ.get("DDP_ABCI_SECRETS")
    if secrets and _chain_ends(args, status, scheduler):
        submission.remove_secrets(secrets)


def _after_try(args: argparse.Namespace) -> int:
    """After a try's end (finish's status): its line in tries.jsonl, and whether to train again
    (restarts.decide), as bash assignments: AGAIN, NODES, NP, PAUSE; the new HOSTFILE written."""
    env, hosts = os.environ, args.rest
    tries = [t for t in restarts.read_jsonl(run_folder.path(args.dir, run_folder.TRIES)) if t.get("job") == args.job] \
        if args.dir else []
    written = _json(run_folder.path(args.dir, run_folder.PROGRESS)) if args.dir else {}
    progress = written if (written.get("started_unix") or 0) >= args.started else {}  # else: an earlier try's
    record = run_folder.read_status(args.dir) if args.dir else {}
    entry = {"job": args.job, "try": len(tries) + 1, "hosts": hosts, "started_unix": args.started,
             "first_step_unix": progress.get("first_step_unix"), "ended_unix": time.time(), "status": args.status,
             "step_from": progress.get("resumed_from"),
             "step_reached": max(_int(progress.get("step")), _int(record.get("step"))),
             "line": record.get("line", "") if record.get("status") == str(args.status) else ""}
    if args.dir:
        restarts.record_try(args.dir, entry)
    tries.append(entry)
    job_hosts = tries[0]["hosts"]
    left_out = [h for h in job_hosts if h not in hosts]
    scheduler = detect_scheduler(env)
    left = scheduler.walltime_left(env, args.elapsed) if scheduler else None
    check = restarts.unanswered_hosts(env.get("MPIRUN", "mpirun"), hosts, shlex.split(env.get("MPI_ARGS", ""))) \
        if args.dir and restarts.mends(args.status, tries) else []
    decision = restarts.decide(
        args.status, tries, job_hosts, left_out, check, per_node=args.per_node,
        global_batch=written.get("global_batch"),
        time_left_s=None if left is None else left - int(env.get("STOP_MARGIN_S") or margin_s(left)),
        restarts=int(env.get("RESTARTS") or restarts.DEFAULT_RESTARTS),
        pause_s=float(env.get("RESTART_PAUSE_S") or restarts.DEFAULT_PAUSE_S), job=args.job,
        have_checkpoints=bool(args.dir))
    if decision.left_out and args.dir:
        restarts.record_left_out(args.dir, args.job, decision.left_out)
    if decision.line:
        chain.say(decision.line)
    if not decision.again:
        _the_end(args, args.status, scheduler)
    if decision.again:
        Path(args.hostfile).write_text("".join(f"{host} slots={args.per_node}\n" for host in decision.hosts))
    print(shell({"AGAIN": "1" if decision.again else "", "NODES": list(decision.hosts),
                 "NP": str(len(decision.hosts) * args.per_node), "PAUSE": f"{decision.pause_s:g}"}), end="")
    return 0


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0


def _chain_ends(args: argparse.Namespace, status: int, scheduler: object) -> bool:
    """Whether no later job of this chain will run: the run finished, an end that stops the chain,
    the chain's last job, or a job outside a chain."""
    record = run_folder.read_status(args.dir) if args.dir else {}
    if record.get("finished") == "1" or status in chain.STOPS_THE_CHAIN or not args.chain:
        return True
    this = scheduler.job_id(os.environ) if scheduler is not None else None  # type: ignore[attr-defined]
    return bool(this) and not chain.next_job(args.chain, this, args.submit_dir) and \
        (Path(args.submit_dir) / f"{args.chain}.jobs").exists()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ddp_abci.jobs", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True)
    each = commands.add_parser("prepare", help="before mpirun: what the job runs, as bash assignments")
    each.add_argument("--site", required=True, choices=list(SITES))
    each.add_argument("--hostfile", required=True)
    each.add_argument("--script", default="job")
    each.add_argument("--repo", default=os.getcwd())
    each.add_argument("--elapsed", type=float, default=0.0, help="seconds the job has run")
    each.set_defaults(run=_prepare)
    each = commands.add_parser("container", help="after the modules: singularity there, the image's ddp_abci")
    each.add_argument("image")
    each.add_argument("--script", default="job")
    each.add_argument("--repo", default=os.getcwd())
    each.add_argument("--job", default="?")
    each.set_defaults(run=_container)
    each = commands.add_parser("fingerprint", help="the status file's digest")
    each.add_argument("dir")
    each.set_defaults(run=lambda a: print(run_folder.fingerprint(a.dir)) or 0)
    each = commands.add_parser("finish", help="after mpirun: the job's status, said and recorded")
    each.add_argument("dir")
    each.add_argument("rc", type=int)
    each.add_argument("--before", required=True)
    each.add_argument("--output")
    each.add_argument("--job", default="?")
    each.add_argument("--chain", default="")
    each.add_argument("--submit-dir", default=".submit")
    each.set_defaults(run=_finish)
    each = commands.add_parser("after-try", help="after a try: its record, and whether to train again")
    each.add_argument("dir")
    each.add_argument("status", type=int)
    each.add_argument("--job", default="?")
    each.add_argument("--started", type=float, required=True, help="when the try started (seconds since 1970)")
    each.add_argument("--hostfile", required=True)
    each.add_argument("--per-node", type=int, required=True)
    each.add_argument("--elapsed", type=float, default=0.0, help="seconds the job has run")
    each.add_argument("--chain", default="")
    each.add_argument("--submit-dir", default=".submit")
    each.set_defaults(run=_after_try)
    each = commands.add_parser("record", help="the job's own record in DIR/status")
    each.add_argument("dir")
    each.add_argument("status", type=int)
    each.add_argument("line")
    each.add_argument("--chain", default="")
    each.set_defaults(run=lambda a: chain.record(a.dir, a.status, a.line, a.chain) or 0)
    each = commands.add_parser("chain", help="CKPT_DIR/chain.json: the jobs submitted, for the status command")
    each.add_argument("dir")
    each.add_argument("--site", required=True)
    each.add_argument("--node-hours", default="")
    each.add_argument("--walltime-s", type=int, default=0)
    each.add_argument("ids", nargs="*")
    each.set_defaults(run=lambda a: chain.write_chain(a.dir, a.site, a.ids, a.node_hours, a.walltime_s) or 0)
    each = commands.add_parser("explain", help="what an exit status means for the next step")
    each.add_argument("status", type=int)
    each.add_argument("--job", default="?")
    each.add_argument("--dir", default="")
    each.set_defaults(run=lambda a: print(chain.explain(a.status, a.job, a.dir)) or 0)
    return parser
