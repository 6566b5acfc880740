"""The job scripts under a real Slurm (Debian's slurm-wlm 22.05, two nodes in network
namespaces: tests/slurm_lab.py), driven only through sbatch, squeue, scancel and scontrol,
never by calling a script directly."""
import json
import os
import shutil
import time

import pytest
from slurm_lab import NET, SlurmLab

from helpers import MPIRUN, PYTHON, REPO, load, same_tensors

VENV_BIN = os.path.dirname(PYTHON)
# What a site's module setup gives a job here: no container, the venv, MPI's TCP on the lab's
# network, and one thread a rank (both "nodes" share this machine's 2 cores).
SITE = dict(CONTAINER="none", PYTHON=PYTHON, MPIRUN=MPIRUN, PATH=f"{VENV_BIN}:{os.environ['PATH']}",
            OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1", MAP_BY="ppr:1:node",
            MPI_ARGS=f"--mca btl self,sm,tcp --mca btl_tcp_if_include {NET} --prtemca oob_tcp_if_include {NET} "
                     "--bind-to none")
HEADER = ["-N", "2", "-t", "00:03:00", "--signal=B:USR1@60"]  # the header's line, less account and GPUs
SMALL = ["--num-items", "4000", "--seed", "3"]  # 80 steps an epoch


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    in_ci = os.environ.get("CI") == "true"
    missing = "not root" if os.geteuid() else next((d for d in ("slurmctld", "slurmd", "munged")
                                                     if not shutil.which(d)), None)
    if missing:
        (pytest.fail if in_ci else pytest.skip)(f"no Slurm here ({missing}): scripts/test.sh installs slurm-wlm and "
                                                "munge when it runs as root")
    lab = SlurmLab(tmp_path_factory.mktemp("slurm"))
    try:
        lab.up()
    except Exception as e:
        lab.down()
        (pytest.fail if in_ci else pytest.skip)(f"Slurm did not start: {e}")
    yield lab
    lab.down()


def submit(lab, out, *args, **settings):
    """sbatch from the repo root (where the scripts find the checkout), the output to `out`."""
    return lab.sbatch(f"--output={out}", f"--chdir={REPO}", *args, **SITE, **settings)


@pytest.fixture(scope="module")
def header_job(slurm, tmp_path_factory):
    d = tmp_path_factory.mktemp("header")
    job = submit(slurm, d / "out", *HEADER, "scripts/slurm/train.sbatch", "--epochs", "5", *SMALL,
                 "--summary-json", str(d / "summary.json"), CKPT_DIR=str(d / "ck"))  # saves, as the chain's jobs
    return slurm.wait(job, 180), (d / "out").read_text(), json.loads((d / "summary.json").read_text())


def test_the_header_line_trains_two_ranks_across_two_nodes_to_done(header_job):
    info, out, _ = header_job
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out
    assert "2 node(s) x 1 rank(s) = 2" in out and "world size 2 (local 1)" in out, out
    assert "done: 400 steps" in out and "replicas agree" in out


@pytest.fixture(scope="module")
def chain(slurm, header_job, tmp_path_factory):
    """A --max-steps run sized to need about two 1-minute walltimes, through submit.sh -c 3,
    and the same run uninterrupted."""
    d = tmp_path_factory.mktemp("chain")
    steps_per_s = header_job[2]["samples_per_s"] / 50
    # A job of -t 1:00 trains until its --stop-after, 60 s - 15 s of margin, less start-up.
    max_steps = int(1.5 * steps_per_s * 38)
    args = ["--epochs", "100000", *SMALL, "--max-steps", str(max_steps)]
    out = slurm.run("bash", "scripts/submit.sh", "slurm", "-n", "2", "-t", "00:01:00", "-c", "3", "--", *args,
                    **SITE, CKPT_DIR=str(d / "ck"), STOP_MARGIN_S="15", SUBMIT_DIR=str(d / "submit"),
                    SBATCH_OUTPUT=str(d / "job-%j.out"))
    ids = [int(line) for line in out.stdout.split()]
    assert out.returncode == 0 and len(ids) == 3, out.stdout
    infos = [slurm.wait(job, 200) for job in ids]
    whole = submit(slurm, d / "whole.out", "-N", "2", "-t", "00:10:00", "scripts/slurm/train.sbatch", *args,
                   CKPT_DIR=str(d / "whole"))
    slurm.wait(whole, 300)
    return {"ids": ids, "infos": infos, "outs": [(d / f"job-{j}.out").read_text() for j in ids], "dir": d,
            "max_steps": max_steps}


def test_a_run_longer_than_its_walltime_stops_on_its_own_deadline_from_squeue_with_75(chain):
    info, out = chain["infos"][0], chain["outs"][0]
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0", (info, out)  # scontrol keeps the 75
    assert "s of walltime left; the trainer stops, saves and exits 75 within" in out  # from the real squeue %L
    assert "stopped on the --stop-after deadline" in out and "resubmit with the same CKPT_DIR" in out
    assert "SIGUSR1" not in out and "CANCELLED" not in info["JobState"]  # before Slurm's signal and kill


def test_a_chain_of_jobs_carries_the_run_to_the_uninterrupted_weights(chain):
    outs, d = chain["outs"], chain["dir"]
    assert "resume: " in outs[1] and ("done: " in outs[1] or "done: " in outs[2]), outs
    assert "is finished" in outs[2] and "nothing to train" in outs[2] and "world size" not in outs[2], outs[2]
    assert chain["infos"][2]["ExitCode"] == "0:0"
    resumed, whole = load(d / "ck" / "last.pt"), load(d / "whole" / "last.pt")
    assert resumed["step"] == whole["step"] == chain["max_steps"]
    assert same_tensors(resumed["model"], whole["model"])  # bit for bit


@pytest.mark.parametrize("how", ["scancel", "scancel --signal=USR1 --batch"])
def test_cancelling_a_running_job_stops_it_with_a_checkpoint(slurm, tmp_path, how):
    job = submit(slurm, tmp_path / "out", *HEADER, "scripts/slurm/train.sbatch", "--epochs", "100000", *SMALL,
                 CKPT_DIR=str(tmp_path / "ck"))
    slurm.wait_running(job)
    deadline = time.monotonic() + 60
    log = tmp_path / "out"
    while not log.exists() or "epoch 2/" not in log.read_text():  # the job creates it when it starts
        assert time.monotonic() < deadline, slurm.job(job)
        time.sleep(0.3)
    slurm.run(*how.split(), str(job))
    info = slurm.wait(job, 60)
    out = (tmp_path / "out").read_text()
    state = load(tmp_path / "ck" / "last.pt")  # whole: it loads
    assert state["step"] > 0, (info, out)
    if how == "scancel":
        # Slurm sends SIGTERM to every process of the job: the ranks stop and save on it, while
        # mpirun, signalled too, kills them half a second later, so the checkpoint on disk is the
        # stop's or the last epoch's, whole either way (docs/abci.md).
        assert info["JobState"] == "CANCELLED", info
    else:  # the batch shell alone: it forwards USR1 to mpirun, which forwards it to the ranks
        assert "stopped on SIGUSR1" in out and info["ExitCode"] == "75:0", (info, out)
        # The stop's own checkpoint: at the step the stop line names. (Not "mid-epoch": the ranks
        # agree every 8 steps of an 80-step epoch, so one stop in ten lands on an epoch's end.)
        assert f"(step {state['step']}); checkpoint" in out, (state["step"], out)
