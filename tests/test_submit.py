"""scripts/submit.sh, as a user types it: its lines for every site, the walltimes people
write, the ranks a node holds, and the refusals that save a queue wait. DRY_RUN=1 shows the
lines; a stand-in qsub takes the real submission where the settings file must exist."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, env, run

SUBMIT = str(REPO / "scripts" / "submit.sh")  # run as written: executable, no bash in front


def submit(*args, **settings):
    return run([SUBMIT, *args], env=env(**settings))


def one_error(proc):
    assert proc.returncode == 2, proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("submit.sh: error: "), proc.stdout
    return lines[0]


def sourced(text: str, *names: str) -> dict[str, str]:
    """What the job's bash makes of a settings file: the values of `names` once it is sourced."""
    script = text + "".join(f'printf "%s\\0" "${{{name}-}}"\n' for name in names)
    out = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, text=True, check=True).stdout
    return dict(zip(names, out.split("\0")[:-1], strict=True))


def dry(tmp_path, *args, **settings):
    """The submit lines of a dry run, and the settings it would write."""
    proc = submit(*args, DRY_RUN="1", SUBMIT_DIR=str(tmp_path / "submit"), **settings)
    assert proc.returncode == 0, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("qsub ", "sbatch "))]
    after = proc.stdout.split("(not written: DRY_RUN):\n", 1)[1]
    written = "".join(line + "\n" for line in after.splitlines() if re.match(r"\w+=", line))
    return lines, written, proc.stdout


def test_help_shows_the_usage_and_exits_0():
    proc = submit("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: scripts/submit.sh SITE"), proc.stdout
    assert "-p RANKS_PER_NODE" in proc.stdout and submit("slurm", "--help").returncode == 0


def test_a_dry_run_writes_nothing(tmp_path):
    dry(tmp_path, "slurm", "-c", "2", CKPT_DIR=str(tmp_path / "ck"))
    assert not (tmp_path / "submit").exists() and not (tmp_path / "ck").exists()


def test_submitting_without_a_group_is_refused():
    assert "no group given: pass -g GROUP" in one_error(submit("abci3", "-n", "2"))


def test_a_chain_without_a_checkpoint_folder_is_refused_in_one_line():
    assert "-c 3 needs CKPT_DIR: every job of a chain resumes from it" in one_error(submit("slurm", "-c", "3",
                                                                                           DRY_RUN="1"))


@pytest.mark.parametrize("typed, pbs, sbatch", [("12:00:00", "12:00:00", "12:00:00"), ("12h", "12:00:00", "12:00:00"),
                                               ("90m", "01:30:00", "01:30:00"), ("2d", "48:00:00", "2-00:00:00"),
                                               ("1-06:00:00", "30:00:00", "1-06:00:00")])
def test_walltimes_in_the_forms_people_type(tmp_path, typed, pbs, sbatch):
    # (not named `slurm`: conftest.py tiers a test by the names it takes, and that is the lab's fixture)
    assert f"-l walltime={pbs} " in dry(tmp_path, "abci3", "-g", "g", "-t", typed)[0][0]
    assert f" -t {sbatch} " in dry(tmp_path, "slurm", "-t", typed)[0][0]


@pytest.mark.parametrize("typed", ["12x", "12h30", "ten", "3600"])
def test_a_walltime_in_no_known_form_is_refused_showing_the_forms(typed):
    line = one_error(submit("slurm", "-t", typed, DRY_RUN="1"))
    assert f"walltime {typed}: use HH:MM:SS, D-HH:MM:SS, or a number with d, h, m or s (12h, 90m)" in line


def test_the_abci3_line_asks_for_whole_h200_nodes_and_runs_one_rank_per_gpu(tmp_path):
    lines, written, _ = dry(tmp_path, "abci3", "-g", "gaa12345", "-n", "4", "-t", "02:00:00", "--", "--epochs", "50",
                            CKPT_DIR="/groups/gaa12345/run1")
    assert lines[0].startswith("qsub -P gaa12345 -q rt_HF -l select=4:mpiprocs=8 -l walltime=02:00:00 -v DDP_ABCI_ENV=")
    assert lines[0].rstrip().endswith("scripts/abci/train_abci3.sh")
    assert sourced(written, "NPROC_PER_NODE", "TRAIN_ARGS", "CKPT_DIR") == {
        "NPROC_PER_NODE": "8", "TRAIN_ARGS": "--epochs 50", "CKPT_DIR": "/groups/gaa12345/run1"}


@pytest.mark.parametrize("resource, per_node", [("rt_AF", "8"), ("rt_F", "4")])
def test_the_abci2_line_asks_for_its_resource_type_and_s_rt_before_h_rt(tmp_path, resource, per_node):
    lines, written, _ = dry(tmp_path, "abci2", "-g", "gaa12345", "-n", "2", "-r", resource)
    assert re.match(rf"qsub -terse -g gaa12345 -l {resource}=2 -l h_rt=01:00:00 -l s_rt=3480 -v DDP_ABCI_ENV=\S+ "
                    r"scripts/abci/train_abci2.sh", lines[0]), lines[0]
    assert f"NPROC_PER_NODE={per_node}" in written


def test_slurm_asks_for_every_gpu_with_one_task_each(tmp_path):
    lines, written, _ = dry(tmp_path, "slurm", "-n", "2", "-G", "8", "-t", "12h")
    assert lines[0].startswith("sbatch --parsable -N 2 --ntasks-per-node=8 -t 12:00:00 --gpus-per-node=8 "
                               "--signal=B:USR1@60 --export="), lines[0]
    assert "NPROC_PER_NODE=8" in written


def test_slurm_on_cpu_nodes_asks_for_the_ranks_a_node_holds(tmp_path):
    lines, written, out = dry(tmp_path, "slurm", "-n", "2", "-p", "2", "--", "--bs", "48")
    assert "-N 2 --ntasks-per-node=2 " in lines[0] and "--gpus-per-node" not in lines[0]
    assert dry(tmp_path, "slurm")[0][0].startswith("sbatch --parsable -N 1 --ntasks-per-node=1 ")


def test_ranks_per_node_from_the_user_win_and_say_so(tmp_path):
    lines, written, out = dry(tmp_path, "abci3", "-g", "g", "-p", "4")
    assert "NPROC_PER_NODE=4" in written and "4 rank(s) per node (-p), not one per GPU (8)" in out
    _, written, out = dry(tmp_path, "abci3", "-g", "g", NPROC_PER_NODE="2")
    assert "NPROC_PER_NODE=2" in written and "2 rank(s) per node (NPROC_PER_NODE)" in out


def test_a_global_batch_that_does_not_divide_by_the_ranks_is_refused_before_the_queue():
    line = one_error(submit("abci3", "-g", "g", "-n", "2", "--", "--bs", "50", DRY_RUN="1"))
    assert "--bs 50 does not divide by 2 node(s) x 8 rank(s) = 16: use a multiple of 16, e.g. --bs 48" in line
    assert submit("abci3", "-g", "g", "-n", "4", DRY_RUN="1").returncode == 0  # the default 256 divides by 32


@pytest.mark.parametrize("site, first, then", [
    ("abci3", "qsub -P g -q rt_HF -l select=1:mpiprocs=8 -l walltime=00:01:00 -v", "-W depend=afterany:JOB{}"),
    ("abci2", "qsub -terse -g g -l rt_AF=1 -l h_rt=00:01:00 -l s_rt=45 -v", "-hold_jid JOB{}"),
    ("slurm", "sbatch --parsable -N 1 --ntasks-per-node=1 -t 00:01:00 -A g --export=", "--dependency=afterany:JOB{}"),
])
def test_a_chain_submits_each_job_after_the_one_before_with_the_schedulers_own_flag(tmp_path, site, first, then):
    lines, written, _ = dry(tmp_path, site, "-g", "g", "-t", "00:01:00", "-c", "3", CKPT_DIR="/groups/g/run")
    assert len(lines) == 3 and lines[0].startswith(first) and "JOB" not in lines[0]
    assert "--signal" not in lines[0]  # Slurm may send it up to 60 s early: in a 1-minute job, at any time
    assert then.format(1) in lines[1] and then.format(2) in lines[2]
    assert "CHAIN_ID=" in written


def fake_qsub(tmp_path):
    """A stand-in qsub that records its arguments and answers a job id."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "qsub").write_text(f'#!/bin/sh\necho "$@" >>{tmp_path}/qsub.args\necho "$$.pbs1"\n')
    (bin_dir / "qsub").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_values_with_commas_reach_the_job_whole(tmp_path):
    proc = submit("abci3", "-g", "g", "-c", "2", "--", "--interface", "ib0,ib1", PATH=fake_qsub(tmp_path),
                  SUBMIT_DIR=str(tmp_path / "submit"), BINDS="/data/a,/data/b", CKPT_DIR=str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout
    first, second = (tmp_path / "qsub.args").read_text().splitlines()
    envfile = Path(re.search(r"DDP_ABCI_ENV=(\S+)", first)[1])
    assert "," not in first.split("-v ")[1].split()[0]  # qsub -v would split there
    settings = sourced(envfile.read_text(), "BINDS", "TRAIN_ARGS")
    assert settings == {"BINDS": "/data/a,/data/b", "TRAIN_ARGS": "--interface ib0,ib1"}, settings
    ids, cancel = proc.stdout.splitlines()[:2], proc.stdout.splitlines()[2]
    jobs = envfile.parent / f"{envfile.stem}.jobs"
    assert jobs.read_text().split() == ids  # the chain's jobs, for its jobs
    assert cancel.endswith(f"to cancel them all: qdel $(tac {jobs})")
    assert f"depend=afterany:{ids[0]}" in second


OWN = str(REPO / "ddp_abci" / "examples" / "own_model.py")  # a TRAIN_SCRIPT as users write one
SCRIPT_SITE = dict(CONTAINER="none", PYTHON=sys.executable, TRAIN_SCRIPT=OWN)


def test_a_train_scripts_misspelled_flag_is_refused_by_its_own_parser_before_the_queue(tmp_path):
    line = one_error(submit("slurm", "-n", "2", "-p", "4", "--", "--save-every-minute", "30", DRY_RUN="1",
                            SUBMIT_DIR=str(tmp_path), **SCRIPT_SITE))
    assert f"TRAIN_SCRIPT={OWN} refuses its arguments: unknown flag --save-every-minute; did you mean " \
           "--save-every-minutes?" in line, line


def test_a_train_scripts_batch_that_does_not_divide_by_the_ranks_is_refused_with_its_own_default(tmp_path):
    # own_model.py's default global batch is 64: 3 nodes x 8 ranks do not divide it
    line = one_error(submit("slurm", "-n", "3", "-p", "8", DRY_RUN="1", SUBMIT_DIR=str(tmp_path), **SCRIPT_SITE))
    assert "refuses its arguments: --bs 64 does not divide by 24 ranks: use a multiple of 24, e.g. --bs 48" in line


def test_a_train_scripts_good_flags_are_checked_and_said_so(tmp_path):
    proc = submit("slurm", "-n", "2", "-p", "4", "--", "--epochs", "3", DRY_RUN="1", SUBMIT_DIR=str(tmp_path),
                  **SCRIPT_SITE)
    assert proc.returncode == 0, proc.stdout
    assert f"TRAIN_SCRIPT={OWN}: its flags check out for 8 ranks (its own parser, run here)" in proc.stdout


def test_a_script_that_reads_no_flags_is_not_run_to_train_and_the_job_is_said_unchecked(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import torch\nfrom ddp_abci import fit\nraise SystemExit(fit(torch.nn.Linear(1, 1), "
                      "[torch.zeros(1)] * 4, lambda m, x: m(x).sum()))\n")
    proc = submit("slurm", DRY_RUN="1", SUBMIT_DIR=str(tmp_path / "s"), **{**SCRIPT_SITE, "TRAIN_SCRIPT": str(script)})
    assert proc.returncode == 0 and "its flags were not checked here (ddp_abci: fit() reached with " \
                                    "DDP_ABCI_CHECK_ARGS set" in proc.stdout, proc.stdout
    assert "training:" not in proc.stdout


def test_train_args_from_the_environment_come_first_then_the_arguments_after_the_dashes(tmp_path):
    _, written, _ = dry(tmp_path, "slurm", "--", "--epochs", "7", TRAIN_ARGS="--lr 0.01 --seed '5'")
    assert sourced(written, "TRAIN_ARGS")["TRAIN_ARGS"] == "--lr 0.01 --seed 5 --epochs 7"
    line = one_error(submit("slurm", "--", "--epochs", "7", TRAIN_ARGS="--lr -1", DRY_RUN="1"))
    assert "lr (--lr) must be" in line  # checked as the trainer takes them, TRAIN_ARGS's too
