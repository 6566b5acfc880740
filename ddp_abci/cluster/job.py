"""A job script's Python half: everything a job decides before mpirun starts, decided once and
checked before anything starts (each problem one `SCRIPT: error:` line, exit 2, recorded for
the chain). scripts/lib/job_common.sh keeps the modules, the container's mpirun and its signals;
it evals what `prepare` prints:

    NODES=(...) PER_NODE NP           the hosts (one a line of HOSTFILE, with their slots) and ranks
    MAP=(...)                          where mpirun places them (export OMP_NUM_THREADS to match)
    RANK_CMD=(...)                     python, or singularity exec ... python, on every rank
    TRAIN=(...)                        the trainer (or TRAIN_SCRIPT) and its arguments
    FORWARD=(...)                      `-x NAME` for each variable the ranks need (names, never values)
    DOCTOR_RUN, EXIT_NOW               the doctor first; or the status the job ends with at once
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .. import run_folder
from ..exits import EXIT_USAGE
from . import chain, forwarding
from .schedulers import Scheduler, Site, detect_scheduler, hosts_in

# The job's settings: environment variables, or lines of the settings file submit.sh writes
# (DDP_ABCI_ENV) for every job of a chain. submit.sh carries each one that is set.
SETTINGS = {
    "CONTAINER": ".sif image, or none to run on the host's Python (default: ddp_abci.sif in the checkout)",
    "VENV": "a virtual environment made by scripts/container/make_venv.sh, whose Python the ranks run (your "
            "packages beside the image's, no rebuild)",
    "TRAIN_SCRIPT": "your own fit() script, run on every rank instead of python -m ddp_abci.train",
    "TRAIN_ARGS": "trainer arguments; submit.sh puts these first, then the ones after --",
    "CKPT_DIR": "the run folder; when set, every job resumes from it",
    "NPROC_PER_NODE": "ranks per node (default: one per GPU, else 2 on a CPU-only host)",
    "PYTHON": "the Python to run (default python3; the image's with a container)",
    "MPIRUN": "the mpirun to use (default mpirun: the host's, e.g. HPC-X's on ABCI)",
    "MPI_ARGS": "more mpirun arguments (no secret values: FORWARD_ENV forwards a variable by name)",
    "MODULES": "environment modules to load, space-separated (the job scripts' defaults: the site's MPI)",
    "IFNAME": "the network interface for rank 0's address (bond0 on ABCI 3.0); NCCL's too",
    "BINDS": "more folders to bind into the container, comma-separated",
    "FORWARD_ENV": "more variables for every rank: names or patterns (HF_* and WANDB_* always go)",
    "STOP_MARGIN_S": "seconds kept free before the walltime (default 120; a quarter of one under 8 minutes)",
    "STOP_AFTER": "seconds from the trainer's start instead of the scheduler's deadline (--stop-after)",
    "MAP_BY": "Open MPI's --map-by (default: ranks shared out per socket, bound to their own cores)",
    "SOCKETS_PER_NODE": "the node's sockets, where lscpu cannot tell",
    "CORES_PER_NODE": "the node's physical cores, where lscpu cannot tell",
    "DOCTOR": "1: python -m ddp_abci.doctor checks the allocation before training",
    "JOBS_PYTHON": "the host Python that runs this Python half (3.9 or newer, no torch; default python3)",
    "LAUNCHER": "srun: Slurm's srun --mpi=pmix starts the ranks instead of mpirun",
    "RESTARTS": "tries of training again inside one job after a fault that may mend (default 3; 0: a fault ends "
                "the job, and the chain's next job resumes)",
    "RESTART_PAUSE_S": "seconds between a try's end and the next (default 3)",
    "NODEFILE": "a file of hosts, one a line, outside a scheduler",
    "DRY_RUN": "1: print the mpirun line and exit 0, starting and writing nothing",
}
# The seed's job runs with this global batch unless the arguments give one: the trainer's own 50
# divides by no 8-rank node, 256 (the seed's job script's) by 8, 16, 32, ... ranks.
DEFAULT_BS = 256


class Refused(Exception):
    """A setting the job cannot run with: one line, exit 2."""


@dataclass(frozen=True)
class Job:
    """Who is running: the site's job script, under the scheduler it finds itself in."""

    site: Site
    scheduler: type[Scheduler] | None   # None outside a scheduler
    environ: Mapping[str, str]
    repo: str
    script: str                          # the job script's name, for its lines

    @property
    def number(self) -> str:
        job = self.scheduler.job_id(self.environ) if self.scheduler else None
        return job.split(".")[0] if job else "local"

    @property
    def dry(self) -> bool:
        return self.environ.get("DRY_RUN", "0") == "1"

    def setting(self, name: str, default: str = "") -> str:
        return self.environ.get(name) or default


def gpus_on_this_node() -> int:
    """GPUs counted (never matched by name: the seed's V100/A100 test broke on any other GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU") for line in out.splitlines())


def ranks_per_node(asked: str, said_by: str, gpus: int, allocated: int | None, otherwise: int) -> int:
    """Ranks on each node: what the user asked (-p, NPROC_PER_NODE), which must match what the
    scheduler allocated where mpirun takes its slots from it (Slurm); else the allocation; else
    one per GPU; else `otherwise`. Raises: Refused, one line."""
    if asked:
        if not asked.isdigit() or int(asked) < 1:
            raise Refused(f"{said_by}={asked} is not a positive integer")
        if allocated and allocated != int(asked):
            raise Refused(f"{said_by}={asked} but Slurm gave this job {allocated} task(s) per node: ask sbatch for "
                          f"--ntasks-per-node={asked} (or leave {said_by} out)")
        return int(asked)
    return allocated or gpus or otherwise


# -- the node ---------------------------------------------------------------------------------

def nodes(job: Job) -> list[str]:
    """The job's hosts: NODEFILE's, else the scheduler's, each once in order."""
    given = job.setting("NODEFILE")
    if given:
        if not os.access(given, os.R_OK):
            raise Refused(f"node file {given} cannot be read")
        hosts = hosts_in(given)
        if not hosts:
            raise Refused(f"node file {given} lists no hosts")
        return hosts
    hosts = job.scheduler.nodes(job.environ) if job.scheduler else []
    if not hosts:
        raise Refused("no node file: run inside a job or set NODEFILE (a file with one host per line)")
    return hosts


def topology(environ: Mapping[str, str]) -> tuple[int, int, int]:
    """(sockets, physical cores, hardware threads a core) of this node, from lscpu or
    SOCKETS_PER_NODE and CORES_PER_NODE. A scheduler counts hardware threads: ABCI 3.0's
    2 x 48-core Xeon 8558 shows 192 CPUs for 96 cores."""
    def rows(columns: str) -> list[str]:
        try:
            out = subprocess.run(["lscpu", f"-p={columns}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line for line in out.splitlines() if line and not line.startswith("#")]

    sockets = int(environ.get("SOCKETS_PER_NODE") or len(set(rows("SOCKET"))) or 1)
    cores = int(environ.get("CORES_PER_NODE") or len(set(rows("CORE,SOCKET"))) or os.cpu_count() or 1)
    threads = len(rows("CPU"))
    return max(sockets, 1), max(cores, 1), threads // cores if threads > cores else 1


def placement(job: Job, per_node: int) -> tuple[list[str], int | None]:
    """(Open MPI's mapping, threads a rank: None with MAP_BY, which leaves them to you). One rank
    per GPU, shared out over the sockets (ranks 0-3 and 4-7 of an 8-GPU node, whose GPUs hang off
    sockets 0 and 1), each bound to PE physical cores of its own socket; where the scheduler
    allocated fewer CPUs than the node has (a shared node), the cores of the allocation. A mapping
    Open MPI would refuse is never asked for."""
    if job.setting("MAP_BY"):
        return ["--map-by", job.setting("MAP_BY")], None
    sockets, cores, threads = topology(job.environ)
    cpus = job.scheduler.allocated_cpus(job.environ) if job.scheduler else None
    usable = cores
    if cpus and not job.setting("CORES_PER_NODE") and cpus // threads < cores:
        usable = cpus // threads
    if per_node % sockets == 0:
        count, unit, pe = per_node // sockets, "socket", cores // sockets // (per_node // sockets)
    else:
        count, unit, pe = per_node, "node", cores // per_node
    pe = min(pe, usable // per_node)
    if pe < 1:
        raise Refused(f"{per_node} rank(s) per node but the job has {usable} core(s) there ({sockets} socket(s), "
                      f"{cores} cores): ask for fewer ranks (-p, NPROC_PER_NODE) or set MAP_BY")
    return ["--map-by", f"ppr:{count}:{unit}:PE={pe}", "--bind-to", "core"], pe


# -- what each rank runs -------------------------------------------------------------------------

def rank_command(job: Job) -> list[str]:
    """Python directly, or through `singularity exec` in the image: the host's mpirun starts one
    per rank (ABCI's hybrid model; the image's MPI must be ABI-compatible with the host's)."""
    venv = job.setting("VENV")
    python = f"{venv}/bin/python" if venv else job.setting("PYTHON", "python3")
    container = job.setting("CONTAINER")
    if container == "none":
        if venv and not os.access(python, os.X_OK):
            raise Refused(f"VENV={venv} has no bin/python: make it with scripts/container/make_venv.sh {venv}")
        return [python]
    if not os.access(container, os.R_OK):
        raise Refused(f"container image {container} not found: build it (scripts/container/) or set CONTAINER=none")
    # Singularity refuses to bind a path that does not exist: a fresh run folder is made first.
    # TMPDIR holds Open MPI's session directory, which the ranks inside must see too.
    binds = [job.repo]
    ckpt = job.setting("CKPT_DIR")
    if ckpt:
        if not job.dry:
            try:
                Path(ckpt).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise Refused(f"cannot create CKPT_DIR={ckpt}: {e.strerror}") from None
        binds.append(os.path.realpath(ckpt))
    if job.setting("TMPDIR") and os.path.isdir(job.setting("TMPDIR")):
        binds.append(job.setting("TMPDIR"))
    if venv:
        binds.append(os.path.realpath(venv))
    binds += [b for b in job.setting("BINDS").split(",") if b]
    # PYTHONNOUSERSITE: a bound ~/.local must not shadow the image's packages (a venv is the way in).
    return ["singularity", "exec", "--nv", "--env", "PYTHONNOUSERSITE=1", "--bind", ",".join(binds), "--pwd",
            job.repo, container, python]


def trainer_command(job: Job, args: Sequence[str], deadline: Sequence[str]) -> list[str]:
    """The trainer (or TRAIN_SCRIPT) and its arguments: the settings' (IFNAME, CKPT_DIR), then
    TRAIN_ARGS and the job's own, then the deadline. The seed's job gets --bs DEFAULT_BS unless
    one is given."""
    given = [*shlex.split(job.setting("TRAIN_ARGS")), *args]
    script = job.setting("TRAIN_SCRIPT")
    if script:
        if not os.access(script, os.R_OK):
            raise Refused(f"TRAIN_SCRIPT={script} cannot be read: give the path of your fit() script")
        train = [script]
    else:
        train = ["-m", "ddp_abci.train"]
        if not any(a == "--bs" or a.startswith("--bs=") for a in given):
            train += ["--bs", str(DEFAULT_BS)]
    if job.setting("IFNAME"):
        train += ["--interface", job.setting("IFNAME")]
    if job.setting("CKPT_DIR"):
        train += ["--ckpt-dir", job.setting("CKPT_DIR"), "--resume"]
    return [*train, *given, *deadline]


def deadline_flags(job: Job, elapsed_s: float) -> list[str]:
    """--stop-after STOP_AFTER, else --stop-at the scheduler's end less STOP_MARGIN_S (a wall-clock
    time, so what runs before the trainer comes out of the job's time), else nothing."""
    if job.setting("STOP_AFTER"):
        return ["--stop-after", job.setting("STOP_AFTER")]
    margin = job.setting("STOP_MARGIN_S")
    at, line = chain.deadline(job.scheduler, job.environ, job.number, int(margin) if margin else None, elapsed_s)
    if line:
        chain.say(line)
    return ["--stop-at", f"{at:.0f}"] if at is not None else []


def exports(job: Job, threads: int | None, gpus: int) -> dict[str, str]:
    """What the job sets in its own environment for every rank: OMP_NUM_THREADS to the cores
    each rank is bound to (yours wins), NCCL's interface from IFNAME, NCCL's async error
    handling, the checkout first on PYTHONPATH (every rank imports the checkout's ddp_abci,
    wherever its script lies), and on GPUs torch's NCCL flight recorder into the run folder."""
    env, values = job.environ, {}
    if threads and not env.get("OMP_NUM_THREADS"):
        values["OMP_NUM_THREADS"] = str(threads)
    if env.get("IFNAME") and not env.get("NCCL_SOCKET_IFNAME"):
        values["NCCL_SOCKET_IFNAME"] = env["IFNAME"]
    values["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    path = env.get("PYTHONPATH", "")
    if job.repo not in path.split(":"):
        values["PYTHONPATH"] = f"{job.repo}:{path}" if path else job.repo
    ckpt = env.get("CKPT_DIR")
    if ckpt and gpus:
        # torch's NCCL flight recorder: the last collectives of each rank, dumped when NCCL's own
        # watchdog times out (names read in torch 2.13: c10d/ProcessGroupNCCL.hpp and
        # FlightRecorder.hpp, TORCH_FR_DUMP_TEMP_FILE and its older name; each rank's file is the
        # prefix and its rank). Yours win. Not run here: no GPU.
        prefix = str(run_folder.path(ckpt, run_folder.FLIGHT_RECORDER) / "rank-")
        for name, value in (("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"), ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
                            ("TORCH_FR_DUMP_TEMP_FILE", prefix), ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix)):
            values[name] = env.get(name, value)
        if not job.dry:
            run_folder.path(ckpt, run_folder.FLIGHT_RECORDER).mkdir(parents=True, exist_ok=True)
    return values


def library_copies(container: str, repo: str, job_number: str) -> str:
    """A line when the image's ddp_abci is not the checkout's (version or source), else "". The
    ranks import the checkout's (PYTHONPATH), so the image's serves only its own steps. Run once
    the modules are loaded (singularity may come with one)."""
    try:
        out = subprocess.run(["singularity", "exec", "--pwd", "/", container, "python3", "-I", "-c", IMAGE_COPY],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=120).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    ours = (version(repo), source_digest(Path(repo) / "ddp_abci"))
    if len(out) != 2 or tuple(out) == ours:
        return ""
    return (f"job {job_number}: the image's ddp_abci ({out[0]}, source {out[1]}) is not the checkout's ({ours[0]}, "
            f"source {ours[1]}): every rank imports the checkout's; rebuild the image (scripts/container/) to make "
            "them equal")


def source_digest(package: Path) -> str:
    """The first 12 hex digits of a digest of the package's .py files, by name and content."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def version(repo: str) -> str:
    found = re.search(r'__version__ = "(.+)"', (Path(repo) / "ddp_abci" / "__init__.py").read_text())
    return found[1] if found else "?"


# Run by the image's Python with -I (no PYTHONPATH, no current folder): its own installed copy.
IMAGE_COPY = """import hashlib, pathlib, ddp_abci
p = pathlib.Path(ddp_abci.__file__).parent
d = hashlib.sha256()
for f in sorted(p.rglob('*.py')):
    d.update(str(f.relative_to(p)).encode() + b'\\0' + f.read_bytes())
print(ddp_abci.__version__, d.hexdigest()[:12])"""


def clear_stale_mpi_sessions(environ: Mapping[str, str]) -> None:
    """Open MPI 5's mpirun keeps its session in $TMPDIR/ompi.PID and leaves it there when it is
    SIGKILLed; a later mpirun on this node that gets the same PID then fails at once ("The PMIx
    server's listener thread failed to start", exit 213). This user's ones whose process is gone go."""
    for folder in Path(environ.get("TMPDIR") or "/tmp").glob("ompi.[0-9]*"):
        pid = folder.name.split(".", 1)[1]
        mine = folder.is_dir() and folder.stat().st_uid == os.getuid()
        if mine and pid.isdigit() and not Path("/proc", pid).exists():
            shutil.rmtree(folder, ignore_errors=True)


# -- the whole preparation --------------------------------------------------------------------------

def prepare(site: Site, environ: Mapping[str, str], repo: str, script: str, hostfile: str, args: Sequence[str],
            elapsed_s: float = 0.0) -> tuple[int | None, dict[str, list[str] | str]]:
    """Everything decided before mpirun: (None, the values job_common.sh takes), or (status, {})
    when the job ends at once (a chain's verdict). Raises: Refused."""
    job = Job(site, detect_scheduler(environ) or site.scheduler, environ, repo, script)
    ckpt, chain_id = job.setting("CKPT_DIR"), job.setting("CHAIN_ID")
    if chain_id and ckpt:
        status, line = chain.verdict(ckpt, chain_id, job.number)
        if line:
            chain.say(line)
        if status is not None:
            return status, {}
    hosts = nodes(job)
    nhosts = job.setting("NHOSTS")
    if job.scheduler is not None and job.scheduler.name == "grid-engine" and nhosts and nhosts != str(len(hosts)):
        raise Refused(f"NHOSTS={nhosts} but the job's node list names {len(hosts)} host(s)")
    gpus = gpus_on_this_node()
    allocated = job.scheduler.allocated_ranks(environ) if job.scheduler else None
    per_node = ranks_per_node(job.setting("NPROC_PER_NODE"), "NPROC_PER_NODE", gpus, allocated, 2)
    if gpus and per_node > gpus:
        raise Refused(f"{per_node} rank(s) per node but this node has {gpus} GPU(s), and each rank takes one: ask for "
                      f"at most {gpus} (submit.sh -p, NPROC_PER_NODE, sbatch --ntasks-per-node)")
    if gpus > per_node:
        chain.say(f"{script}: {gpus} GPUs on this node and {per_node} rank(s) per node; each rank takes one GPU: ask "
                  f"for one rank per GPU (submit.sh -p {gpus}, NPROC_PER_NODE) to use them all")
    mapping, threads = placement(job, per_node)
    rank_cmd = rank_command(job)
    train = trainer_command(job, args, deadline_flags(job, elapsed_s))
    values = exports(job, threads, gpus)
    forward = forwarding.mpirun_flags({**environ, **values}, job.setting("FORWARD_ENV"), also=("PYTHONPATH",))
    Path(hostfile).write_text("".join(f"{host} slots={per_node}\n" for host in hosts))
    doctor = job.setting("DOCTOR") == "1" or (bool(job.setting("DOCTOR_FIRST")) and not (
        ckpt and run_folder.path(ckpt, run_folder.STATUS).exists()))
    if not job.dry:
        clear_stale_mpi_sessions(environ)
    chain.say(f"job {job.number}: {len(hosts)} node(s) x {per_node} rank(s) = {len(hosts) * per_node}, container "
              f"{job.setting('CONTAINER')}, {values.get('OMP_NUM_THREADS') or environ.get('OMP_NUM_THREADS') or '?'} "
              "thread(s) per rank")
    return None, {"JOB_NUM": job.number, "NODES": hosts, "PER_NODE": str(per_node), "NP": str(len(hosts) * per_node),
                  "MAP": mapping, "RANK_CMD": rank_cmd, "TRAIN": train, "FORWARD": forward,
                  "DOCTOR_RUN": "1" if doctor else "", "EXPORTS": values}


def shell(values: Mapping[str, object]) -> str:
    """The values as bash assignments: lists as arrays, EXPORTS as `export` lines."""
    out = []
    for name, value in values.items():
        if name == "EXPORTS":
            out += [f"export {key}={shlex.quote(v)}" for key, v in value.items()]  # type: ignore[union-attr]
        elif isinstance(value, list):
            out.append(f"{name}=({' '.join(shlex.quote(v) for v in value)})")
        else:
            out.append(f"{name}={shlex.quote(str(value))}")
    return "\n".join(out) + "\n"


def refuse(script: str, environ: Mapping[str, str], line: str) -> int:
    """A refusal said in one line and recorded in CKPT_DIR/status (not in a dry run): the chain's
    next jobs then stop at once, where each would take its nodes to fail the same way."""
    said = f"{script}: error: {line}"
    print(said, file=sys.stderr, flush=True)
    ckpt = environ.get("CKPT_DIR")
    if ckpt and environ.get("DRY_RUN", "0") != "1":
        with contextlib.suppress(OSError):
            chain.record(ckpt, EXIT_USAGE, said, environ.get("CHAIN_ID", ""))
    return EXIT_USAGE
