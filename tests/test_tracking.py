"""Watching a run: TensorBoard events, the picture of a run, and progress lines with time left."""
import json
import shutil
import sqlite3

import pytest

from helpers import PYTHON, assert_clean, env, run, run_mpi, train_here

pytestmark = pytest.mark.untimed

RUN = ["--epochs", "3", "--num-items", "800", "--bs", "50"]  # 16 steps an epoch, 48 in all


def _loss_steps(tb_dir) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [event.step for event in acc.Scalars("loss")]


def test_tensorboard_gets_one_loss_per_step_and_a_resume_continues_it(tmp_path, mpirun):
    args = [*RUN, "--tensorboard", str(tmp_path / "tb"), "--ckpt-dir", str(tmp_path / "ck")]
    assert_clean(run_mpi(2, *args, "--max-steps", "20"))
    assert_clean(run_mpi(2, *args, "--resume"))
    assert _loss_steps(tmp_path / "tb") == list(range(1, 49))


def test_steps_logged_after_the_last_checkpoint_are_not_doubled_by_the_resume(tmp_path):
    # One rank is enough: what rank 0 logged and what the resume drops (the test above has 2)
    args = [*RUN, "--tensorboard", str(tmp_path / "tb"), "--ckpt-dir", str(tmp_path / "ck")]
    assert_clean(train_here(*args))
    # As if killed after logging all 48 steps but checkpointing only epoch 2 (step 32):
    shutil.copyfile(tmp_path / "ck" / "prev.pt", tmp_path / "ck" / "last.pt")
    assert_clean(train_here(*args, "--resume"))
    assert _loss_steps(tmp_path / "tb") == list(range(1, 49))


@pytest.mark.parametrize("tracker, package", [("tensorboard", "tensorboard"), ("wandb", "wandb"),
                                                ("mlflow", "mlflow")])
def test_a_tracker_without_its_package_is_one_line_naming_the_install(monkeypatch, tracker, package):
    import importlib.util

    from ddp_abci.trackers import check_installed

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    proc = train_here(*RUN, "--track", tracker)
    assert proc.returncode == 2 and len(proc.stdout.splitlines()) == 1, proc.stdout
    assert proc.stdout.startswith(f"error: --track {tracker} needs the {package} package: install it with "
                                  f"pip install {package}"), proc.stdout
    with pytest.raises(Exception, match="ddp_abci\\[trackers\\]"):
        check_installed((tracker,))


def test_the_plot_draws_a_run_with_its_resume_marked(tmp_path):
    log = tmp_path / "run.jsonl"
    args = [*RUN, "--metrics-jsonl", str(log), "--ckpt-dir", str(tmp_path / "ck")]
    assert_clean(train_here(*args, "--max-steps", "20"))
    assert_clean(train_here(*args, "--resume"))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows if r["samples_per_s"] is None] == [1, 21]  # each run's first step
    proc = run([PYTHON, "-m", "ddp_abci.plot", str(log), "--out", str(tmp_path / "run.png")])
    assert proc.returncode == 0, proc.stdout
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_of_a_file_that_is_not_a_run_log_is_one_line():
    proc = run([PYTHON, "-m", "ddp_abci.plot", "setup.cfg"])
    assert proc.returncode == 2 and proc.stdout.startswith("error: ") and len(proc.stdout.splitlines()) == 1


def test_progress_lines_carry_the_loss_of_recent_steps_and_the_time_left():
    proc = train_here("--epochs", "2", "--log-every", "0.01")
    assert_clean(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("  epoch ")]
    assert lines and all("(mean of recent steps)" in line and " left" in line for line in lines), proc.stdout
    assert "\r" not in proc.stdout


EVAL_RUN = ["--epochs", "3", "--num-items", "400", "--bs", "50", "--eval-every", "1"]


def test_each_evaluation_is_a_line_of_the_metrics_log_and_the_status_shows_the_last_and_the_best(tmp_path):
    log, ck = tmp_path / "run.jsonl", tmp_path / "ck"
    assert_clean(train_here(*EVAL_RUN, "--metrics-jsonl", str(log), "--ckpt-dir", str(ck)))
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    evals = [r for r in rows if "eval" in r]
    assert [(r["step"], r["epoch"]) for r in evals] == [(8, 1), (16, 2), (24, 3)], evals  # 8 steps an epoch
    assert all(set(r["eval"]) == {"loss", "mean RMSE"} for r in evals), evals
    state = json.loads(run([PYTHON, "-m", "ddp_abci.status", str(ck), "--json"]).stdout)
    assert state["eval"]["step"] == 24 and state["eval"]["values"] == evals[-1]["eval"]
    best = min(evals, key=lambda r: r["eval"]["loss"])
    assert state["best_eval"]["step"] == best["step"] and state["best_eval"]["values"] == best["eval"]
    assert isinstance(state["loss"], float)  # the last epoch's training loss
    text = run([PYTHON, "-m", "ddp_abci.status", str(ck)]).stdout
    assert f"last evaluation: loss {evals[-1]['eval']['loss']:.4f}" in text and "best evaluation: loss" in text


def test_the_best_evaluation_is_kept_across_a_resume(tmp_path):
    ck = tmp_path / "ck"
    assert_clean(train_here(*EVAL_RUN, "--ckpt-dir", str(ck), "--max-steps", "16"))
    first = json.loads((ck / "progress.json").read_text())["best_eval"]
    assert_clean(train_here(*EVAL_RUN, "--ckpt-dir", str(ck), "--resume"))
    best = json.loads((ck / "progress.json").read_text())["best_eval"]
    assert best["step"] in (first["step"], 24) and best["values"]["loss"] <= first["values"]["loss"]


def test_tokens_a_second_and_mfu_against_a_stated_peak_reach_the_log_the_progress_line_and_the_summary(tmp_path):
    log, summary = tmp_path / "run.jsonl", tmp_path / "summary.json"
    proc = train_here(*RUN, "--tokens-per-item", "16", "--flops-per-token", "auto", "--peak-tflops", "0.001",
                      "--log-every", "0.001", "--metrics-jsonl", str(log), "--summary-json", str(summary))
    assert_clean(proc)
    params = 1000 * 100 + 100 + 100 * 1000 + 1000  # the seed's autoencoder at its default sizes
    assert f"throughput: FLOPs a token 6 x {params:,} parameters" in proc.stdout and "peak 0.001 TFLOPS" in proc.stdout
    rows = [json.loads(line) for line in log.read_text().splitlines()][1:]  # the first step has no rate
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(16 * row["samples_per_s"])
        assert row["mfu"] == pytest.approx(row["tokens_per_s"] * 6 * params / 1e9)
    assert any(", MFU " in line and " tokens/s" in line for line in proc.stdout.splitlines() if "left" in line)
    figures = json.loads(summary.read_text())
    assert figures["tokens_per_s"] == pytest.approx(16 * figures["samples_per_s"]) and figures["mfu"] > 0


def test_on_a_device_without_a_known_peak_mfu_is_unknown_never_a_guess():
    proc = train_here(*RUN, "--epochs", "1", "--tokens-per-item", "16", "--flops-per-token", "auto")
    assert_clean(proc)
    assert "MFU unknown: no peak known for cpu in fp32 (give --peak-tflops)" in proc.stdout, proc.stdout


def test_the_peak_table_names_the_gpus_and_precisions_it_knows_and_nothing_else():
    from ddp_abci.throughput import device_peak

    assert device_peak("NVIDIA H100 80GB HBM3", "bf16")[0] == 989e12
    assert device_peak("NVIDIA H100 PCIe", "bf16")[0] == 756e12
    assert device_peak("NVIDIA H200", "fp16")[0] == 989e12
    assert device_peak("NVIDIA A100-SXM4-80GB", "bf16")[0] == 312e12
    assert device_peak("Tesla V100-SXM2-16GB", "fp16")[0] == 125e12
    assert device_peak("Tesla V100-SXM2-16GB", "bf16")[0] is None  # no BF16 tensor cores
    assert device_peak("NVIDIA H100 80GB HBM3", "fp32")[0] is None and device_peak("cpu", "fp32")[0] is None


def test_tokens_counted_by_a_function_of_the_batch_give_tokens_a_second(tmp_path, capsys):
    import torch

    from ddp_abci import TrainConfig, fit

    x = torch.ones(200, 8)
    x[:, 5:] = 0  # each item: 5 tokens and 3 of padding, which count_tokens leaves out
    log = tmp_path / "run.jsonl"
    status = fit(torch.nn.Linear(8, 8), torch.utils.data.TensorDataset(x),
                 lambda model, batch: torch.nn.functional.mse_loss(model(batch[0]), batch[0]),
                 TrainConfig(epochs=2, global_batch=50, metrics_jsonl=str(log)),
                 count_tokens=lambda batch: int((batch[0] != 0).sum()))
    assert status == 0
    assert "throughput: tokens/s counted; no MFU" in capsys.readouterr().out
    rows = [json.loads(line) for line in log.read_text().splitlines()][1:]
    assert len(rows) == 7 and all(r["tokens_per_s"] == pytest.approx(5 * r["samples_per_s"]) for r in rows), rows


def test_tensorboard_wandb_offline_and_mlflow_each_hold_one_run_across_a_chain_of_two_jobs(tmp_path):
    pytest.importorskip("wandb"), pytest.importorskip("mlflow")
    import mlflow

    ck = tmp_path / "ck"
    args = [PYTHON, "-m", "ddp_abci.train", *RUN, "--eval-every", "1", "--track", "tensorboard,wandb,mlflow",
            "--ckpt-dir", str(ck)]
    offline = env(WANDB_MODE="offline", WANDB_SILENT="true")
    assert_clean(run(args, env=offline))
    ids = json.loads((ck / "trackers.json").read_text())
    # 720 items train (a tenth is held out): 15 steps an epoch, 45 in all. As if the first job
    # was killed after logging all 45 steps but checkpointing only epoch 2 (step 30):
    shutil.copyfile(ck / "prev.pt", ck / "last.pt")
    assert_clean(run([*args, "--resume"], env=offline))
    assert json.loads((ck / "trackers.json").read_text()) == ids  # the second job logged into the same runs
    assert _loss_steps(ck / "tracking" / "tensorboard") == list(range(1, 46))
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ck / 'tracking' / 'mlflow.db'}")
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "loss")] == list(range(1, 46))
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "eval/loss")] == [15, 30, 45]
    assert json.loads(client.get_run(ids["mlflow"]).data.params["lr"]) == 1e-4  # the config, logged once
    runs = sorted((ck / "tracking" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{ids['wandb']}") for r in runs), runs
    assert all((r / f"run-{ids['wandb']}.wandb").stat().st_size > 0 for r in runs)


def test_a_tracker_that_fails_mid_run_is_one_warning_and_is_dropped(tmp_path, capsys):
    pytest.importorskip("mlflow")
    from ddp_abci import TrainConfig
    from ddp_abci.trackers import Trackers

    trackers = Trackers(TrainConfig(track="mlflow", track_dir=str(tmp_path)), 1, {"lr": 1e-4})
    trackers.log(1, {"loss": 1.0})
    with sqlite3.connect(tmp_path / "mlflow.db") as store:  # its store broken under it, as a server gone
        store.execute("DROP TABLE metrics")
    trackers.log(2, {"loss": 0.5})
    trackers.log(3, {"loss": 0.25})
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and said[0].startswith("warning: the mlflow tracker failed (") and said[0].endswith(
        "; it stops here, training goes on"), said
    assert trackers.open == []
