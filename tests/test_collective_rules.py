"""The Trainer's collective rule, and the watchdog that enforces it: on 2 real ranks, every
rank makes the same collectives in the same order whatever the configuration; and a marked
call that waits past --timeout ends the job with one line (in one process here; the real
ranks: test_watchdog.py)."""
import json
import re
import threading
import time

import pytest

from ddp_abci.parallel.diagnosis import Seen
from ddp_abci.parallel.launch import Launch
from ddp_abci.parallel.watchdog import EXIT_RANK_LOST, Watchdog, peer_lost
from helpers import on_ranks, run


@pytest.fixture(scope="module")
def sequences(tmp_path_factory, mpirun):
    """Every collective each of 2 real ranks made, per configuration (tests/collective_sequences_script.py)."""
    out = tmp_path_factory.mktemp("sequences")
    proc = run(on_ranks(2, "tests/collective_sequences_script.py", str(out)), timeout=240)
    assert proc.returncode == 0, proc.stdout
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


CONFIGURATIONS = ["plain", "gloo", "checkpoints every 3 steps", "synchronous checkpoints", "evaluation and summary",
                  "a stop asked on rank 1", "a save that fails"]


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_every_rank_makes_the_same_collectives_in_the_same_order(sequences, configuration):
    (status0, made0), (status1, made1) = (ranks[configuration] for ranks in sequences)
    assert status0 == status1 == {"a stop asked on rank 1": 75, "a save that fails": 74}.get(configuration, 0)
    assert made0 == made1 and len(made0) > 10, (configuration, made0, made1)


def test_the_configurations_do_change_the_collectives(sequences):
    made = {name: tuple(seq) for name, (_, seq) in sequences[0].items()}
    assert len(set(made.values())) == len(CONFIGURATIONS)  # each one exercised a sequence of its own
    assert "mpi gradient all-reduce" in made["plain"] and "mpi gradient all-reduce" not in made["gloo"]


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
    waited = re.search(r"waited (\d+) s in the stop agreement", line)
    # At --timeout; or, where the heartbeat already found the store unreadable (here it has no
    # secret to sign with), one errand later, leaving a rank that can read it the verdict.
    assert line.startswith("error: rank 1 stopped answering") and waited, line
    assert int(waited[1]) <= 1 + watchdog.heartbeat.errand_s(), line
    assert "the job ends (exit 69)" in line


def test_a_collective_ended_by_gloos_own_timeout_is_judged_with_this_rank_still_in_it(monkeypatch):
    # The process group's timeout is --timeout too, and under load it fired before the watch
    # thread looked; the rank was then shown back in the training while the verdict was reached,
    # and a disagreement was named "alive but never reached the collective".
    watchdog, _ = _watchdog(timeout_s=10)
    shown = []
    monkeypatch.setattr(watchdog, "expire", lambda entry: shown.append((entry[0], watchdog.stack[-1][0])))
    with watchdog.working("training"), pytest.raises(RuntimeError):
        with watchdog.waiting("epoch loss reduce"):
            raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 4000ms")
    assert shown == [("epoch loss reduce", "epoch loss reduce")]


def test_local_work_is_not_timed_however_long():
    watchdog, ended = _watchdog(timeout_s=0.5)
    watchdog.start()
    try:
        with watchdog.working("loss_fn"):
            time.sleep(1.5)
    finally:
        watchdog.stop()
    assert ended == []


def test_the_watchdogs_line_is_the_diagnosis_of_the_heartbeats_it_read():
    watchdog, _ = _watchdog(timeout_s=10)
    now, beat = time.monotonic(), {"seq": 1, "step": 7, "host": "node2", "phase_s": 3.0, "wall": time.time()}
    watchdog.heartbeat.seen[1] = Seen(dict(beat, phase="gradient all-reduce", collective=True), now - 60)
    line = watchdog.diagnose(("stop agreement", True, now - 12), {0: "in loss_fn at train.py:42"})
    assert line.startswith("rank 1 (host node2) stopped answering at step 7") and "waited 12 s in the stop agreement" \
        in line  # the verdicts themselves: test_diagnosis.py
    assert "where each live rank is: rank 0 in loss_fn at train.py:42" in line and "the job ends (exit 69)" in line


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
