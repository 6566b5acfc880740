"""Train your own model: a model, dataset and loss the library did not write, through fit() on real ranks."""
import re

import pytest
import torch

from helpers import PYTHON, REPO, assert_clean, load, on_ranks, one_error, run, same_tensors

pytestmark = [pytest.mark.usefixtures("mpirun"), pytest.mark.untimed]


def user_run(n, kind, ckpt_dir, *args):
    return run(on_ranks(n, "tests/user_model_script.py", kind, str(ckpt_dir), *args))


def error_lines(proc):
    return [line for line in proc.stdout.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def tuples_on_two(tmp_path_factory):
    """The tuples model's whole run on 2 ranks (several tests read it: each launch costs seconds)."""
    folder = tmp_path_factory.mktemp("tuples")
    return user_run(2, "tuples", folder), folder


def test_a_model_on_tuple_items_trains_checkpoints_and_evaluates(tuples_on_two):
    proc, folder = tuples_on_two
    assert_clean(proc)
    assert "eval after epoch 3 (step 18): loss" in proc.stdout and "over 20 held-out items" in proc.stdout
    state = load(folder / "last.pt")
    assert set(state["model"]) == {"weight", "bias"} and state["step"] == 18 and state["train_items"] == 96


@pytest.fixture(scope="module")
def dicts_noisy_run(tmp_path_factory):
    """The dict items' model's uninterrupted run with --noise (the dataset draws from numpy's
    global RNG) on 2 ranks, made once a module: it serves two tests."""
    folder = tmp_path_factory.mktemp("dicts-whole")
    return user_run(2, "dicts", folder, "--noise"), folder


def test_a_model_with_batchnorm_and_two_inputs_on_dict_items_trains(dicts_noisy_run):
    proc, folder = dicts_noisy_run
    assert_clean(proc)
    state = load(folder / "last.pt")
    assert state["model"]["norm.num_batches_tracked"].item() == 18  # the buffers trained too
    assert "replicas agree" in proc.stdout


def test_two_ranks_end_with_the_weights_of_one_rank_on_the_same_global_batch(tuples_on_two, tmp_path):
    assert_clean(tuples_on_two[0])
    assert_clean(user_run(1, "tuples", tmp_path))
    two, one = load(tuples_on_two[1] / "last.pt")["model"], load(tmp_path / "last.pt")["model"]
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=0, atol=1e-5)


def test_a_user_model_stopped_and_resumed_equals_the_uninterrupted_run(dicts_noisy_run, tmp_path):
    # --noise: numpy's global RNG, which the checkpoint must restore per rank. The dict items'
    # model (batch norm, two inputs) only: what is restored does not depend on the items' kind.
    whole, folder = dicts_noisy_run
    assert_clean(whole)
    assert_clean(user_run(2, "dicts", tmp_path, "--noise", "--max-steps", "8"))  # mid-epoch 2
    resumed = user_run(2, "dicts", tmp_path, "--noise", "--resume")
    assert_clean(resumed)
    assert "at epoch 1, batch 2, step 8" in resumed.stdout
    assert same_tensors(load(folder / "last.pt")["model"], load(tmp_path / "last.pt")["model"])


@pytest.mark.parametrize("kind, message", [
    ("bad-item", "error: the training set's first item (a tuple of str, object) cannot be batched by default_collate: "
                 "TypeError: default_collate: batch must contain tensors"),
    ("vector-loss", "error: loss_fn returned a torch.float32 tensor of shape (8, 2); return one floating scalar"),
    ("raising-loss", "error: loss_fn(model, batch) raised KeyError: 'labels' on a first batch; fix the loss"),
])
def test_a_broken_dataset_or_loss_is_one_line_on_every_rank_and_overwrites_nothing(tuples_on_two, tmp_path, kind,
                                                                                    message):
    assert_clean(tuples_on_two[0])
    before = (tuples_on_two[1] / "last.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(before)  # a good run's checkpoint, for the broken run to resume from
    proc = user_run(2, kind, tmp_path, "--resume", "--epochs", "4")  # one epoch more than the good run
    assert proc.returncode == 2, proc.stdout
    errors = error_lines(proc)
    assert len(errors) == 1 and errors[0].startswith(message), proc.stdout
    assert "Traceback" not in proc.stdout
    assert (tmp_path / "last.pt").read_bytes() == before


def test_the_digits_example_reaches_95_percent_held_out_accuracy(tmp_path):
    proc = run(on_ranks(2, "-m", "ddp_abci.examples.digits", "--ckpt-dir", str(tmp_path)), cwd=REPO)
    assert_clean(proc)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("held-out accuracy ") and float(last.split()[-1]) >= 0.95, proc.stdout


def test_the_language_model_example_trains_by_steps_on_token_shards_it_writes_and_evaluates_them(tmp_path):
    proc = run(on_ranks(2, "-m", "ddp_abci.examples.language_model", "--data", str(tmp_path / "tokens"),
                        "--synthetic", "--max-steps", "20", "--eval-every-steps", "10", "--warmup-steps", "5",
                        "--bs", "8", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32",
                        "--vocab", "256", "--eval-windows", "64"))
    assert proc.returncode == 0 and "done: 20 steps" in proc.stdout, proc.stdout
    evaluations = re.findall(r"eval after epoch 0 \(step (\d+)\): loss [\d.]+, perplexity ([\d.]+)", proc.stdout)
    assert [step for step, _ in evaluations] == ["10", "20"]
    assert all(200 < float(p) < 320 for _, p in evaluations)  # random tokens: about the vocabulary's 256


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_the_language_model_example_refuses_a_data_folder_without_shards_in_one_line(tmp_path, folder):
    (tmp_path / "empty").mkdir()
    proc = run([PYTHON, "-m", "ddp_abci.examples.language_model", "--data", str(tmp_path / folder)])
    line = one_error(proc)
    assert f"--data {tmp_path / folder}" in line and "--synthetic" in line and "prepare.py" in line, line
    assert not list((tmp_path / "empty").iterdir())  # no random corpus written
