"""The ABCI 2.0 job script under a real Grid Engine (Son of Grid Engine 8.1.9 from Debian, one
host with 2 slots: tests/grid_engine_lab.py), driven through qsub, qstat and qacct, and a chain
of jobs held one behind the other (-hold_jid)."""
import json
import os

import pytest
from grid_engine_lab import GridEngineLab

from helpers import MPIRUN, PYTHON, YIELDING_MPI, job_story, load, same_tensors

VENV_BIN = os.path.dirname(PYTHON)
SITE = dict(CONTAINER="none", PYTHON=PYTHON, MPIRUN=MPIRUN, OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl="self,sm,tcp", **YIELDING_MPI)
# 80 steps an epoch (the job scripts' default --bs is 256); --comm pinned: runs compared bit for
# bit must take the same all-reduce, which --comm auto would measure afresh in each
SMALL = ["--num-items", "4000", "--seed", "3", "--bs", "50", "--comm", "mpi"]


@pytest.fixture(scope="module")
def grid_engine(tmp_path_factory):
    in_ci = os.environ.get("CI") == "true"
    missing = "not root" if os.geteuid() else next((d for d in ("/usr/sbin/sge_qmaster", "/usr/sbin/sge_execd")
                                                     if not os.path.exists(d)), None)
    if missing:
        (pytest.fail if in_ci else pytest.skip)(f"no Grid Engine here ({missing}): scripts/test.sh installs "
                                                "gridengine-master, -exec and -client when it runs as root")
    root = tmp_path_factory.mktemp("grid-engine")
    lab = GridEngineLab(root)
    try:
        lab.up()
    except Exception as e:
        lab.down()
        (pytest.fail if in_ci else pytest.skip)(f"Grid Engine did not start: {e}")
    # ABCI's qsub takes -g GROUP, which Son of Grid Engine's lacks: this stand-in drops it, and
    # sends the site's environment (-V) and the jobs' output (-o) where the tests read them.
    bin_dir, logs = root / "bin", root / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    (bin_dir / "qsub").write_text(f'#!/bin/bash\nargs=()\nwhile [ $# -gt 0 ]; do\n'
                                  f'  if [ "$1" = -g ]; then shift 2; else args+=("$1"); shift; fi\ndone\n'
                                  f'exec /usr/bin/qsub -V -j y -o {logs} "${{args[@]}}"\n')
    (bin_dir / "qsub").chmod(0o755)
    lab.site = dict(SITE, PATH=f"{bin_dir}:{VENV_BIN}:{os.environ['PATH']}")
    lab.logs = logs
    yield lab
    lab.down()


def qsub(lab, *args, **settings):
    out = lab.run("qsub", "-terse", *args, **lab.site, **settings)
    assert out.returncode == 0, out.stdout
    return int(out.stdout.split()[0])


def log(lab, job):
    return next(lab.logs.glob(f"*.o{job}")).read_text()


@pytest.fixture(scope="module")
def header_job(grid_engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("ge-header")
    # The script's own line (qsub -g GROUP -l rt_AF=2 -l h_rt=1:00:00 ...), less the group and
    # the GPUs (rt_AF), with a short limit; the script's #$ lines ask for rt_AF=1 and -cwd.
    job = qsub(grid_engine, "-l", "h_rt=0:03:00,s_rt=0:02:40", "scripts/abci/train_abci2.sh", "--epochs", "5",
               *SMALL, "--summary-json", str(d / "summary.json"), CKPT_DIR=str(d / "ck"))
    return grid_engine.wait(job, 180), log(grid_engine, job), json.loads((d / "summary.json").read_text())


def test_the_header_line_trains_two_ranks_to_done(header_job):
    record, out, _ = header_job
    assert record["exit_status"] == "0" and record["failed"] == "0", (record, out)
    assert "1 node(s) x 2 rank(s) = 2" in out and "done: 400 steps" in out, out
    assert "of walltime left" in out  # from the real qstat -j: s_rt, less the script's seconds so far


@pytest.fixture(scope="module")
def chain(grid_engine, header_job, tmp_path_factory):
    d = tmp_path_factory.mktemp("ge-chain")
    figures = header_job[2]
    steps_per_s = figures["samples_per_s"] / 50  # SMALL's --bs
    start_s = figures["first_step_unix"] - figures["startup_unix"]["process_unix"]
    # -t 00:01:00: h_rt 60 s, s_rt 45 s; STOP_MARGIN_S=32 keeps all but about 12 s of it free (the
    # job scripts give no --stop-after under 10 s, and the script's own seconds before it count: 1 or
    # 2 under load), so a job trains for what start-up leaves of that
    # (and ends early: the chain takes less of the suite's time). Twice that: the first job stops on
    # its deadline even when it trains faster than the header's short run measured (seen: 10 % faster),
    # the second or third ends the run, and the ones after find it finished.
    max_steps = int(2 * steps_per_s * (12 - start_s))
    args = ["--epochs", "100000", *SMALL, "--max-steps", str(max_steps)]
    out = grid_engine.run("bash", "scripts/submit.sh", "abci2", "-g", "grp", "-p", "2", "-t", "00:01:00", "-c", "4",
                          "--", *args, **grid_engine.site, CKPT_DIR=str(d / "ck"), SUBMIT_DIR=str(d / "submit"),
                          STOP_MARGIN_S="32")
    ids = [int(line) for line in out.stdout.splitlines() if line.isdigit()]  # the job ids: one a line
    assert out.returncode == 0 and len(ids) == 4, out.stdout
    records = [grid_engine.wait(job, 200) for job in ids]
    whole = qsub(grid_engine, "-l", "h_rt=0:10:00", "scripts/abci/train_abci2.sh", *args, CKPT_DIR=str(d / "whole"))
    grid_engine.wait(whole, 300)
    return {"records": records, "outs": [log(grid_engine, j) for j in ids], "dir": d, "max_steps": max_steps}


def test_a_run_longer_than_its_s_rt_stops_on_its_own_deadline_with_75(chain):
    record, out = chain["records"][0], chain["outs"][0]
    assert record["exit_status"] == "75" and record["failed"] == "0", (record, out)  # qacct keeps the 75
    assert "stopped on the --stop-after deadline" in out and "resubmit with the same CKPT_DIR" in out


def test_a_chain_held_by_hold_jid_carries_the_run_to_the_uninterrupted_weights(chain):
    outs, d = chain["outs"], chain["dir"]
    done = next((i for i, out in enumerate(outs) if "done: " in out), None)
    assert done is not None, f"{chain['max_steps']} steps:\n{job_story(outs)}"
    assert done >= 1 and all("resume: " in out for out in outs[1:done + 1]), outs
    for out, record in zip(outs[done + 1:], chain["records"][done + 1:], strict=True):  # the rest find it finished
        assert "is finished" in out and "world size" not in out and record["exit_status"] == "0", out
    resumed, whole = load(d / "ck" / "last.pt"), load(d / "whole" / "last.pt")
    assert resumed["step"] == whole["step"] == chain["max_steps"]
    assert same_tensors(resumed["model"], whole["model"])
