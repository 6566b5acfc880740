"""One class per batch scheduler, everything the project knows of it in one place: how a job
is recognised, its id, its node list, what it allocated, the time it has left, the states of
queued and finished jobs, the submit line and its dependency, and leaving hosts out of a
queued job. Sites are named configurations of them (SITES): `abci3` is PBS Professional with
ABCI 3.0's queue and nodes, `abci2` Grid Engine with ABCI 2.0's resource types, `slurm` any
Slurm cluster. Adding a scheduler is one class here, one entry in SCHEDULERS, and its tests.

The launch environments (environments/schedulers.py) take detection, the job number and the
first host from these classes; the job scripts' Python half (job.py), submit.sh's
(submission.py), the chain's rules (chain.py) and the status command ask them the rest.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from .walltime import hms, slurm_time, to_seconds


def ask(*cmd: str, timeout: float = 30) -> str:
    """A scheduler command's output, or "" when it is missing, fails to start or hangs."""
    try:
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def hosts_in(path: str | None, column: int = 0) -> list[str]:
    """The hosts a node file lists, each once, in its order (PBS and Grid Engine repeat a
    host once per slot); [] when there is no such file."""
    if not path:
        return []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    hosts = [line.split()[column] for line in lines if len(line.split()) > column]
    return list(dict.fromkeys(hosts))


@dataclass(frozen=True)
class Request:
    """One job to submit: what every scheduler's submit line is made of."""

    group: str                  # ABCI group (qsub -P / -g) or Slurm account (-A); "" for none
    nodes: int
    per_node: int               # ranks (MPI slots) on each node
    walltime_s: int
    margin_s: int               # kept free before the walltime: the trainer stops, saves, exits 75
    settings_file: str          # the settings the job sources (DDP_ABCI_ENV)
    script: str                 # the job script, relative to the checkout
    resource: str = ""          # the site's resource type (Grid Engine's rt_AF, rt_F)
    queue: str = ""             # the site's queue (PBS's rt_HF)
    gpus_per_node: int = 0      # Slurm: --gpus-per-node (0: not asked)
    log_dir: str = ""           # where the scheduler writes the job's output ("" : its default)


class Scheduler:
    """A batch scheduler. Subclasses set the class variables and define what differs."""

    name: ClassVar[str] = ""
    job_variable: ClassVar[str] = ""          # the variable holding the job's id inside a job
    cancel: ClassVar[str] = ""                # the command that cancels jobs by id
    can_exclude_hosts: ClassVar[bool] = False  # whether a queued job can be told to avoid hosts

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether this process runs inside a job of this scheduler."""
        return bool(environ.get(cls.job_variable))

    @classmethod
    def job_id(cls, environ: Mapping[str, str]) -> str | None:
        return environ.get(cls.job_variable) or None

    @classmethod
    def job_number(cls, environ: Mapping[str, str]) -> int | None:
        """The job id's number: '1234.pbs1' (PBS), '1234[5].pbs1' (a PBS array job), '1234'."""
        digits = (cls.job_id(environ) or "").split(".")[0].split("[")[0]
        return int(digits) if digits.isdigit() else None

    @classmethod
    def nodes(cls, environ: Mapping[str, str]) -> list[str]:
        """The job's hosts, each once, in the scheduler's order (rank 0's first); [] when it names none."""
        return []

    @classmethod
    def first_host(cls, environ: Mapping[str, str]) -> str | None:
        hosts = cls.nodes(environ)
        return hosts[0] if hosts else None

    @classmethod
    def allocated_cpus(cls, environ: Mapping[str, str]) -> int | None:
        """Hardware threads the job holds on this node, where the scheduler says (a shared node)."""
        return None

    @classmethod
    def allocated_ranks(cls, environ: Mapping[str, str]) -> int | None:
        """Ranks (tasks) a node was allocated, where mpirun takes its slots from the scheduler."""
        return None

    @classmethod
    def walltime_left(cls, environ: Mapping[str, str], elapsed_s: float = 0.0) -> int | None:
        """Seconds before the scheduler ends this job, from the scheduler itself, or None."""
        return None

    @classmethod
    def job_states(cls, ids: Sequence[str]) -> dict[str, str]:
        """Each job's state (queued, held, running, finished (exit N), unknown), as the scheduler says."""
        return {job: "unknown" for job in ids}

    @classmethod
    def submit_command(cls, request: Request, after: str | None) -> list[str]:
        """The command that submits `request`, held until job `after` ends (whatever its exit)."""
        raise NotImplementedError

    @classmethod
    def submitted_id(cls, output: str) -> str:
        """The job id from the submit command's output."""
        return output.strip().splitlines()[-1].strip() if output.strip() else ""

    @classmethod
    def exclude_hosts(cls, job_id: str, hosts: Sequence[str]) -> bool:
        """Tell the queued job `job_id` to avoid `hosts`; False where the scheduler cannot."""
        return False

    @classmethod
    def command(cls, name: str) -> str:
        """The path of one of the scheduler's own commands, for a job's and the status command's
        queries (its name, found on PATH). A submit line uses the name on the user's PATH."""
        return name


class PBS(Scheduler):
    """PBS Professional and OpenPBS (ABCI 3.0): PBS_JOBID ('1234.pbs1'), PBS_NODEFILE with one line
    per MPI slot, NCPUS; qstat -f for the walltime, -W depend=afterany for chains. A queued job
    cannot be told to avoid a host."""

    name = "pbs"
    job_variable = "PBS_JOBID"
    cancel = "qdel"

    @classmethod
    def nodes(cls, environ: Mapping[str, str]) -> list[str]:
        return hosts_in(environ.get("PBS_NODEFILE"))

    @classmethod
    def allocated_cpus(cls, environ: Mapping[str, str]) -> int | None:
        return _number(environ.get("NCPUS")) if cls.detect(environ) else None

    @classmethod
    def walltime_left(cls, environ: Mapping[str, str], elapsed_s: float = 0.0) -> int | None:
        """Resource_List.walltime less resources_used.walltime, from qstat -f."""
        if not cls.job_id(environ):
            return None
        info = ask(cls.command("qstat"), "-f", environ[cls.job_variable])
        limit = re.search(r"Resource_List\.walltime = (\S+)", info)
        used = re.search(r"resources_used\.walltime = (\S+)", info)
        return to_seconds(limit[1]) - (to_seconds(used[1]) if used else 0) if limit else None

    @classmethod
    def job_states(cls, ids: Sequence[str]) -> dict[str, str]:
        # One job a call: OpenPBS 23.06's `qstat -x -f -F json A B` lists A alone.
        return {job: cls._state(cls._job(job)) for job in ids}

    @classmethod
    def _job(cls, job: str) -> dict | None:
        try:
            return json.loads(ask(cls.command("qstat"), "-x", "-f", "-F", "json", job)).get("Jobs", {}).get(job)
        except ValueError:
            return None

    @staticmethod
    def _state(info: dict | None) -> str:
        if not info:
            return "unknown"
        names = {"Q": "queued", "H": "held", "R": "running", "E": "exiting", "F": "finished"}
        state = names.get(info.get("job_state", ""), "unknown")
        return f"{state} (exit {info['Exit_status']})" if state == "finished" and "Exit_status" in info else state

    @classmethod
    def submit_command(cls, request: Request, after: str | None) -> list[str]:
        # select=N:mpiprocs=P: Open MPI inside a PBS job takes its slots from PBS_NODEFILE, one a
        # line, i.e. per mpiprocs (with select=N alone, one a node: "not enough slots" for 2 ranks).
        cmd = ["qsub", "-P", request.group, "-q", request.queue, "-l",
               f"select={request.nodes}:mpiprocs={request.per_node}", "-l", f"walltime={hms(request.walltime_s)}"]
        if after:
            cmd += ["-W", f"depend=afterany:{after}"]
        if request.log_dir:
            cmd += ["-o", f"{request.log_dir}/"]
        return cmd + ["-v", f"DDP_ABCI_ENV={request.settings_file}", request.script]

    @classmethod
    def command(cls, name: str, conf: str | None = None) -> str:
        """Where /etc/pbs.conf says PBS lives: a PBS job's PATH puts /opt/pbs/bin last, and another
        scheduler's qstat may come first."""
        try:
            text = Path(conf or os.environ.get("PBS_CONF_FILE", "/etc/pbs.conf")).read_text()
        except OSError:
            return name
        found = re.search(r"^PBS_EXEC=(.*)$", text, re.M)
        path = Path(found[1].strip()) / "bin" / name if found else None
        return str(path) if path is not None and os.access(path, os.X_OK) else name


class GridEngine(Scheduler):
    """Grid Engine (ABCI 2.0, Son of Grid Engine): JOB_ID with SGE_ROOT or a parallel environment's
    PE_HOSTFILE ("host slots queue processors" lines), ABCI's SGE_JOB_HOSTLIST (a host a line);
    qstat -j for the limits (s_rt, where SIGUSR1 comes, else h_rt), -hold_jid for chains."""

    name = "grid-engine"
    job_variable = "JOB_ID"
    cancel = "qdel"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        # JOB_ID alone is too common a name to mean Grid Engine.
        return "JOB_ID" in environ and any(v in environ for v in ("SGE_ROOT", "PE_HOSTFILE", "SGE_JOB_HOSTLIST"))

    @classmethod
    def nodes(cls, environ: Mapping[str, str]) -> list[str]:
        listed = hosts_in(environ.get("SGE_JOB_HOSTLIST")) or hosts_in(environ.get("PE_HOSTFILE"))
        if listed or not environ.get("JOB_ID"):
            return listed
        return [socket.gethostname()]  # a job without a parallel environment runs on its own host

    @classmethod
    def walltime_left(cls, environ: Mapping[str, str], elapsed_s: float = 0.0) -> int | None:
        """qstat -j's s_rt, else h_rt (seconds, whatever the submit line's form), less the job's time so far."""
        if not cls.job_id(environ):
            return None
        info = next((line for line in ask("qstat", "-j", environ["JOB_ID"]).splitlines()
                     if "hard resource_list" in line), "")
        limit = re.search(r"s_rt=([\d:]+)", info) or re.search(r"h_rt=([\d:]+)", info)
        return int(to_seconds(limit[1]) - elapsed_s) if limit else None

    @classmethod
    def job_states(cls, ids: Sequence[str]) -> dict[str, str]:
        out = ask("qstat")  # a job it no longer lists has ended
        listed = {line.split()[0]: line.split()[4] for line in out.splitlines()[2:] if len(line.split()) > 4}
        names = {"r": "running", "qw": "queued", "hqw": "held", "t": "running"}
        return {job: names.get(listed[job], listed[job]) if job in listed else ("finished" if out else "unknown")
                for job in ids}

    @classmethod
    def submit_command(cls, request: Request, after: str | None) -> list[str]:
        # rt_AF=N / rt_F=N: N whole nodes. s_rt before h_rt: SIGUSR1 there, where h_rt alone
        # would SIGKILL unannounced.
        cmd = ["qsub", "-terse", "-g", request.group, "-l", f"{request.resource}={request.nodes}", "-l",
               f"h_rt={hms(request.walltime_s)}", "-l", f"s_rt={request.walltime_s - request.margin_s}"]
        if after:
            cmd += ["-hold_jid", after]
        if request.log_dir:
            cmd += ["-o", f"{request.log_dir}/"]
        return cmd + ["-v", f"DDP_ABCI_ENV={request.settings_file}", request.script]


class Slurm(Scheduler):
    """Slurm: SLURM_JOB_ID, SLURM_JOB_NODELIST ('h[1-2]'), the tasks it allocated per node (mpirun
    takes its slots from them), squeue's %L for the time left, --dependency=afterany for chains,
    and a queued job told to avoid hosts (scontrol update ExcNodeList)."""

    name = "slurm"
    job_variable = "SLURM_JOB_ID"
    cancel = "scancel"
    can_exclude_hosts = True

    @classmethod
    def nodes(cls, environ: Mapping[str, str]) -> list[str]:
        listed = environ.get("SLURM_JOB_NODELIST")
        return expand_hostlist(listed) if listed else []

    @classmethod
    def allocated_cpus(cls, environ: Mapping[str, str]) -> int | None:
        return _number(environ.get("SLURM_CPUS_ON_NODE"))

    @classmethod
    def allocated_ranks(cls, environ: Mapping[str, str]) -> int | None:
        if not cls.detect(environ):
            return None
        tasks = environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or ""
        return _number(re.split(r"[(,]", tasks)[0])  # "2(x2)" or "2,1": the first node's

    @classmethod
    def walltime_left(cls, environ: Mapping[str, str], elapsed_s: float = 0.0) -> int | None:
        if not cls.job_id(environ):
            return None
        left = ask("squeue", "-h", "-j", environ[cls.job_variable], "-o", "%L").strip()
        return to_seconds(left) if re.match(r"\d", left) else None

    @classmethod
    def job_states(cls, ids: Sequence[str]) -> dict[str, str]:
        out = ask("sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(ids))
        found = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        return {job: found.get(job, "unknown").split()[0].lower() for job in ids}

    @classmethod
    def submit_command(cls, request: Request, after: str | None) -> list[str]:
        cmd = ["sbatch", "--parsable", "-N", str(request.nodes), f"--ntasks-per-node={request.per_node}", "-t",
               slurm_time(request.walltime_s)]
        if request.gpus_per_node:
            cmd.append(f"--gpus-per-node={request.gpus_per_node}")
        # Slurm "may send the signal up to 60 seconds earlier than specified" (man sbatch, --signal):
        # asked for 60 s after the planned stop, and not at all under a minute's margin.
        if request.margin_s - 60 > 0:
            cmd.append(f"--signal=B:USR1@{request.margin_s - 60}")
        if request.group:
            cmd += ["-A", request.group]
        if after:
            cmd.append(f"--dependency=afterany:{after}")
        if request.log_dir:
            cmd.append(f"--output={request.log_dir}/slurm-%j.out")
        return cmd + [f"--export=ALL,DDP_ABCI_ENV={request.settings_file}", request.script]

    @classmethod
    def submitted_id(cls, output: str) -> str:
        return super().submitted_id(output).split(";")[0]  # --parsable: "ID;cluster"

    @classmethod
    def exclude_hosts(cls, job_id: str, hosts: Sequence[str]) -> bool:
        done = subprocess.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(hosts)}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return done.returncode == 0


SCHEDULERS: tuple[type[Scheduler], ...] = (PBS, GridEngine, Slurm)


def detect_scheduler(environ: Mapping[str, str]) -> type[Scheduler] | None:
    """The scheduler whose job this process runs in, or None outside one."""
    return next((scheduler for scheduler in SCHEDULERS if scheduler.detect(environ)), None)


def job_id(environ: Mapping[str, str]) -> str | None:
    """This process's scheduler job id ("1234.pbs1", Slurm's, Grid Engine's), or None outside a job."""
    scheduler = detect_scheduler(environ)
    return scheduler.job_id(environ) if scheduler else None


def expand_hostlist(hostlist: str) -> list[str]:
    """A Slurm host list's hosts: 'h1', 'h[1-2,5]', 'a[07-09],b1' (zero padding kept)."""
    hosts = []
    for item in re.split(r",(?![^\[]*\])", hostlist.strip()):
        match = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", item)
        if not match:
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for n in range(int(first), int(last or first) + 1):
                hosts.append(f"{prefix}{n:0{len(first)}d}{suffix}")
    return [host for host in hosts if host]


def _number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and int(text) > 0 else None


# -- sites -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Site:
    """A cluster: its scheduler, its job script, and what a node of each resource type holds."""

    name: str
    scheduler: type[Scheduler]
    job_script: str                               # relative to the checkout
    gpus: Mapping[str, int] = field(default_factory=dict)  # resource type -> GPUs a node
    resource: str = ""                            # the default resource type
    queue: str = ""
    group_needed: bool = True
    help: str = ""

    def gpus_per_node(self, resource: str | None = None, asked: int | None = None) -> int:
        """A node's GPUs: the resource type's, else what the user said (Slurm's -G), else 0."""
        return self.gpus.get(resource or self.resource, 0) or (asked or 0)


SITES: dict[str, Site] = {
    "abci3": Site("abci3", PBS, "scripts/abci/train_abci3.sh", {"rt_HF": 8}, "rt_HF", "rt_HF",
                  help="PBS Professional, ABCI 3.0"),
    "abci2": Site("abci2", GridEngine, "scripts/abci/train_abci2.sh", {"rt_AF": 8, "rt_F": 4}, "rt_AF",
                  help="Grid Engine, ABCI 2.0"),
    "slurm": Site("slurm", Slurm, "scripts/slurm/train.sbatch", group_needed=False, help="any Slurm cluster"),
}
