"""scripts/submit.sh: one job or a chain of them, everything checked before anything is queued
(a bad flag costs seconds here, not a queue wait for 4 nodes): the site and its options, the
walltime's form, the ranks a node holds, the trainer's flags as the trainer parses them, a
TRAIN_SCRIPT's flags as its own parser takes them (run here, DDP_ABCI_CHECK_ARGS set: it
checks and exits), and the variables to carry. Then the settings file each job sources, the
submit lines (schedulers.py), the chain's list and CKPT_DIR/chain.json.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..cli import CHECKED
from ..exits import EXIT_USAGE
from . import chain, forwarding
from .job import DEFAULT_BS, SETTINGS, Refused, ranks_per_node
from .schedulers import SITES, Request, Site
from .walltime import hms, margin_s, typed

USAGE = f"""usage: scripts/submit.sh SITE [-g GROUP] [-n NODES] [-t WALLTIME] [-c JOBS] [-p RANKS_PER_NODE]
                         [-G GPUS_PER_NODE] [-r RESOURCE] [--doctor] [-- TRAINER ARGS]
  SITE               {', '.join(f'{name} ({site.help})' for name, site in SITES.items())}
  -g GROUP           your ABCI group (qsub -P / -g), or a Slurm account (-A); needed on ABCI
  -n NODES           nodes per job (default 1)
  -t WALLTIME        per job: 12:00:00, 2-00:00:00, 12h, 90m, 2d (default 1h)
  -c JOBS            a chain: JOBS jobs, each starting when the one before ends, each resuming
                     from CKPT_DIR (needed); a finished run ends the chain, and so do exits 2, 65, 74
                     and 1 twice in a row
  -p RANKS_PER_NODE  ranks on each node (default: one per GPU: abci3 rt_HF 8, abci2 rt_AF 8,
                     rt_F 4; slurm: -G's, else NPROC_PER_NODE, else 1)
  -G GPUS_PER_NODE   slurm: the partition's GPUs per node (or GPUS_PER_NODE): asks --gpus-per-node
  -r RESOURCE        abci2: rt_AF (default, 8 A100) or rt_F (4 V100)
  --doctor           the first job checks the allocation first (python -m ddp_abci.doctor; DOCTOR=1)
  -- TRAINER ARGS    the trainer's flags (python -m ddp_abci.train --help), or your TRAIN_SCRIPT's,
                     after TRAIN_ARGS's
Settings from the environment reach every job (docs/abci.md, "Reference"): {', '.join(SETTINGS)};
the variables FORWARD_ENV names, and HF_* and WANDB_*, reach every rank (secrets by name, their
values in a file only you can read); LOG_DIR: where the jobs' output files go; SUBMIT_DIR: where
the settings files go (default .submit); AFTER=JOBID: the first job waits for that one (to extend
a chain that runs: give its last job).
DRY_RUN=1 prints the submit lines and the settings file and writes nothing. Job ids: one a line.
"""


class Stop(Exception):
    """submit.sh ends here: a one-line refusal (status 2), or --help (status 0)."""

    def __init__(self, line: str, status: int = EXIT_USAGE) -> None:
        super().__init__(line)
        self.status = status


@dataclass(frozen=True)
class Options:
    site: Site
    group: str
    nodes: int
    walltime: str
    jobs: int
    per_node: str       # -p as given ("" : not given)
    gpus: str           # -G or GPUS_PER_NODE
    resource: str
    doctor: bool
    trainer_args: list[str]   # TRAIN_ARGS's, then those after --


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise Stop("unknown option (scripts/submit.sh --help)")


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> Options:
    """The command line and the settings that shape the submission. Raises: Stop."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    if argv[:1] in (["-h"], ["--help"]):
        raise Stop(USAGE, 0)
    if not argv or argv[0] not in SITES:
        raise Stop(f"first argument must be {', '.join(list(SITES)[:-1])} or {list(SITES)[-1]} (scripts/submit.sh "
                   "--help)")
    if {"-h", "--help"} & set(argv[1:cut]):
        raise Stop(USAGE, 0)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = _Parser(add_help=False, allow_abbrev=False)
    for flag, default in (("-g", ""), ("-n", "1"), ("-t", "1h"), ("-c", "1"), ("-p", ""),
                          ("-G", environ.get("GPUS_PER_NODE", "")), ("-r", "")):
        parser.add_argument(flag, default=default)
    parser.add_argument("--doctor", action="store_true")
    args = parser.parse_args(argv[1:cut])
    site = SITES[argv[0]]
    if site.group_needed and not args.g:
        raise Stop("no group given: pass -g GROUP (your ABCI group, e.g. gaa12345)")
    for flag, value in (("n", args.n), ("c", args.c), ("p", args.p), ("G", args.G)):
        if value and not (value.isdigit() and int(value) > 0):
            raise Stop(f"-{flag} {value} is not a positive number")
    resource = args.r or site.resource
    if site.gpus and resource not in site.gpus:
        raise Stop(f"-r {resource}: {site.help}'s multi-node types are "
                   f"{' and '.join(f'{r} ({n} GPUs)' for r, n in site.gpus.items())}")
    if int(args.c) > 1 and not environ.get("CKPT_DIR"):
        raise Stop(f"-c {args.c} needs CKPT_DIR: every job of a chain resumes from it "
                   "(CKPT_DIR=/groups/GROUP/runs/NAME scripts/submit.sh ...)")
    trainer = [*shlex.split(environ.get("TRAIN_ARGS", "")), *argv[cut + 1:]]
    return Options(site, args.g, int(args.n), args.t, int(args.c), args.p, args.G, resource, args.doctor, trainer)


def per_node(options: Options, environ: Mapping[str, str]) -> tuple[int, str]:
    """(ranks on each node, the line saying where that came from, or ""): -p, else NPROC_PER_NODE,
    else one per GPU of the site's node (or -G), else 1."""
    gpus = options.site.gpus_per_node(options.resource, int(options.gpus or 0))
    asked, said_by = (options.per_node, "-p") if options.per_node else (environ.get("NPROC_PER_NODE", ""),
                                                                        "NPROC_PER_NODE")
    try:
        ranks = ranks_per_node(asked, said_by, gpus, None, 1)
    except Refused as e:
        raise Stop(str(e).replace("integer", "number")) from None
    if said_by == "-p" and gpus and ranks != gpus:
        return ranks, f"{ranks} rank(s) per node (-p), not one per GPU ({gpus})"
    return ranks, f"{ranks} rank(s) per node (NPROC_PER_NODE)" if asked and said_by == "NPROC_PER_NODE" else ""


# -- the checks before the queue ------------------------------------------------------------------

def plan(site: str, walltime: str, nodes: int, per_node: int, jobs: int, trainer_args: Sequence[str],
         train_script: str = "", repo: str = "", binds: str = "", container: str = "none",
         default_bs: int = DEFAULT_BS) -> dict[str, str]:
    """What submit.sh submits, checked before anything is queued: the walltime in each
    scheduler's form, the margin, the node-hours the chain asks for; the trainer's own flags
    parsed as the trainer parses them (a bad value or a global batch the ranks do not divide is
    refused here, not after the queue wait), for TRAIN_SCRIPT too; the script itself readable
    and where the job will see it. Raises: ValueError with the one line to print."""
    limit = typed(walltime)
    ranks = nodes * per_node
    check_trainer_args(trainer_args, ranks, nodes, per_node, default_bs if not train_script else None)
    if train_script:
        check_script(train_script, repo, binds, container)
    return {"limit": str(limit), "margin": str(margin_s(limit)), "walltime_hms": hms(limit),
            "node_hours": f"{nodes * jobs * limit / 3600:g}"}


def check_trainer_args(args: Sequence[str], ranks: int, nodes: int, per_node: int, default_bs: int | None) -> None:
    """The trainer's flags among `args`, parsed as the trainer parses them: all of them for the
    seed's job (whose global batch the job scripts set to `default_bs` unless given), only the
    trainer's for a TRAIN_SCRIPT (its own flags are its own parser's: check_script_flags)."""
    from ..autoencoder_job import AutoencoderJob  # noqa: PLC0415  (the trainer's own flags, no torch)
    from ..cli import add_options, build, unknown_flag  # noqa: PLC0415
    from ..config import TrainConfig  # noqa: PLC0415
    from ..errors import RunError  # noqa: PLC0415
    from ..parallel.launch import LaunchOptions  # noqa: PLC0415

    builtin = default_bs is not None
    parser = _Refusing(prog="the trainer", allow_abbrev=False)
    add_options(parser, TrainConfig, defaults={"global_batch": default_bs} if builtin else None)
    add_options(parser, LaunchOptions)
    if builtin:
        add_options(parser, AutoencoderJob)
    parsed, rest = parser.parse_known_args(list(args))
    strange = unknown_flag(parser, rest) if builtin else None
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


def check_script(script: str, repo: str, binds: str, container: str) -> None:
    """TRAIN_SCRIPT readable, and inside a folder the container binds. Raises: ValueError."""
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


def check_script_flags(script: str, args: Sequence[str], ranks: int, environ: Mapping[str, str],
                       repo: str) -> str:
    """Run TRAIN_SCRIPT's own parser on `args` for `ranks` ranks, here, before the queue: the script
    runs with DDP_ABCI_CHECK_ARGS set, parse_command_line checks its flags (the trainer's and the
    script's `own`) and the batch, prints CHECKED and exits, and fit() never trains. Through the
    image where it can run here (singularity on PATH), else with the host's PYTHON.
    Returns the line to say; Raises: ValueError with the script's own refusal."""
    cmd = _python_for_the_check(environ, repo) + [script, *args]
    env = {**environ, "DDP_ABCI_CHECK_ARGS": str(ranks), "PYTHONPATH": _with_repo(environ.get("PYTHONPATH"), repo)}
    try:
        done = subprocess.run(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return (f"TRAIN_SCRIPT={script}: its flags were not checked here ({type(e).__name__}: {e}); the job checks "
                "them when it starts")
    lines = [line.replace("\0", "") for line in done.stdout.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if done.returncode == EXIT_USAGE and errors:
        raise ValueError(f"TRAIN_SCRIPT={script} refuses its arguments: {errors[-1][len('error: '):]}")
    if done.returncode == 0 and any(line.startswith(CHECKED) for line in lines):
        return f"TRAIN_SCRIPT={script}: its flags check out for {ranks} ranks (its own parser, run here)"
    why = lines[-1] if lines else f"exit {done.returncode}"
    return (f"TRAIN_SCRIPT={script}: its flags were not checked here ({why[:200]}); the job checks them when it "
            "starts")


def _python_for_the_check(environ: Mapping[str, str], repo: str) -> list[str]:
    venv = environ.get("VENV")
    python = f"{venv}/bin/python" if venv else environ.get("PYTHON") or "python3"
    container = environ.get("CONTAINER") or os.path.join(repo, "ddp_abci.sif")
    singularity = _on_path("singularity", environ)
    if container != "none" and os.access(container, os.R_OK) and singularity:
        binds = ",".join([repo, *[b for b in environ.get("BINDS", "").split(",") if b], *([venv] if venv else [])])
        return [singularity, "exec", "--bind", binds, "--pwd", repo, container, python if venv else "python3"]
    return [python]


def _on_path(name: str, environ: Mapping[str, str]) -> str | None:
    import shutil  # noqa: PLC0415

    return shutil.which(name, path=environ.get("PATH"))


def _with_repo(pythonpath: str | None, repo: str) -> str:
    return f"{repo}:{pythonpath}" if pythonpath else repo


# -- the settings each job reads ----------------------------------------------------------------------

def settings(options: Options, ranks: int, chain_id: str, environ: Mapping[str, str], plain: Mapping[str, str],
             secrets_file: str) -> dict[str, str]:
    """What the settings file holds: the trainer's arguments, the ranks a node, the chain, every
    setting that is set, the variables carried for the ranks, and where the secrets are."""
    values = {"TRAIN_ARGS": shlex.join(options.trainer_args), "NPROC_PER_NODE": str(ranks)}
    if options.jobs > 1:
        values["CHAIN_ID"] = chain_id
    if options.doctor:
        values["DOCTOR_FIRST"] = "1"
    for name in SETTINGS:
        if environ.get(name) and name not in values and name not in ("TRAIN_ARGS", "NPROC_PER_NODE", "DRY_RUN"):
            values[name] = environ[name]
    values.update(SUBMIT_DIR=environ.get("SUBMIT_DIR") or os.path.join(os.getcwd(), ".submit"))
    values.update(plain)
    if secrets_file:
        values["DDP_ABCI_SECRETS"] = secrets_file
    return values


# -- submitting -------------------------------------------------------------------------------------

def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """submit.sh, from its arguments: the job ids on stdout, one a line; the rest on stderr."""
    environ = dict(os.environ if environ is None else environ)
    try:
        return _submit(argv, environ)
    except Stop as e:
        if e.status == 0:
            print(str(e), end="")
        else:
            print(f"submit.sh: error: {e}", file=sys.stderr)
        return e.status
    except ValueError as e:
        print(f"submit.sh: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def _submit(argv: Sequence[str], environ: dict[str, str]) -> int:
    options = parse(argv, environ)
    repo, dry = os.getcwd(), environ.get("DRY_RUN", "") not in ("", "0")
    ranks, said = per_node(options, environ)
    if said:
        chain.say(f"submit.sh: {said}")
    script, container = environ.get("TRAIN_SCRIPT", ""), environ.get("CONTAINER") or os.path.join(repo, "ddp_abci.sif")
    planned = plan(options.site.name, options.walltime, options.nodes, ranks, options.jobs, options.trainer_args,
                   script, repo, environ.get("BINDS", ""), container)
    secret_arg = forwarding.secret_in_mpi_args(environ.get("MPI_ARGS", ""))
    if secret_arg:
        raise Stop(f"MPI_ARGS gives {secret_arg}'s value on mpirun's command line, which other users can read, and "
                   f"in the settings file: leave it out; set {secret_arg} in this shell and it reaches every rank by "
                   f"name (FORWARD_ENV={secret_arg} where its name matches no pattern)")
    if script:
        checked = check_script_flags(script, options.trainer_args, options.nodes * ranks, environ, repo)
        chain.say(f"submit.sh: {checked}")
    plain, secret = forwarding.carried(environ, environ.get("FORWARD_ENV"))
    submit_dir = environ.get("SUBMIT_DIR") or os.path.join(repo, ".submit")
    if dry:
        settings_file = os.path.join(submit_dir, "job.DRYRUN.env")
    else:
        os.makedirs(submit_dir, exist_ok=True)
        fd, settings_file = tempfile.mkstemp(prefix="job.", suffix=".env", dir=submit_dir)
        os.close(fd)
    chain_id = Path(settings_file).stem  # unique for this chain: its jobs read only its records
    secrets_file = ""
    if secret and not dry:
        secrets_file = str(forwarding.write_secrets(secret, forwarding.secrets_folder(environ), chain_id))
    values = settings(options, ranks, chain_id, environ, plain, secrets_file)
    if not dry:
        Path(settings_file).write_text(forwarding.shell_assignments(values))
    ids = _queue(options, ranks, planned, settings_file, environ, dry)
    _after(options, planned, ids, values, secret, settings_file, submit_dir, environ, dry)
    return 0


def _queue(options: Options, ranks: int, planned: Mapping[str, str], settings_file: str,
           environ: Mapping[str, str], dry: bool) -> list[str]:
    """Each job submitted after the one before (the first after AFTER, when given); its ids."""
    site = options.site
    request = Request(group=options.group, nodes=options.nodes, per_node=ranks, walltime_s=int(planned["limit"]),
                      margin_s=int(planned["margin"]), settings_file=settings_file, script=site.job_script,
                      resource=options.resource, queue=site.queue, gpus_per_node=int(options.gpus or 0),
                      log_dir=environ.get("LOG_DIR", ""))
    previous, ids = environ.get("AFTER", ""), []
    for i in range(1, options.jobs + 1):
        cmd = site.scheduler.submit_command(request, previous or None)
        if dry:
            print(shlex.join(cmd))
            previous = f"JOB{i}"
            continue
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        previous = site.scheduler.submitted_id(done.stdout) if done.returncode == 0 else ""
        if not previous:
            raise Stop(f"submitting job {i} of {options.jobs} failed: {' '.join(done.stdout.split())}")
        ids.append(previous)
        print(previous, flush=True)
    return ids


def _after(options: Options, planned: Mapping[str, str], ids: list[str], values: Mapping[str, str],
           secret: Mapping[str, str], settings_file: str, submit_dir: str, environ: Mapping[str, str],
           dry: bool) -> None:
    """What submit.sh says and leaves once the jobs are queued."""
    ckpt = environ.get("CKPT_DIR")
    if dry:
        print(f"# {settings_file} (not written: DRY_RUN):")
        print(forwarding.shell_assignments(values), end="")
        if secret:
            print(f"# and, in a file only you can read (not written: DRY_RUN): {' '.join(secret)}")
    else:
        if ckpt:
            chain.write_chain(ckpt, options.site.name, ids, planned["node_hours"], int(planned["limit"]))
        if options.jobs > 1:
            jobs_file = Path(submit_dir) / f"{Path(settings_file).stem}.jobs"
            jobs_file.write_text("".join(f"{job}\n" for job in ids))  # the jobs read it: a slow host left out
            # The last job first: PBS deletes a list in order, and a held job deleted before the one
            # after it releases that one (afterany), which runs or ends before its turn (qdel then
            # exits 35, "Job has finished"; seen under OpenPBS). The running job, last, stops with a
            # checkpoint. On stderr: stdout is the job ids alone, for the tools that read them.
            chain.say(f"submit.sh: a chain of {options.jobs} jobs, listed in {jobs_file}; to cancel them all: "
                      f"{options.site.scheduler.cancel} $(tac {jobs_file})")
    if secret:
        chain.say(f"submit.sh: {', '.join(secret)} reach every rank by name; their values are in a file only you can "
                  "read, removed when the chain ends (docs/abci.md, 'Your environment on the ranks')")
    chain.say(f"submit.sh: {options.jobs} job(s) x {options.nodes} node(s) x {hms(int(planned['limit']))} = "
              f"{planned['node_hours']} node-hours asked for (held whether or not the run uses them)")


def remove_secrets(path: str) -> None:
    """The chain's secrets file, once no job of it needs it."""
    with contextlib.suppress(OSError):
        os.unlink(path)
