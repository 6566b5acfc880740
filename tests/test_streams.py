"""Streamed data: any IterableDataset through fit(), each rank reading its own share, every
rank ending the epoch at the same step, and a mid-epoch resume that reads nothing twice.
Real ranks under mpirun (tests/stream_script.py), and the resume's cost in this process."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import IterableDataset

from ddp_abci.errors import UsageError
from ddp_abci.sharded_files import ShardedFiles
from ddp_abci.streams import Stream
from helpers import REPO, assert_clean, end_job, env, load, on_ranks, rank_pids, run, same_tensors, wait_for_line

pytestmark = pytest.mark.usefixtures("mpirun")


def stream_run(kind, out, *flags, **kw):
    return run(on_ranks(2, "tests/stream_script.py", kind, str(out), *flags), **kw)


def trained(out: Path, rank: int) -> list[int]:
    path = out / f"trained-{rank}.txt"
    return [int(x) for line in path.read_text().splitlines() for x in line.split()] if path.exists() else []


@pytest.mark.untimed
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_plain_stream_trains_each_item_once_an_epoch_shared_by_rank_and_worker(tmp_path, workers):
    proc = stream_run("numbered", tmp_path, "--workers", workers)
    assert_clean(proc)
    assert "epochs of a stream of batches" in proc.stdout and "done: 50 steps" in proc.stdout
    assert sorted(trained(tmp_path, 0) + trained(tmp_path, 1)) == list(range(1000))


@pytest.mark.untimed
def test_uneven_shares_end_the_epoch_on_every_rank_at_the_same_step_saying_what_was_dropped(tmp_path):
    proc = stream_run("uneven", tmp_path)
    assert_clean(proc)
    assert "done: 25 steps" in proc.stdout  # rank 1's 250 items: 25 batches of 10, for both ranks
    assert "50 items of the longer shares dropped" in proc.stdout
    assert len(trained(tmp_path, 0)) == len(trained(tmp_path, 1)) == 250


@pytest.mark.untimed
def test_a_plain_stream_stopped_mid_epoch_replays_to_its_position_and_trains_each_item_once(tmp_path):
    stopped = stream_run("numbered", tmp_path, "--ckpt-dir", str(tmp_path / "ck"), "--max-steps", "17")
    assert_clean(stopped)
    resumed = stream_run("numbered", tmp_path, "--ckpt-dir", str(tmp_path / "ck"), "--resume")
    assert_clean(resumed)
    assert "resume: rank 0's stream, worker 0: read 170 items again" in resumed.stdout  # rank 0's 17 batches
    assert sorted(trained(tmp_path, 0) + trained(tmp_path, 1)) == list(range(1000))


@pytest.mark.untimed
def test_sharded_files_stopped_mid_epoch_resume_bit_for_bit_and_open_no_finished_file(tmp_path):
    flags = ["--workers", "2", "--epochs", "2", "--log-every", "0.05"]
    whole, out = tmp_path / "whole", tmp_path / "stopped"
    whole.mkdir()
    out.mkdir()
    assert_clean(stream_run("shards", whole, *flags, "--ckpt-dir", str(whole / "ck")))
    proc = subprocess.Popen(on_ranks(2, "tests/stream_script.py", "shards", str(out), *flags, "--ckpt-dir",
                                     str(out / "ck")), cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        while True:  # until a progress line half-way through the first epoch (80 batches): some files done
            line = wait_for_line(proc, "epoch 1/2 [")[-1]
            if int(line.split("[")[1].split()[0]) >= 40:
                break
        for pid in rank_pids(proc.pid):
            os.kill(pid, signal.SIGTERM)  # as the scheduler's walltime does
        stop_out, _ = proc.communicate(timeout=60)
    finally:
        end_job(proc)
    assert proc.returncode == 75, stop_out
    saved = load(out / "ck" / "last.pt")
    assert saved["epoch"] == 0 and saved["batch_in_epoch"] > 0, saved["batch_in_epoch"]
    finished = finished_files(saved, out / "shards")
    (out / "opened.txt").unlink()
    rest = stream_run("shards", out, "--workers", "2", "--epochs", "1", "--ckpt-dir", str(out / "ck"), "--resume")
    assert_clean(rest)  # the rest of the first epoch: what its workers open is read to train it
    assert "went on from its stream's state_dict(), reading nothing again" in rest.stdout
    reopened = {line.split()[2] for line in (out / "opened.txt").read_text().splitlines() if line.split()[1] != "main"}
    assert finished and not reopened & finished, (finished, reopened)
    assert_clean(stream_run("shards", out, *flags, "--ckpt-dir", str(out / "ck"), "--resume"))
    end, uninterrupted = load(out / "ck" / "last.pt"), load(whole / "ck" / "last.pt")
    assert end["step"] == uninterrupted["step"] == 160 and same_tensors(end["model"], uninterrupted["model"])


def finished_files(saved: dict, folder: Path) -> set[str]:
    """The files each (rank, worker) had read to their end when the checkpoint was made: those
    before the one its ShardedFiles state stands at, in that share's order for the epoch."""
    paths = sorted(str(p) for p in folder.glob("*.jsonl"))
    done = set()
    for rank, position in enumerate(saved["data_per_rank"]):
        for worker, where in position["workers"].items():
            files = ShardedFiles(paths, None, shuffle_seed=3)
            files.set_epoch(where["state"]["epoch"])
            done |= set(files.shard(rank, 2).shard(int(worker), 2).files()[:where["state"]["file"]])
    return done


class Counting(IterableDataset):
    """items 0, 1, 2, ... up to `count`, counting how many were made (read)."""

    def __init__(self, count):
        self.count, self.made = count, 0

    def __iter__(self):
        for i in range(self.count):
            self.made += 1
            yield torch.tensor([float(i)])


def _read(path):
    first = int(Path(path).name)
    return (torch.tensor([float(first + i)]) for i in range(10_000))


def test_a_resume_100000_batches_into_sharded_files_reads_nothing_again_and_says_how_replay_compares(capsys):
    opened = []
    files = ShardedFiles([str(n * 10_000) for n in range(400)], lambda path: opened.append(path) or _read(path))
    position = {"epoch": 0, "trained": 100_000, "turn": 0, "world_size": 1, "worker_count": 1,
                "workers": {"0": {"read": 1_000_000, "made": 100_000,
                                  "state": {"epoch": 0, "file": 100, "item": 0}}}}
    stream = Stream(files, 0, 1, 10)
    stream.load_state_dict(position)
    began = time.monotonic()
    first, _ = next(stream.begin(0))
    state_s = time.monotonic() - began
    plain = Counting(2_000_000)
    replaying = Stream(plain, 0, 1, 10)
    replaying.load_state_dict({**position, "workers": {"0": {"read": 1_000_000, "made": 100_000}}})
    began = time.monotonic()
    replayed, _ = next(replaying.begin(0))
    replay_s = time.monotonic() - began
    with capsys.disabled():
        print(f"\nresume 100,000 batches in: from ShardedFiles' state {state_s:.3f} s, by replay {replay_s:.2f} s "
              f"({plain.made - 10:,} items read again)")
    # 100 files of 10,000 items make the 100,000 batches of 10: the next is the 101st file's first item
    assert first.flatten().tolist()[0] == float(files.files()[100])
    assert replayed.flatten().tolist()[0] == 1_000_000.0 and plain.made == 1_000_010
    assert opened == [files.files()[100]]  # the one file the next batch is in: nothing read again


def test_a_mid_epoch_stream_position_for_another_world_size_is_refused_in_one_line():
    stream = Stream(Counting(10), 0, 4, 1)
    with pytest.raises(UsageError, match=r"mid-epoch for 2 rank\(s\) x 1 worker\(s\), this run has 4 x 1"):
        stream.load_state_dict({"epoch": 0, "trained": 3, "workers": {}, "turn": 0, "world_size": 2,
                                "worker_count": 1})
    stream.load_state_dict({"epoch": 1, "trained": 0, "workers": {}, "turn": 0, "world_size": 2, "worker_count": 1})


@pytest.mark.untimed
def test_the_shards_example_trains_on_files_it_writes_and_resumes_where_it_stopped(tmp_path):
    shards, ck = tmp_path / "shards", tmp_path / "ck"
    first = run(on_ranks(2, "-m", "ddp_abci.examples.shards", "--epochs", "2", "--max-steps", "100", "--workers", "2",
                         "--ckpt-dir", str(ck), "--shards", str(shards)))
    assert first.returncode == 0 and "done: 100 steps" in first.stdout, first.stdout
    assert len(list(shards.glob("shard-*.jsonl"))) == 16
    again = run(on_ranks(2, "-m", "ddp_abci.examples.shards", "--epochs", "2", "--workers", "2", "--ckpt-dir",
                         str(ck), "--shards", str(shards), "--resume"))
    assert again.returncode == 0 and "resume:" in again.stdout and "step 100" in again.stdout, again.stdout
    assert "done: 248 steps" in again.stdout, again.stdout
