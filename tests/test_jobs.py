"""The chain's rules (ddp_abci/cluster/chain.py) on made-up records and outputs, in this process:
what a job makes of the end before it, what its own end is, how a walltime reads, what submit.sh
refuses before anything is queued. The job scripts and the three schedulers' labs run them
for real (test_job_scripts.py, test_pbs.py, test_slurm.py, test_grid_engine.py)."""
import pytest

from ddp_abci import run_folder
from ddp_abci.cluster import chain as jobs
from ddp_abci.cluster import jobs as command
from ddp_abci.cluster import restarts, status, submission, walltime
from ddp_abci.cluster.schedulers import Scheduler


def status_file(tmp_path, **fields):
    run_folder.write_status(tmp_path, int(fields.pop("status")), finished=fields.pop("finished", False),
                      step=fields.pop("step", 7), line=fields.pop("line", "a line"), rank=0, host="h1", **fields)
    return str(tmp_path)


def test_the_status_file_is_one_key_a_line_in_one_order_and_reads_back(tmp_path):
    status_file(tmp_path, status=75, line="stopped   on\nSIGTERM", chain="c1")
    text = (tmp_path / "status").read_text()
    assert [line.split("=")[0] for line in text.splitlines()] == list(run_folder.FIELDS)
    record = run_folder.read_status(tmp_path)
    assert record["line"] == "stopped on SIGTERM" and record["chain"] == "c1"


def test_a_job_trains_when_no_record_of_its_chain_is_there(tmp_path):
    assert jobs.verdict(str(tmp_path), "c1", "5") == (None, "")
    assert jobs.verdict(status_file(tmp_path, status=65, chain="an-older-chain"), "c1", "5") == (None, "")


def test_a_finished_run_ends_the_chains_later_jobs_with_0(tmp_path):
    status, line = jobs.verdict(status_file(tmp_path, status=0, finished=True, step=400, chain="c1"), "c1", "5")
    assert status == 0 and "is finished (step 400); nothing to train" in line


@pytest.mark.parametrize("ended", [2, 65, 74])
def test_an_end_that_does_not_mend_by_itself_stops_the_chain_with_its_status(tmp_path, ended):
    status, line = jobs.verdict(status_file(tmp_path, status=ended, chain="c1", line="error: x"), "c1", "5")
    assert status == ended and f"the chain stops: an earlier job ended with {ended}: error: x" in line


@pytest.mark.parametrize("ended", [69, 75])
def test_a_lost_rank_or_a_stop_resumes(tmp_path, ended):
    assert jobs.verdict(status_file(tmp_path, status=ended, chain="c1"), "c1", "5") == (None, "")


def test_an_unexpected_failure_is_retried_once_and_stops_the_chain_the_second_time_in_a_row(tmp_path):
    ckpt = str(tmp_path)
    jobs.record(ckpt, 1, "Traceback ...", chain="c1")
    assert jobs.verdict(ckpt, "c1", "5") == (None, "")
    jobs.record(ckpt, 1, "Traceback again")
    assert run_folder.read_status(ckpt)["failures"] == "2" and jobs.verdict(ckpt, "c1", "6")[0] == 1
    jobs.record(ckpt, 69, "lost")
    jobs.record(ckpt, 1, "once more")
    assert run_folder.read_status(ckpt)["failures"] == "1"  # in a row only


def test_a_status_the_run_recorded_during_the_job_wins_over_mpiruns(tmp_path, capsys):
    ckpt = str(tmp_path)
    before = run_folder.fingerprint(ckpt)
    status_file(tmp_path, status=75, line="stopped on SIGTERM")
    assert jobs.finish(ckpt, 1, before, None, "5", chain="c1") == 75
    assert "mpirun exited 1; the run recorded 75" in capsys.readouterr().err
    assert run_folder.read_status(ckpt)["chain"] == "c1"  # for the next job


def test_mpirun_exiting_0_with_no_record_is_a_lost_rank_69_recorded(tmp_path):
    ckpt = str(tmp_path)
    assert jobs.finish(ckpt, 0, run_folder.fingerprint(ckpt), None, "5") == 69
    assert run_folder.read_status(ckpt)["status"] == "69"


def test_a_lost_daemon_after_the_ranks_started_is_that_host_lost(tmp_path):
    output = tmp_path / "out"
    output.write_bytes(b"ddp_abci: world size 4 (local 2)\n\0PRTE has lost communication with a remote daemon.\n"
                       b"  Remote daemon: [prterun-h1-123@0,1] on node h2\n")
    ckpt = str(tmp_path / "ck")
    assert jobs.finish(ckpt, 1, "none", str(output), "5") == 69
    assert "lost its daemon on h2" in run_folder.read_status(ckpt)["line"]
    output.write_bytes(b"A daemon failed to report back\n")  # before the ranks started: a launch that cannot work
    assert jobs.lost_daemon_host(jobs.mpirun_output(str(output))) is None


def test_a_survivors_abort_on_a_closed_link_is_a_rank_lost_on_another_host(tmp_path):
    # Open MPI 5's lines when rank 1's abort reached mpirun before the news of rank 3's death
    # on the other host (the PBS lab, 2026-12-07): mpirun exited 14.
    output = tmp_path / "out"
    output.write_bytes(b"ddp_abci: world size 4 (local 2)\n[vm:00000] *** An error occurred in Socket closed\n"
                       b"[vm:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,\n"
                       b'prterun has exited due to process rank 1 with PID 0 on node vm calling\n"abort".\n')
    ckpt = str(tmp_path / "ck")
    assert jobs.finish(ckpt, 14, "none", str(output), "5") == 69
    line = run_folder.read_status(ckpt)["line"]
    assert "a rank on vm found its link to another rank closed" in line
    assert restarts.blamed_host(line)[0] is None  # vm is a survivor; the lost rank's host is not said
    assert restarts.blamed_host(line, ["vm", "h2"]) == ("h2", False)  # the one other host of the try
    assert restarts.blamed_host(line, ["vm", "h2", "h3"])[0] is None


def test_a_refusal_the_run_could_not_record_is_recorded_with_its_last_error_line(tmp_path):
    output = tmp_path / "out"
    output.write_bytes(b"error: first\n--- banner\n\0error: global_batch (--bs) 51 does not divide by 2\n")
    ckpt = str(tmp_path / "ck")
    assert jobs.finish(ckpt, 2, "none", str(output), "5", chain="c1") == 2
    assert run_folder.read_status(ckpt)["line"].startswith("error: global_batch (--bs) 51")
    assert jobs.verdict(ckpt, "c1", "6")[0] == 2


@pytest.mark.parametrize("typed, seconds", [("12:00:00", 43200), ("1-00:00:00", 86400), ("12h", 43200),
                                            ("90m", 5400), ("2d", 172800), ("45s", 45), ("05:30", 330),
                                            ("3420", 3420), ("00:00:59.5", 59)])
def test_a_walltime_reads_in_each_form_users_and_schedulers_write(typed, seconds):
    assert walltime.to_seconds(typed) == seconds


def test_a_walltime_in_no_form_is_refused_naming_them():
    with pytest.raises(ValueError, match=r"walltime 3 hours: use HH:MM:SS, D-HH:MM:SS, or a number with d, h, m or s"):
        walltime.to_seconds("3 hours")


def test_the_schedulers_forms_and_the_margin():
    assert (walltime.hms(72 * 3600), walltime.slurm_time(90000), walltime.slurm_time(3600)) == (
        "72:00:00", "1-01:00:00", "01:00:00")
    assert (walltime.margin_s(60), walltime.margin_s(12 * 3600)) == (15, 120)


class Left(Scheduler):
    """A scheduler whose job has `seconds` left."""

    seconds = 3600

    @classmethod
    def walltime_left(cls, environ, elapsed_s=0.0):
        return cls.seconds


def test_the_deadline_is_a_wall_clock_time_the_schedulers_end_less_the_margin():
    at, line = jobs.deadline(Left, {}, "5", None, now=1000.0)
    assert at == 1000.0 + 3600 - 120 and "3600s of walltime left; the trainer stops, saves and exits 75 within 3480s" \
        in line
    Left.seconds = 12
    assert jobs.deadline(Left, {}, "5", None)[0] is None  # too little left: the scheduler's signal alone


def plan(*args, **kw):
    return submission.plan("abci3", kw.pop("walltime", "12h"), kw.pop("nodes", 2), 8, 3, list(args), **kw)


def test_submit_plans_the_walltime_in_each_schedulers_form_and_the_node_hours():
    values = plan("--epochs", "5")
    assert values["walltime_hms"] == "12:00:00" and values["margin"] == "120" and values["node_hours"] == "72"


@pytest.mark.parametrize("args, message", [
    (["--bs", "50"], "--bs 50 does not divide by 2 node(s) x 8 rank(s) = 16: use a multiple of 16, e.g. --bs 48"),
    (["--save-every-minute", "30"], "unknown flag --save-every-minute; did you mean --save-every-minutes?"),
    (["--lr", "0"], "lr (--lr) must be positive, got 0"),
])
def test_submit_refuses_the_trainers_flags_as_the_trainer_would(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        plan(*args)


def test_a_train_script_that_is_not_there_or_out_of_the_containers_sight_is_refused(tmp_path):
    with pytest.raises(ValueError, match="TRAIN_SCRIPT=/nope.py does not exist"):
        plan(train_script="/nope.py")
    script = tmp_path / "mine.py"
    script.write_text("")
    with pytest.raises(ValueError, match=f"outside the checkout .* bind its folder \\(BINDS={tmp_path}\\)"):
        plan(train_script=str(script), repo="/work/repo", container="/img.sif")
    plan(train_script=str(script), repo="/work/repo", binds=str(tmp_path), container="/img.sif")


def test_a_train_scripts_own_flags_pass_and_its_batch_is_checked_only_when_given(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text("")
    plan("--pace", "1", train_script=str(script))  # its default global batch is its own
    with pytest.raises(ValueError, match="--bs 12 does not divide"):
        plan("--bs", "12", train_script=str(script))


def test_the_status_says_each_job_the_step_the_time_left_and_the_last_end(tmp_path):
    assert command.main(["chain", "--site", "abci3", "--node-hours", "36", "--walltime-s", "43200", str(tmp_path),
                      "11.pbs1", "12.pbs1", "13.pbs1"]) == 0  # as submit.sh writes it
    (tmp_path / "progress.json").write_text('{"step": 3000, "total_steps": 9000, "samples_per_s": 512.0, '
                                            '"steps_per_s": 2.0, "job": "12.pbs1", "unix": 1000.0}')
    status_file(tmp_path, status=75, line="stopped on the --stop-after deadline", chain="c1")
    state = status.chain_status(str(tmp_path), now=1060.0, states={"11.pbs1": "finished (exit 75)",
                                                                   "12.pbs1": "running", "13.pbs1": "held"})
    assert set(state) == set(status.KEYS)  # the JSON form's keys, stable for scripts
    assert state["run_left_s"] == 3000.0 and state["progress_age_s"] == 60.0 and state["node_hours"] == "36"
    text = "\n".join(status.lines(state))
    assert "job 12.pbs1: running" in text and "step 3,000 of 9,000, 512 samples/s" in text
    assert "the whole run needs 0:50:00 more at this speed" in text
    assert "last job ended with 75 (stopped on the --stop-after deadline): stopped early with a checkpoint" in text


def test_the_status_of_a_folder_without_a_chain_is_one_line_and_exit_2(tmp_path, capsys):
    assert status.main([str(tmp_path)]) == 2
    assert "holds no chain's files" in capsys.readouterr().err
