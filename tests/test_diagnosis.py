"""The watchdog's verdict as a pure function (ddp_abci/parallel/diagnosis.py), on made-up
heartbeats: every verdict docs/reliability.md lists, and the line each gives. The real ranks'
hangs that reach these verdicts end to end: test_watchdog.py."""
from ddp_abci.parallel.diagnosis import Clock, Seen, Verdict, age, diagnose, fresh, verdict_line

NOW = Clock(monotonic=1000.0, wall=5000.0)
INTERVAL = 1.0  # a heartbeat a second: stale after 3 s


def beat(phase="gradient all-reduce", collective=True, step=7, host="node2", read_ago=0.0, written_ago=0.0):
    return Seen({"seq": 1, "step": step, "phase": phase, "collective": collective, "host": host,
                 "phase_s": 3.0, "wall": NOW.wall - written_ago}, NOW.monotonic - read_ago)


def line(verdict, seen, **kw):
    return verdict_line(verdict, seen, NOW, waited="rank 0 (host node1) waited 12 s in the stop agreement at step 7",
                        place="in the stop agreement", me=0, step=7, master_addr="10.0.0.1", **kw)


def test_a_heartbeat_is_as_old_as_the_later_of_its_reading_and_its_own_clock():
    assert age(beat(read_ago=2.0, written_ago=5.0), NOW) == 5.0
    assert fresh(beat(read_ago=3.0), NOW, INTERVAL) and not fresh(beat(read_ago=3.5), NOW, INTERVAL)
    assert not fresh(None, NOW, INTERVAL)  # never read


def test_a_rank_whose_heartbeat_stopped_changing_stopped_answering():
    seen = {1: beat(read_ago=60), 2: beat()}
    verdict = diagnose(seen, 0, 3, NOW, INTERVAL)
    assert verdict == Verdict("lost", (1,))
    assert line(verdict, seen).startswith("rank 1 (host node2) stopped answering at step 7 (last seen 60 s ago, in "
                                          "the gradient all-reduce for 3 s) (rank 0 (host node1) waited 12 s")


def test_a_rank_never_heard_from_is_lost_and_rank_0_is_named_at_the_stores_address():
    verdict = diagnose({}, 1, 2, NOW, INTERVAL)
    assert verdict == Verdict("lost", (0,))
    assert line(verdict, {}, store_error="RuntimeError: refused").startswith(
        "rank 0 (at 10.0.0.1, which holds the rendezvous store) stopped answering (no heartbeat read from it; the "
        "store said RuntimeError: refused)")


def test_a_store_call_held_past_three_beats_is_rank_0_frozen_even_with_fresh_beats():
    seen = {0: beat(), 2: beat()}
    assert diagnose(seen, 1, 3, NOW, INTERVAL, store_held_s=4.0) == Verdict("store", (0,))
    assert diagnose(seen, 1, 3, NOW, INTERVAL, store_held_s=2.0) == Verdict("disagree", (0, 2))
    assert diagnose(seen, 0, 3, NOW, INTERVAL, store_held_s=9.0).kind != "store"  # rank 0 holds the store itself
    assert "the rendezvous store on its host has not answered for 4 s" in line(Verdict("store", (0,)), seen,
                                                                               store_held_s=4.0)


def test_a_rank_alive_in_local_work_is_alive_but_never_reached_the_collective():
    seen = {1: beat(phase="loss_fn", collective=False), 2: beat()}
    verdict = diagnose(seen, 0, 3, NOW, INTERVAL)
    assert verdict == Verdict("busy", (1,))
    assert "rank 1 (host node2) is alive but never reached the collective at step 7" in line(verdict, seen)


def test_ranks_all_alive_in_collectives_disagree_about_them_each_named_with_its_own():
    seen = {1: beat(phase="checkpoint save", step=9)}
    verdict = diagnose(seen, 0, 2, NOW, INTERVAL)
    assert verdict == Verdict("disagree", (1,))
    assert line(verdict, seen) == ("the ranks are alive but disagree about the collectives (rank-dependent code around "
                                   "a collective?): rank 0 in the stop agreement at step 7, rank 1 in the checkpoint "
                                   "save at step 9")


def test_a_lost_rank_outranks_a_busy_one():
    seen = {1: beat(collective=False), 2: beat(read_ago=10)}
    assert diagnose(seen, 0, 3, NOW, INTERVAL) == Verdict("lost", (2,))
