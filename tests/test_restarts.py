"""The in-job restart policy (ddp_abci/cluster/restarts.py) as pure functions on made-up tries:
what mends, which host is left out, when the walltime or the batch says no, and what the tries
cost. The PBS lab runs it for real (test_pbs.py: a rank killed on each host, a host failing twice,
a frozen rank)."""
import pytest

from ddp_abci.cluster import restarts

HOSTS = ("h1", "h2")
VERDICT = ("error: rank 1 (host h1) stopped answering at step 52 (last seen 4 s ago, in the all-reduce for 5 s); "
           "rank 2 (host h2) stopped answering at step 39 (last seen 10 s ago, in the loss_fn for 0 s) (rank 0 "
           "(host h1) waited 10 s in the all-reduce at step 52)")
KILLED = "job 7: rank 3 on host h2 was killed by signal 9 (Open MPI's lines above); treated as 69"


def tries(*ends: tuple[int, str], start_s: float = 12.0) -> list[dict]:
    return [{"job": "7", "try": i + 1, "hosts": list(HOSTS), "started_unix": 1000.0 * i,
             "first_step_unix": 1000.0 * i + start_s, "ended_unix": 1000.0 * i + 500, "status": status,
             "line": line, "step_from": 100 * i, "step_reached": 100 * i + 120}
            for i, (status, line) in enumerate(ends)]


def decide(ended: list[dict], unanswered=(), **kw) -> restarts.Decision:
    options = dict(per_node=2, global_batch=8, time_left_s=3600.0, job="7")
    options.update(kw)
    return restarts.decide(ended[-1]["status"], ended, HOSTS, [], list(unanswered), **options)


@pytest.mark.parametrize("status", [0, 2, 65, 74, 75])
def test_an_end_that_does_not_mend_ends_the_job_as_before(status):
    assert decide(tries((status, "x"))) == restarts.Decision(False, HOSTS, 0.0, "")


def test_a_lost_rank_trains_again_on_every_host_after_the_pause():
    decision = decide(tries((69, KILLED)))
    assert decision.again and decision.hosts == HOSTS and decision.pause_s == restarts.DEFAULT_PAUSE_S
    assert "training again in this job, try 2 of at most 4" in decision.line and not decision.left_out


def test_an_unexpected_failure_trains_again_once_a_job():
    assert decide(tries((1, "Traceback"))).again
    assert not decide(tries((1, "Traceback"), (1, "Traceback"))).again


def test_the_host_a_verdict_names_is_left_out_at_once_and_the_speakers_own_host_never():
    decision = decide(tries((69, VERDICT)))
    assert decision.again and decision.hosts == ("h1",) and [h for h, _ in decision.left_out] == ["h2"]
    assert "the watchdog named it" in decision.left_out[0][1]


def test_a_killed_ranks_host_is_left_out_only_when_it_ends_two_tries_in_a_row():
    assert decide(tries((69, KILLED))).hosts == HOSTS
    twice = decide(tries((69, KILLED), (69, KILLED)))
    assert twice.hosts == ("h1",) and "two tries in a row ended with it" in twice.left_out[0][1]
    other = KILLED.replace("host h2", "host h1")
    assert decide(tries((69, KILLED), (69, other))).hosts == HOSTS  # one on each host: no host to blame


def test_a_host_that_fails_the_quick_check_is_left_out():
    decision = decide(tries((69, KILLED)), unanswered=["h1"])
    assert decision.hosts == ("h2",) and "did not answer the quick check" in decision.left_out[0][1]


def test_a_smaller_world_the_global_batch_does_not_divide_ends_the_job_saying_why():
    decision = decide(tries((69, VERDICT)), per_node=3, global_batch=8)
    assert not decision.again and "the 1 host(s) left make 3 ranks, and the global batch 8 does not divide" \
        in decision.line


def test_no_restart_when_the_walltime_left_does_not_hold_two_restarts_measured_in_this_job():
    assert decide(tries((69, KILLED), start_s=40.0), time_left_s=90.0).again
    late = decide(tries((69, KILLED), start_s=40.0), time_left_s=70.0)
    assert not late.again and "a restart takes 40 s (measured in this job)" in late.line


def test_a_start_up_not_measured_yet_is_assumed_and_said_so():
    ended = tries((69, KILLED))
    ended[0]["first_step_unix"] = None
    late = decide(ended, time_left_s=200.0)
    assert not late.again and "takes 120 s (not measured yet: assumed)" in late.line


def test_restarts_end_at_the_number_asked_for():
    decision = decide(tries((69, KILLED), (69, KILLED.replace("h2", "h1"))), restarts=1)
    assert not decision.again and "1 restart(s) in this job already (RESTARTS)" in decision.line


def test_no_restart_without_a_checkpoint_folder_to_resume_from():
    decision = decide(tries((69, KILLED)), have_checkpoints=False)
    assert not decision.again and "no CKPT_DIR" in decision.line


def test_the_goodput_of_the_tries_counts_restarts_their_cost_and_the_steps_redone():
    ended = tries((69, KILLED), (0, "done"))
    ended[1]["step_from"] = 100  # the first try reached 120: 20 steps redone
    summary = restarts.goodput(ended, steps_per_s=0.5)
    assert summary["allocation_s"] == 1500.0 and summary["counted_steps"] == 220
    assert summary["restarts"] == [{"job": "7", "try": 1, "status": 69, "line": KILLED, "step": 120,
                                    "back_after_s": 512.0, "steps_redone": 20}]
    assert summary["useful_s"] == 440.0 and summary["ettr"] == pytest.approx(440 / 1500, abs=1e-4)
