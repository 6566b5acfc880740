"""Stand-ins for an ABCI 3.0 or Slurm login node's commands, for running the documented
commands as written (tests/test_docs_commands.py). Linked under each command's name; what it
does depends on the name it was called by:

    qsub      -I: an interactive job (the commands typed next run "inside" it: the test's
              environment has PBS_O_WORKDIR and PBS_LOCALDIR); otherwise runs the job script
              as PBS Professional would (PBS_JOBID, PBS_NODEFILE with M lines per host of
              `-l select=N:mpiprocs=M`, `-v` settings), or as Grid Engine would for train_abci2.sh (JOB_ID,
              SGE_JOB_HOSTLIST, NHOSTS from `-l rt_AF=N`)
    sbatch    runs the job script as Slurm would (SLURM_JOB_ID, SLURM_JOB_NODELIST from -N,
              the tasks per node asked for)
    qstat     -f ID: PBS Professional's layout with the walltime qsub was given
    squeue    %L: the walltime sbatch was given
    scontrol  show hostnames: node1, node2, ...
    singularity exec      runs the command inside "the image" as this Python (its python3, with
                          --env and --pwd as given); anything else: says what it was asked
    module                says what it was asked and succeeds
    lscpu, nvidia-smi     an ABCI 3.0 node: 2 sockets x 48 cores x 2 threads, 8 H200s

The job script itself runs for real: DRY_RUN=1 in the environment makes it print its mpirun line.
"""
import os
import subprocess
import sys
from pathlib import Path

SOCKETS, CORES_PER_SOCKET, THREADS, GPUS = 2, 48, 2, 8


def option(args: list[str], flag: str, default: str | None = None) -> str | None:
    """The value after `flag`, or of `flag=value`; -l options by their resource name."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == "-l" and i + 1 < len(args) and args[i + 1].startswith(flag + "="):
            return args[i + 1].split("=", 1)[1]
    return default


def hosts_file(n: int, slots: int) -> str:
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"standin-nodes-{os.getpid()}"
    path.write_text("".join(f"node{h}\n" * slots for h in range(1, n + 1)))
    return str(path)


def settings(args: list[str]) -> dict[str, str]:
    """qsub -v A=1,B=2 (split at every comma, as qsub does)."""
    listed = option(args, "-v")
    return dict(item.split("=", 1) for item in listed.split(",") if "=" in item) if listed else {}


def run_job(script: str, env: dict[str, str], args: list[str]) -> int:
    env = {**os.environ, **env}
    print(f"{Path(sys.argv[0]).name} (stand-in): job {env.get('PBS_JOBID') or env.get('JOB_ID') or env['SLURM_JOB_ID']}"
          f" runs {script}", flush=True)
    return subprocess.run(["bash", script, *args], env=env).returncode


def qsub(args: list[str]) -> int:
    if "-I" in args:
        print("qsub (stand-in): an interactive job has started; what follows runs inside it")
        return 0
    script, walltime = args[-1], option(args, "walltime") or option(args, "h_rt") or "01:00:00"
    if script.endswith("train_abci2.sh"):
        nodes = int(option(args, "rt_AF") or option(args, "rt_F") or 1)
        job = {"JOB_ID": "5678", "SGE_JOB_HOSTLIST": hosts_file(nodes, 1), "NHOSTS": str(nodes)}
    else:
        chunks = dict(part.split("=") for part in (option(args, "select") or "1").split(":")[1:])
        nodes = int((option(args, "select") or "1").split(":")[0])
        job = {"PBS_JOBID": "1234.pbs1", "PBS_NODEFILE": hosts_file(nodes, int(chunks.get("mpiprocs", 1))),
               "NCPUS": "192"}
    return run_job(script, {**job, "STANDIN_WALLTIME": walltime, **settings(args)}, [])


def sbatch(args: list[str]) -> int:
    script = next(a for a in args if a.endswith((".sbatch", ".sh")))
    nodes = int(option(args, "-N") or 1)
    tasks = option(args, "--ntasks-per-node") or (option(args, "--gpus-per-node") if "--ntasks-per-gpu=1" in args
                                                   else "1")
    job = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": f"node[1-{nodes}]", "SLURM_NTASKS_PER_NODE": tasks,
           "STANDIN_WALLTIME": option(args, "-t") or "01:00:00"}
    return run_job(script, job, args[args.index(script) + 1:])


def main() -> int:
    name, args = Path(sys.argv[0]).name, sys.argv[1:]
    walltime = os.environ.get("STANDIN_WALLTIME", "01:00:00")
    if name == "qsub":
        return qsub(args)
    if name == "sbatch":
        return sbatch(args)
    if name == "qstat" and args[:1] == ["-f"]:
        print(f"Job Id: {args[1]}\n    resources_used.walltime = 00:00:05\n    Resource_List.walltime = {walltime}")
    elif name == "squeue":
        print(walltime)
    elif name == "scontrol" and args[:2] == ["show", "hostnames"]:
        print("\n".join(f"node{h}" for h in range(1, int(args[2].split("-")[1].rstrip("]")) + 1)))
    elif name == "lscpu":
        cpus = [(s * CORES_PER_SOCKET + c, s) for s in range(SOCKETS) for c in range(CORES_PER_SOCKET)] * THREADS
        column = {"-p=SOCKET": lambda core, s: s, "-p=CORE,SOCKET": lambda core, s: f"{core},{s}"}.get(args[0])
        print("# The following is the parsable format")
        print("\n".join(str(column(*c) if column else i) for i, c in enumerate(cpus)))
    elif name == "nvidia-smi":
        print("\n".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})" for i in range(GPUS)))
    elif name == "singularity" and args[:1] == ["exec"]:
        return singularity_exec(args[1:])
    else:  # module, singularity's other verbs
        print(f"{name} (stand-in): {' '.join(args)}")
    return 0


def singularity_exec(args: list[str]) -> int:
    """`singularity exec [OPTIONS] IMAGE COMMAND...` with this Python as the image's python3."""
    env, cwd = dict(os.environ), None
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag in ("--nv", "--cleanenv"):
            continue
        value = args.pop(0)
        if flag == "--env":
            env.update([value.split("=", 1)])
        elif flag == "--pwd":
            cwd = value
    command = args[1:]  # after the image
    if command[:1] in (["python3"], ["python"]):
        command[0] = sys.executable
    return subprocess.run(command, env=env, cwd=cwd).returncode


if __name__ == "__main__":
    sys.exit(main())
