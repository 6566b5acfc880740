"""The Trainer's collective rule, and the watchdog that enforces it, in one process: every
method that makes a collective is marked, and a marked call that waits past --timeout ends
the job with one line (the real ranks: test_watchdog.py)."""
import inspect
import re
import threading
import time

import pytest

from ddp_abci.parallel.launch import Launch
from ddp_abci.parallel.watchdog import EXIT_RANK_LOST, Seen, Watchdog, peer_lost
from ddp_abci.trainer import Trainer

# What makes a collective inside the Trainer: the helpers of parallel/ and the evaluation's combine.
COLLECTIVE_CALLS = re.compile(r"\b(all_ranks|broadcast_error|broadcast_buffers|check_replicas_agree|reduce|combine|"
                              r"agreement\.agree|share_\w+|RunTrackers)\(")


def test_every_trainer_method_that_makes_a_collective_is_marked():
    methods = {name: m for name, m in vars(Trainer).items() if callable(m)}
    calling = {name for name, m in methods.items() if COLLECTIVE_CALLS.search(inspect.getsource(m))}
    marked = {name for name, m in methods.items() if getattr(m, "collective", None)}
    assert calling == marked, f"unmarked: {calling - marked}, marked without a collective: {marked - calling}"
    assert {"_agree", "_epoch_report", "_save_snapshot", "_evaluate", "_check_replicas", "_write_summary",
            "_save_model", "_sync_buffers"} <= marked


def test_collective_methods_say_so_and_skip_by_configuration_never_by_rank():
    for name, method in vars(Trainer).items():
        if getattr(method, "collective", None):
            doc, source = inspect.getdoc(method), inspect.getsource(method)
            assert doc.startswith("Collective"), name
            assert not re.search(r"if [^\n]*is_main[^\n]*:\n\s+return", source), name  # no rank-dependent skip


def _watchdog(timeout_s):
    ended = []
    watchdog = Watchdog(Launch(0, 2, 0, 2, "127.0.0.1", 1, "test"), timeout_s, end=ended.append)
    return watchdog, ended


def test_a_collective_that_waits_past_the_timeout_ends_the_job_with_exit_69_naming_it(capsys):
    watchdog, ended = _watchdog(timeout_s=1.0)
    watchdog.start()  # the heartbeat finds no store on port 1: the watch thread decides alone
    try:
        with watchdog.waiting("stop agreement"):
            deadline = time.monotonic() + 10
            while not ended and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        watchdog.stop()
    assert ended == [EXIT_RANK_LOST]
    line = capsys.readouterr().err.strip()
    assert line.startswith("error: rank 1 stopped answering") and "waited 1 s in the stop agreement" in line
    assert "the job ends (exit 69)" in line


def test_local_work_is_not_timed_however_long():
    watchdog, ended = _watchdog(timeout_s=0.5)
    watchdog.start()
    try:
        with watchdog.working("loss_fn"):
            time.sleep(1.5)
    finally:
        watchdog.stop()
    assert ended == []


def test_the_diagnosis_tells_a_frozen_rank_from_a_busy_one_and_from_a_disagreement():
    watchdog, _ = _watchdog(timeout_s=10)
    now, beat = time.monotonic(), {"seq": 1, "step": 7, "host": "node2", "phase_s": 3.0, "wall": time.time()}
    entry = ("stop agreement", True, now - 12)
    watchdog.seen = {1: Seen(dict(beat, phase="gradient all-reduce", collective=True), now - 60)}
    assert "rank 1 (host node2) stopped answering at step 7" in watchdog.diagnose(entry)
    watchdog.seen = {1: Seen(dict(beat, phase="loss_fn", collective=False), now)}
    assert "rank 1 (host node2) is alive but never reached the collective" in watchdog.diagnose(entry)
    watchdog.seen = {1: Seen(dict(beat, phase="checkpoint save", collective=True), now)}
    line = watchdog.diagnose(entry)
    assert "alive but disagree" in line and "rank 1 in the checkpoint save at step 7" in line


def test_a_thread_that_finds_its_own_process_was_paused_judges_no_one():
    watchdog, ended = _watchdog(timeout_s=1.0)
    watchdog.last_watch = time.monotonic() - 30  # as after a SIGSTOP: the watch thread saw nothing for 30 s
    assert watchdog._paused_recently()
    thread = threading.Thread(target=watchdog.expire, args=(("stop agreement", True, time.monotonic() - 30),),
                              daemon=True)
    thread.start()
    thread.join(timeout=1.0)
    assert ended == [] and thread.is_alive()  # it waits to be ended, no verdict
    watchdog.stop()  # its wait ends, still without a verdict (left alive, it spoke 10 s later)
    thread.join(timeout=1.0)
    assert ended == [] and not thread.is_alive()


@pytest.mark.parametrize("error, lost", [(RuntimeError("... Connection closed by peer [127.0.0.1]:3 ..."), True),
                                         (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False)])
def test_a_peer_that_ended_is_not_mistaken_for_this_ranks_failure(error, lost):
    assert peer_lost(error) is lost
