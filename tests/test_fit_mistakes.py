"""fit() for the code people really bring: the DDP mistakes everyone makes end in seconds with
one line that names the fix, before any training, or just work. Real fit() calls under
mpirun -n 2: tests/fit_cases_script.py runs the cases one after the other in one job."""
import json
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import PYTHON, REPO, env, error_lines, load, on_ranks, run

pytestmark = pytest.mark.usefixtures("mpirun")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Each case's lines (between the markers rank 0 prints), its exit status, the facts."""
    root = tmp_path_factory.mktemp("fit-cases")
    proc = run(on_ranks(2, "tests/fit_cases_script.py", str(root)), timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stdout, proc.stdout
    found, lines = {}, []
    for line in proc.stdout.splitlines():
        marker = re.match(r"== case (\S+): exit (\d+)$", line)
        if marker:
            found[marker[1]] = (int(marker[2]), [x for x in lines if x.startswith("error:")])
            lines = []
        else:
            lines.append(line)
    return found, json.loads((root / "facts.json").read_text()), root


def refused(cases, case):
    """The case ended with exit 2 and exactly one error line, before any training: that line."""
    status, lines = cases[0][case]
    assert status == 2 and len(lines) == 1, (case, status, lines)
    return lines[0]


def test_a_layer_left_out_of_forward_is_named_before_training(cases):
    line = refused(cases, "unused-layer")
    assert "unused.weight, unused.bias" in line and "find_unused_parameters=True (--find-unused-parameters)" in line


def test_a_branch_taken_on_some_ranks_only_is_named_before_training(cases):
    assert "b.weight, b.bias" in refused(cases, "unused-on-some-ranks")


def test_find_unused_parameters_trains_the_used_layer_and_leaves_the_unused_one(cases):
    assert cases[0]["find-unused-parameters"][0] == 0
    changed = cases[1]["find-unused-parameters"]["changed"]
    assert changed["used.weight"] and changed["used.bias"] and not changed["unused.weight"]


def test_the_factory_gets_a_list_so_the_weight_decay_split_trains_the_biases_too(cases):
    assert cases[0]["weight-decay-split"][0] == 0
    assert cases[1]["weight-decay-split"]["changed"] == {"weight": True, "bias": True}
    groups = load(cases[2] / "decay" / "last.pt")["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0] and [len(g["params"]) for g in groups] == [1, 1]


def test_an_optimizer_class_is_called_with_the_configs_lr(cases):
    assert cases[0]["optimizer-class"][0] == 0
    group = load(cases[2] / "sgd" / "last.pt")["optimizer"]["param_groups"][0]
    assert group["lr"] == 1e-2 and "momentum" in group  # torch.optim.SGD, at TrainConfig.lr


@pytest.mark.parametrize("case, words", [
    ("factory-returns-str", "the optimizer factory returned a str, not a torch.optim.Optimizer"),
    ("factory-returns-scheduler", "the optimizer factory returned a StepLR"),
    ("optimizer-instance", "optimizer= got an optimizer already built (Adam); pass a factory"),
    ("group-without-params", "the optimizer factory raised KeyError: 'params'"),
    ("bias-left-out", "the optimizer leaves out trainable parameters: bias"),
])
def test_an_optimizer_factory_that_gives_the_wrong_thing_is_one_line(cases, case, words):
    assert words in refused(cases, case)


def test_a_stream_with_no_length_cannot_take_a_schedule_that_needs_the_runs_length(cases):
    line = refused(cases, "stream-cosine-without-length")
    assert "schedule (--schedule) cosine needs the run's length: set max_steps (--max-steps)" in line


def test_variable_length_items_name_the_collate_and_the_items_not_the_loss(cases):
    line = refused(cases, "ragged-items")
    assert "with default_collate failed" in line and "item 0 is ((1,), (2,)), item 1 is ((2,), (2,))" in line
    assert "pass collate_fn=" in line and "loss_fn" not in line


def test_a_collate_fn_makes_variable_length_items_train(cases):
    assert cases[0]["ragged-items-collated"][0] == 0 and load(cases[2] / "ragged" / "last.pt")["step"] == 8


def test_a_batchnorm_model_whose_last_batch_holds_one_item_is_told_to_drop_it(cases):
    line = refused(cases, "batchnorm-last-batch-of-one")
    assert "the epoch's short last batch of 1 item(s) per rank" in line and "drop_last=True (--drop-last)" in line


def test_drop_last_trains_it_on_whole_batches_only(cases):
    assert cases[0]["batchnorm-drop-last"][0] == 0
    assert load(cases[2] / "drop" / "last.pt")["step"] == 4  # 34 items, global batch 16: 2 whole batches an epoch


def test_batchnorm_statistics_are_the_same_on_every_rank_at_the_end(cases):
    assert cases[0]["batchnorm-statistics"][0] == 0
    rank0, rank1 = cases[1]["batchnorm-statistics"]["buffer_sums"]
    assert rank0 == rank1 and rank0[2] > 0  # running mean, running var, batches tracked: rank 0's on both


def test_sync_batchnorm_on_the_cpu_is_refused_naming_why(cases):
    assert "sync_batchnorm (--sync-batchnorm) needs GPUs" in refused(cases, "sync-batchnorm-on-cpu")


@pytest.mark.parametrize("case, words", [
    ("detached-loss", "loss_fn returned a loss with no gradient: it was detached"),
    ("existing-process-group", "fit() opens and closes its own process group, and one is open already"),
    ("ddp-wrapped-model", "the model is already wrapped in DistributedDataParallel; pass the bare model"),
    ("metric-returns-a-mean", "metric 'mae' returned a tensor of shape () for a batch of 8 items"),
    ("metric-returns-a-float", "metric 'one' returned a float for a batch of 8 items"),
])
def test_the_other_mistakes_are_one_line_naming_the_fix(cases, case, words):
    assert words in refused(cases, case)


def _ends_at_once(proc, started):
    lines = error_lines(proc.stdout)
    assert len(lines) == 1 and "Traceback" not in proc.stdout, proc.stdout
    assert proc.returncode == 2 and time.monotonic() - started < 20, (proc.returncode, proc.stdout)
    return lines[0]


def test_a_loss_fn_that_raises_on_one_rank_ends_every_rank_at_once_with_its_line():
    started = time.monotonic()  # --timeout 120: the others must not wait for the watchdog
    proc = run(on_ranks(2, "tests/misbehave_script.py", "raise-loss", "--epochs", "50", "--num-items", "400"))
    line = _ends_at_once(proc, started)
    assert line.startswith("error: rank 1 (host ") and "loss_fn raised ValueError: a bad batch on rank 1" in line


def test_items_that_change_shape_later_end_every_rank_at_once_naming_the_items():
    started = time.monotonic()
    proc = run(on_ranks(2, "tests/fit_cases_script.py", "unused-root", "shape-changes-later"))
    line = _ends_at_once(proc, started)
    assert re.match(r"error: rank \d \(host .+\): collating items \[", line) and "item 61 is ((9,), (2,))" in line


def test_ctrl_c_in_one_process_saves_says_where_and_exits_75(tmp_path):
    from helpers import wait_for_line

    proc = subprocess.Popen([PYTHON, "-m", "ddp_abci.train", "--epochs", "1000", "--num-items", "400", "--ckpt-dir",
                             str(tmp_path)], cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    wait_for_line(proc, "epoch 3/1000")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 75 and "KeyboardInterrupt" not in out and "Traceback" not in out, out
    assert re.search(rf"stopped on SIGINT at .*; checkpoint {re.escape(str(tmp_path / 'last.pt'))}; resume", out)
    assert load(tmp_path / "last.pt")["step"] > 0


def test_ctrl_c_at_the_terminal_of_run_local_stops_every_rank_with_a_checkpoint_and_exit_75(tmp_path):
    # A real terminal: Ctrl-C goes to the foreground process group, as when a person types it.
    # The terminal's shell starts run_local.sh with SIGINT at its default: a suite started in the
    # background (`cmd &` without job control) inherits it ignored, and bash cannot trap a signal
    # ignored on entry, so the child resets it, as a login shell would.
    code = ("import os, pty, signal, sys\n"
            "pid, fd = pty.fork()\n"
            "if pid == 0:\n"
            "    signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
            "    os.execvp('bash', ['bash', 'scripts/run_local.sh', '--epochs', '1000', '--num-items', '400',"
            f" '--ckpt-dir', {str(tmp_path)!r}])\n"
            "out = b''\n"
            "while b'epoch 3/1000' not in out:\n"
            "    out += os.read(fd, 4096)\n"
            "os.write(fd, b'\\x03')\n"
            "while True:\n"
            "    try:\n"
            "        data = os.read(fd, 4096)\n"
            "    except OSError:\n"
            "        break\n"
            "    if not data:\n"
            "        break\n"
            "    out += data\n"
            "_, status = os.waitpid(pid, 0)\n"
            "sys.stdout.write(out.decode(errors='replace'))\n"
            "print('exit', os.waitstatus_to_exitcode(status))\n")
    proc = run([sys.executable, "-c", code], timeout=60)
    assert proc.stdout.rstrip().endswith("exit 75"), proc.stdout
    assert "stopped on SIGUSR1" in proc.stdout and f"checkpoint {tmp_path / 'last.pt'}" in proc.stdout
    assert torch.load(tmp_path / "last.pt", weights_only=True)["step"] > 0
