"""The data people bring, through fit() as they pass it: Hugging Face datasets streams, WebDataset
tar shards, litdata and MosaicML streaming datasets, streams of their own, and DataLoaders.

One corpus (tests/data_corpus.py: 1,000 numbered items in 16 shards, in each library's format)
is written once for the module; each case runs on 2 real ranks with 0 and then 2 DataLoader
workers, three times in the same ranks (tests/data_libraries_script.py): uninterrupted, stopped
mid-epoch at step 17 of 50, and resumed. What is checked is what loss_fn saw: the ids each
rank trained, in order."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import PYTHON, REPO, error_lines, on_ranks, run

pytestmark = pytest.mark.usefixtures("mpirun")

ITEMS = 1000
EXACT = ["hf", "hf-split", "wds", "wds-split-by-node", "wds-seeded-shuffle", "litdata", "sized", "numpy-text",
         "dataloader", "stateful-dataloader"]
CASES = [*EXACT, "wds-unseeded-shuffle", "hf-shuffled", "hf-unseeded-shuffle"]
WORKERS = (0, 2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    subprocess.run([PYTHON, "tests/data_corpus.py", str(out)], cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return out


@pytest.mark.untimed
def test_the_recipes_in_docs_data_md_run_as_written_and_train_their_epoch(corpus, tmp_path):
    proc = run(on_ranks(2, "tests/data_recipes_script.py", str(corpus), str(tmp_path)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    recipes = json.loads((tmp_path / "recipes-r0.json").read_text())
    assert len(recipes) == 5
    for recipe in recipes:
        assert recipe["status"] == 0 and "epoch 1/1" in recipe["printed"], recipe["recipe"] + recipe["printed"]


def _launch(corpus: Path, out: Path, cases: list[str], timeout: float) -> subprocess.CompletedProcess:
    specs = [f"{case}:{workers}" for workers in WORKERS for case in cases]
    return run(on_ranks(2, "tests/data_libraries_script.py", str(corpus), str(out), *specs), timeout=timeout)


@pytest.fixture(scope="module")
def results(corpus, tmp_path_factory) -> dict:
    """Every case but MosaicML's in one launch: {(case, workers): [rank 0's runs, rank 1's]}."""
    out = tmp_path_factory.mktemp("runs")
    proc = _launch(corpus, out, CASES, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return _read(out, CASES)


def _read(out: Path, cases: list[str]) -> dict:
    return {(case, w): [json.loads((out / f"{case}-w{w}-r{r}.json").read_text()) for r in (0, 1)]
            for case in cases for w in WORKERS}


def _assert_each_item_once(ranks: list[dict]) -> None:
    whole = [ranks[r]["whole"] for r in (0, 1)]
    assert [run["status"] for run in whole] == [0, 0], whole[0]["printed"]
    trained = whole[0]["trained"] + whole[1]["trained"]
    assert sorted(trained) == list(range(ITEMS)), whole[0]["printed"]  # each item once, none lost


def _assert_resumed_exactly(ranks: list[dict], stopped_at: int = 17) -> None:
    for rank in (0, 1):
        runs = ranks[rank]
        assert [runs[k]["status"] for k in ("first", "rest")] == [0, 0], runs["rest"]["printed"]
        assert len(runs["first"]["trained"]) == stopped_at * 10  # stopped mid-epoch: 17 of 50 steps
        assert runs["first"]["trained"] + runs["rest"]["trained"] == runs["whole"]["trained"], rank


@pytest.mark.untimed
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("case", EXACT)
def test_each_item_trains_once_an_epoch_whatever_the_library_splits_itself(results, case, workers):
    _assert_each_item_once(results[case, workers])


@pytest.mark.untimed
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("case", EXACT)
def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_items_in_order_rank_by_rank(results, case, workers):
    _assert_resumed_exactly(results[case, workers])


@pytest.mark.untimed
@pytest.mark.parametrize("workers", WORKERS)
def test_an_unseeded_shuffle_is_said_before_the_first_step_and_its_mid_epoch_resume_refused(results, workers):
    ranks = results["wds-unseeded-shuffle", workers]
    _assert_each_item_once(ranks)  # split by rank before its shuffle: nothing twice, nothing lost
    printed = ranks[0]["whole"]["printed"]
    assert printed.index("warning: a WebDataset pipeline: each rank drew its own shuffle seed") < \
        printed.index("training:")
    rest = ranks[0]["rest"]
    assert rest["status"] == 2 and rest["trained"] == []
    assert "mid-epoch in an order drawn from seed" in error_lines(rest["printed"])[0]


@pytest.mark.untimed
@pytest.mark.parametrize("workers", WORKERS)
def test_a_hugging_face_stream_shuffled_through_a_buffer_resumes_in_its_second_epoch_to_the_same_items(results,
                                                                                                      workers):
    ranks = results["hf-shuffled", workers]
    whole = [ranks[r]["whole"]["trained"] for r in (0, 1)]
    start = 0
    for left_out in _left_untrained(ranks[0]["whole"]["printed"]):
        # The shuffled shards deal the ranks shares of 496 to 504 items: the shortest ends the epoch,
        # and what the others read past it is said at the epoch's end, never trained twice nor silently lost.
        end = start + (ITEMS - left_out) // 2
        epoch = whole[0][start:end] + whole[1][start:end]
        assert len(set(epoch)) == len(epoch) == ITEMS - left_out, (start, left_out)
        start = end
    assert start == len(whole[0]) and start > 500  # two epochs
    order = whole[0]
    assert order[:100] != sorted(order[:100]) and set(order[:100]) != set(order[start - 100:start])  # shuffled anew
    _assert_resumed_exactly(ranks, stopped_at=70)  # step 70: in the second epoch
    printed = ranks[0]["rest"]["printed"]
    assert "its state_dict() holds no shuffle buffer: replayed to its saved position" in printed, printed
    assert "note: a Hugging Face datasets stream: it shuffles through a buffer of 100 items" in \
        ranks[0]["whole"]["printed"]


def _left_untrained(printed: str) -> list[int]:
    """Each epoch's items the run said it left untrained (read past the shortest share, short batches)."""
    lines = [line for line in printed.splitlines() if re.match(r"epoch \d+/\d+: loss", line)]
    return [sum(int(n) for n in re.findall(r"(\d+) items of the (?:longer shares|readers' short)", line))
            for line in lines]


@pytest.mark.untimed
@pytest.mark.parametrize("workers", WORKERS)
def test_a_hugging_face_shuffle_without_a_seed_is_refused_before_the_first_step(results, workers):
    for each in results["hf-unseeded-shuffle", workers][0].values():
        assert each["status"] == 2 and each["trained"] == [], each["printed"]
        assert "each rank drew its own shuffle seed" in error_lines(each["printed"])[0], each["printed"]
        assert "pass seed= to .shuffle()" in error_lines(each["printed"])[0]


@pytest.mark.untimed
@pytest.mark.parametrize("case", ["litdata", "sized"])
def test_a_stream_whose_length_is_known_says_its_epoch_in_batches_of_this_rank(results, case):
    # litdata's length is each rank's (500 items: 50 batches of 10), a stream's own __len__ the whole stream's
    assert "training: 1 epochs of 50 batches, global batch 20 (10 per rank)" in results[case, 0][0]["whole"]["printed"]


@pytest.mark.untimed
@pytest.mark.parametrize("case", ["hf", "litdata"])
def test_a_library_with_a_state_resumes_from_it_reading_nothing_again(results, case):
    printed = results[case, 2][0]["rest"]["printed"]
    assert "resume: rank 0's stream, worker 1: went on from" in printed and "items again" not in printed, printed


@pytest.mark.untimed
def test_a_webdataset_pipeline_without_a_state_is_replayed_to_each_workers_position(results):
    printed = results["wds", 2][0]["rest"]["printed"]
    assert "resume: rank 0's stream, worker 1: read 80 items again" in printed, printed  # 8 of its 17 batches


STALLS = """
import sys, time, torch
from torch.utils.data import IterableDataset
from ddp_abci import TrainConfig, fit

class Stalls(IterableDataset):  # two batches from each worker, then nothing: read ahead before step 1
    def __iter__(self):
        yield from (torch.zeros(4) for _ in range(20))
        time.sleep(3600)

sys.exit(fit(torch.nn.Linear(4, 1), Stalls(), lambda m, x: m(x).mean(),
             TrainConfig(epochs=1, global_batch=10, workers=2, timeout_s=3)))
"""


def test_a_stream_that_yields_nothing_ends_the_job_after_timeout_naming_the_rank_waiting_on_its_data():
    proc = run([PYTHON, "-c", STALLS], timeout=60)
    line = error_lines(proc.stdout)[-1]
    assert proc.returncode == 69 and "rank 0 (host" in line and "waited 3 s on its data at step 0" in line, \
        proc.stdout


def test_mosaicml_streaming_trains_each_item_once_and_resumes_exactly_within_two_minutes(corpus, tmp_path):
    proc = _launch(corpus, tmp_path, ["mosaic"], timeout=120)  # whatever happens: a hang is this test's failure
    assert proc.returncode == 0, proc.stdout[-3000:]
    for workers in WORKERS:
        ranks = _read(tmp_path, ["mosaic"])["mosaic", workers]
        _assert_each_item_once(ranks)
        _assert_resumed_exactly(ranks)
