"""The job scripts under a real Slurm (Debian's slurm-wlm 22.05, two nodes in network
namespaces: tests/slurm_lab.py), driven only through sbatch, squeue, scancel and scontrol,
never by calling a script directly."""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from slurm_lab import SlurmLab

from helpers import MPIRUN, PYTHON, REPO, YIELDING_MPI, job_story, load, same_tensors

VENV_BIN = os.path.dirname(PYTHON)
# What a site's module setup gives a job here: no container, the venv, and one thread a rank (both
# "nodes" share this machine's 2 cores); site() adds MPI's TCP on the lab's network.
SITE = dict(CONTAINER="none", PYTHON=PYTHON, MPIRUN=MPIRUN, PATH=f"{VENV_BIN}:{os.environ['PATH']}",
            OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1", MAP_BY="ppr:1:node",
            **YIELDING_MPI)
HEADER = ["-N", "2", "-t", "00:03:00", "--signal=B:USR1@60"]  # the header's line, less account and GPUs
SMALL = ["--num-items", "4000", "--seed", "3", "--bs", "50"]  # 80 steps an epoch


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


def site(lab: SlurmLab) -> dict[str, str]:
    return dict(SITE, MPI_ARGS=f"--mca btl self,sm,tcp --mca btl_tcp_if_include {lab.net} "
                               f"--prtemca oob_tcp_if_include {lab.net} --bind-to none")


def submit(lab, out, *args, **settings):
    """sbatch from the repo root (where the scripts find the checkout), the output to `out`."""
    return lab.sbatch(f"--output={out}", f"--chdir={REPO}", *args, **{**site(lab), **settings})


@pytest.fixture(scope="module")
def header_job(slurm, tmp_path_factory):
    d = tmp_path_factory.mktemp("header")
    job = submit(slurm, d / "out", *HEADER, "scripts/slurm/train.sbatch", "--epochs", "2", *SMALL,
                 CKPT_DIR=str(d / "ck"))  # saves, as the chain's jobs
    return slurm.wait(job, 180), (d / "out").read_text()


def test_the_header_line_trains_two_ranks_across_two_nodes_to_done(header_job):
    info, out = header_job
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", out
    assert "2 node(s) x 1 rank(s) = 2" in out and "world size 2 (local 1)" in out, out
    assert "done: 160 steps" in out and "replicas agree" in out


FIT_SCRIPT = str(REPO / "ddp_abci" / "examples" / "own_model.py")  # a user's own fit() script: TRAIN_SCRIPT
FOUR = dict(MAP_BY="ppr:2:node")  # 2 ranks a node, on the lab's 2 cores a node


@pytest.fixture(scope="module")
def chain(slurm, tmp_path_factory):
    """A fit() script's --max-steps run sized to need two or three 1-minute walltimes, through
    submit.sh slurm -n 2 -p 2 -c 4 (4 ranks in every job), and the same run uninterrupted."""
    d = tmp_path_factory.mktemp("chain")
    # --comm pinned, the same in the probe that sizes the chain: the chain keeps the path its first
    # job measured, and the run it is compared with must take the same one (the paths sum in
    # different orders, and run at different speeds: docs/benchmark.md)
    comm = ["--comm", "mpi"]
    # A job of -t 1:00 trains until its --stop-after, 60 s - 44 s of margin (the job then ends early and the
    # next starts: the chain takes less of the suite's time), less its start-up and its save. The probe is
    # such a job: the steps it holds are measured, start-up and load included. (Sized instead from a short
    # run's samples/s and start-up, the chain's jobs held a half to a third of the estimate, and once, on
    # CI, the three after the first did not end the run.)
    stop = dict(STOP_MARGIN_S="44", TRAIN_SCRIPT=FIT_SCRIPT, **FOUR)
    probe = submit(slurm, d / "probe.out", "-N", "2", "--ntasks-per-node=2", "-t", "00:01:00",
                   "scripts/slurm/train.sbatch", "--epochs", "100000", *comm, CKPT_DIR=str(d / "probe"), **stop)
    assert slurm.wait(probe, 120)["ExitCode"] == "75:0", (d / "probe.out").read_text()
    held = load(d / "probe" / "last.pt")["step"]
    # Two jobs: the first stops on its deadline unless it trains twice as fast as the probe did (the
    # two can run beside different loads in the suite's other lane), and the job left is ended by
    # one at the probe's pace, or by the four left at a quarter of it. (With three left, a fresh
    # clone's chain once fell short: 472, 144, 240 and 240 steps of 1,168 after a probe of 584.
    # At 1.5 probes, a first job ended the run alone after a probe slowed to 72 steps.) A run done
    # ends the chain: the jobs it does not need start and end at once.
    max_steps = 2 * held
    args = ["--epochs", "100000", "--max-steps", str(max_steps), *comm]
    out = slurm.run(str(REPO / "scripts" / "submit.sh"), "slurm", "-n", "2", "-p", "2", "-t", "1m", "-c", "5", "--",
                    *args, **{**site(slurm), **stop}, CKPT_DIR=str(d / "ck"), SUBMIT_DIR=str(d / "submit"),
                    SBATCH_OUTPUT=str(d / "job-%j.out"))
    ids = [int(line) for line in out.stdout.splitlines() if line.isdigit()]  # the job ids: one a line
    assert out.returncode == 0 and len(ids) == 5, out.stdout
    infos = [slurm.wait(job, 240) for job in ids]
    whole = submit(slurm, d / "whole.out", "-N", "2", "--ntasks-per-node=2", "-t", "00:10:00",
                   "scripts/slurm/train.sbatch", *args, TRAIN_SCRIPT=FIT_SCRIPT, CKPT_DIR=str(d / "whole"), **FOUR)
    slurm.wait(whole, 300)
    return {"ids": ids, "infos": infos, "outs": [(d / f"job-{j}.out").read_text() for j in ids], "dir": d,
            "max_steps": max_steps, "held": held}


def test_a_run_longer_than_its_walltime_stops_on_its_own_deadline_from_squeue_with_75(chain):
    info, out = chain["infos"][0], chain["outs"][0]
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "75:0", (info, out)  # scontrol keeps the 75
    assert "s of walltime left; the trainer stops, saves and exits 75 within" in out  # from the real squeue %L
    assert "stopped on the --stop-after deadline" in out and "resubmit with the same CKPT_DIR" in out
    assert "SIGUSR1" not in out and "CANCELLED" not in info["JobState"]  # before Slurm's signal and kill


def test_a_chain_of_jobs_of_four_ranks_carries_a_fit_script_to_the_uninterrupted_weights(chain):
    outs, d = chain["outs"], chain["dir"]
    done = next((i for i, out in enumerate(outs) if "done: " in out), None)
    assert done is not None, f"{chain['max_steps']} steps, {chain['held']} a probe job:\n{job_story(outs)}"
    assert done >= 1 and all("resume: " in out for out in outs[1:done + 1]), outs
    assert all("2 node(s) x 2 rank(s) = 4" in out and "world size 4 (local 2)" in out for out in outs[:done + 1])
    for out, info in zip(outs[done + 1:], chain["infos"][done + 1:], strict=True):  # the rest find it finished
        assert "is finished" in out and "nothing to train" in out and "world size" not in out, out
        assert info["ExitCode"] == "0:0"
    resumed, whole = load(d / "ck" / "last.pt"), load(d / "whole" / "last.pt")
    assert resumed["step"] == whole["step"] == chain["max_steps"]
    assert same_tensors(resumed["model"], whole["model"])  # bit for bit


LOST = ["--epochs", "1", "--num-items", "400000", "--seed", "3", "--bs", "50", "--max-steps", "750", "--comm", "mpi",
        "--save-every-steps", "50", "--timeout", "6"]  # 8000 steps an epoch: every stop is mid-epoch


@pytest.fixture(scope="module")
def uninterrupted(slurm, tmp_path_factory):
    d = tmp_path_factory.mktemp("whole")
    job = submit(slurm, d / "out", "-N", "2", "-t", "00:05:00", "scripts/slurm/train.sbatch", *LOST,
                 CKPT_DIR=str(d / "ck"))
    assert slurm.wait(job, 240)["ExitCode"] == "0:0", (d / "out").read_text()
    return load(d / "ck" / "last.pt")


def _ranks_on(slurm, node: str) -> list[int]:
    pids = subprocess.run(["ip", "netns", "pids", slurm.ns[node]], stdout=subprocess.PIPE, text=True).stdout.split()
    return [int(p) for p in pids if b"ddp_abci.train" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.mark.parametrize("failure", ["a node that hangs", "scancel --signal=KILL"])
def test_a_chain_survives_a_lost_node_from_its_last_step_checkpoint_bit_for_bit(slurm, uninterrupted, tmp_path,
                                                                                  failure):
    # RESTARTS=0: the chain's own recovery (in-job restarts, which would go on without h2 in a
    # smaller world, are tested under PBS: test_pbs.py).
    out = slurm.run(str(REPO / "scripts" / "submit.sh"), "slurm", "-n", "2", "-t", "2m", "-c", "2", "--", *LOST,
                    **site(slurm), CKPT_DIR=str(tmp_path / "ck"), SUBMIT_DIR=str(tmp_path / "submit"),
                    SBATCH_OUTPUT=str(tmp_path / "job-%j.out"), RESTARTS="0")
    first, second = (int(line) for line in out.stdout.splitlines() if line.isdigit())
    log = tmp_path / f"job-{first}.out"
    deadline = time.monotonic() + 120
    while not log.exists() or "checkpoint: step 250 " not in log.read_text():
        assert time.monotonic() < deadline, (slurm.job(first), log.exists() and log.read_text())
        time.sleep(0.2)
    if failure == "a node that hangs":  # every rank of h2 stopped, as a node stuck on its file system
        for pid in _ranks_on(slurm, "h2"):
            os.kill(pid, signal.SIGSTOP)
    else:
        slurm.run("scancel", "--signal=KILL", str(first))
    info = slurm.wait(first, 60)
    slurm.wait(second, 180)
    one, two = log.read_text(), (tmp_path / f"job-{second}.out").read_text()
    if failure == "a node that hangs":
        assert info["ExitCode"] == "69:0", (info, one)
        assert "error: rank 1 (host h2) stopped answering" in one, one
    resumed_at = int(re.search(r"resume: \S+ at epoch 0, batch \d+, step (\d+)", two)[1])
    assert resumed_at >= 250, two  # a step checkpoint, not the epoch's start
    if failure == "a node that hangs":  # a stopped peer cannot agree a stop: the last save point
        assert resumed_at % 50 == 0, two
    # scancel --signal=KILL ends the srun step that holds Open MPI's daemon on h2; mpirun may then
    # SIGTERM both ranks while they live, and they agree a stop and save where they are (seen, killed
    # at step 500: steps 584 and 592, "stopped on SIGTERM"): as whole a checkpoint as a save point's.
    end = load(tmp_path / "ck" / "last.pt")
    assert end["step"] == uninterrupted["step"] == 750 and same_tensors(end["model"], uninterrupted["model"])


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
