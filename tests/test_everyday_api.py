"""Accelerate's everyday features in raw form, each checked for real under mpirun -n 2."""
import json
import math

import pytest
import torch
from reference import item, reference_run

from helpers import assert_clean, load, on_ranks, run, run_mpi, train_here

pytestmark = pytest.mark.untimed

# 400 items, global batch 50 on 2 ranks: 8 micro-batches an epoch.
SMALL = ["--num-items", "400", "--bs", "50", "--epochs", "1", "--seed", "3"]


def _weights(tmp_path, *args):
    proc = run_mpi(2, *SMALL, "--ckpt-dir", str(tmp_path), *args)
    assert_clean(proc)
    return proc, load(tmp_path / "last.pt")


def _weights_here(tmp_path, *args):
    proc = train_here(*SMALL, "--ckpt-dir", str(tmp_path), *args)
    assert_clean(proc)
    return proc, load(tmp_path / "last.pt")


def test_accumulated_rmse_equals_a_step_on_the_mean_of_the_micro_batch_losses(tmp_path, mpirun):
    proc, state = _weights(tmp_path, "--accum", "2")
    assert "2 micro-batches a step" in proc.stdout and state["step"] == 4
    model, _, _ = reference_run(steps_per_epoch=4, epochs=1, num_items=400, global_batch=50, world=2, seed=3, accum=2)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(state["model"][name], tensor, rtol=1e-4, atol=1e-5)


def test_accumulated_mse_equals_one_step_on_the_k_times_larger_batch(tmp_path, mpirun):
    _, accumulated = _weights(tmp_path / "a", "--accum", "2", "--loss", "mse")
    proc = run_mpi(2, *SMALL[:2], "--bs", "100", *SMALL[4:], "--loss", "mse", "--ckpt-dir", str(tmp_path / "b"))
    assert_clean(proc)
    larger = load(tmp_path / "b" / "last.pt")
    assert accumulated["step"] == larger["step"] == 4
    for name, tensor in larger["model"].items():
        torch.testing.assert_close(accumulated["model"][name], tensor, rtol=1e-5, atol=1e-6)


def test_clipping_equals_clipping_the_averaged_gradient_and_logs_the_norm(tmp_path, mpirun):
    proc, state = _weights(tmp_path, "--clip-norm", "50")
    assert "grad norm before clipping mean" in proc.stdout
    model, _, _ = reference_run(steps_per_epoch=8, epochs=1, num_items=400, global_batch=50, world=2, seed=3,
                                clip_norm=50.0)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(state["model"][name], tensor, rtol=1e-4, atol=1e-5)


def test_evaluation_counts_every_held_out_item_exactly_once(tmp_path, mpirun):
    # 410 items: the last 41 are held out, an odd number that DistributedSampler pads on 2 ranks.
    proc, state = _weights(tmp_path, "--num-items", "410", "--eval-every", "1")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("eval after epoch 1"))
    assert line.endswith("over 41 held-out items")
    from ddp_abci.autoencoder import SimpleModule

    model = SimpleModule()
    model.load_state_dict(state["model"])
    with torch.no_grad():
        x = torch.stack([item(i) for i in range(369, 410)])
        expected = ((x - model(x)) ** 2).mean(dim=1).sqrt().mean().item()
    logged = float(line.split("mean RMSE ")[1].split()[0])
    assert logged == pytest.approx(expected, rel=1e-5, abs=1e-4)


def test_gather_reduce_and_main_process_first_on_real_ranks(tmp_path, mpirun):
    proc = run(on_ranks(2, "tests/collectives_script.py", str(tmp_path / "m")))
    assert_clean(proc)
    assert "rank 0: collectives ok" in proc.stdout and "rank 1: collectives ok" in proc.stdout


def test_warmup_and_cosine_step_the_lr_per_optimizer_step_and_are_saved(tmp_path):
    metrics = tmp_path / "m.jsonl"
    _, state = _weights_here(tmp_path, "--warmup-steps", "4", "--schedule", "cosine", "--metrics-jsonl", str(metrics))
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, 9))
    lrs = [m["lr"] for m in lines]
    # After optimizer step k the LR factor is that of step k: (k+1)/4 while warming up
    # (steps 0-3), then a cosine from 1 at step 4 to 0 at the last step, 8.
    expected = [1e-4 * (k + 1) / 4 for k in (1, 2, 3)] + [1e-4 * 0.5 * (1 + math.cos(math.pi * (k - 4) / 4))
                                                           for k in range(4, 9)]
    assert lrs == pytest.approx(expected, rel=1e-6, abs=1e-12)
    assert state["scheduler"]["last_epoch"] == 8


def test_the_metrics_log_has_one_line_per_step_with_every_field(tmp_path):
    metrics = tmp_path / "m.jsonl"
    _weights_here(tmp_path, "--metrics-jsonl", str(metrics), "--clip-norm", "1e9", "--accum", "2")
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(lines) == 4
    assert set(lines[0]) == {"step", "epoch", "loss", "lr", "grad_norm", "samples_per_s", "scale"}
    assert all(m["grad_norm"] > 0 and m["loss"] > 0 for m in lines)


def test_compile_trains_the_compiled_model_to_the_weights_of_the_eager_one(tmp_path):
    _, compiled = _weights_here(tmp_path / "compiled", "--compile", "--max-steps", "3")
    _, eager = _weights_here(tmp_path / "eager", "--max-steps", "3")
    from ddp_abci.autoencoder import build_model

    initial = build_model(seed=3).state_dict()  # SMALL's seed
    assert compiled["step"] == eager["step"] == 3
    for name, tensor in eager["model"].items():  # Inductor's kernels round differently in the last bits
        torch.testing.assert_close(compiled["model"][name], tensor, rtol=1e-4, atol=1e-4)
        assert not torch.equal(compiled["model"][name], initial[name])  # it trained


def test_compile_without_a_compiler_says_what_is_missing(monkeypatch):
    import shutil

    from ddp_abci.autoencoder import SimpleModule
    from ddp_abci.errors import UsageError
    from ddp_abci.model import compile_model

    monkeypatch.setattr(shutil, "which", lambda name: None)  # no g++, c++ or clang++ on PATH
    with pytest.raises(UsageError, match="--compile on the CPU needs a C\\+\\+ compiler"):
        compile_model(SimpleModule(), torch.device("cpu"))


def test_an_fp16_overflow_skips_the_step_and_leaves_weights_optimizer_and_schedule_untouched():
    # fp16 is refused on the CPU for real runs (slow); the CPU's fp16 autocast and
    # GradScaler("cpu") drive the same Trainer code that runs on GPUs. A scale of 2**127
    # makes the scaled loss overflow float32, as a too-high scale does on a GPU.
    from ddp_abci.autoencoder_job import AutoencoderJob
    from ddp_abci.config import TrainConfig
    from ddp_abci.parallel.launch import discover_launch
    from ddp_abci.trainer import Trainer

    config = TrainConfig(global_batch=50, warmup_steps=4, clip_norm=1.0)
    trainer = Trainer(config, discover_launch(environ={}), torch.device("cpu"), seed_job=AutoencoderJob(num_items=100))
    trainer.precision, trainer.built.scaler = "fp16", torch.amp.GradScaler("cpu", init_scale=2.0**127)
    scaler = trainer.built.scaler
    assert scaler.is_enabled() and scaler.get_scale() == 2.0**127  # the fp16 path, scaler on
    batch = next(iter(trainer.built.batches.loader))
    weights = {k: v.clone() for k, v in trainer.built.model.state_dict().items()}
    lr = trainer.built.optimizer.param_groups[0]["lr"]

    result = trainer.train_step([batch])
    assert result.skipped and trainer.built.scaler.get_scale() == 2.0**126
    assert all(torch.equal(weights[k], v) for k, v in trainer.built.model.state_dict().items())
    # Fused Adam with a scaler creates its state but counts no step and moves no moment.
    assert all(s["step"].item() == 0 and not s["exp_avg"].any() for s in trainer.built.optimizer.state.values())
    assert trainer.built.optimizer.param_groups[0]["lr"] == lr  # nor did the warm-up

    trainer.built.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    result = trainer.train_step([batch])
    assert not result.skipped and math.isfinite(result.grad_norm)
    assert trainer.built.optimizer.param_groups[0]["lr"] > lr


def test_a_trainer_held_without_with_exits_0_after_done_every_time(mpirun):
    # rc = Trainer(...).run() inside `with distributed(launch)`: DDP sits in reference cycles
    # and outlived the group, and gloo's work thread aborted the exit (134) 1 run in 8. That cause
    # is checked in every run; the exit itself in 4 (each launch costs 5 to 7 core-seconds).
    ends = [run(on_ranks(2, "tests/unmanaged_script.py")) for _ in range(4)]
    assert [proc.returncode for proc in ends] == [0] * 4, next(p.stdout for p in ends if p.returncode)
    assert all("done: 4 steps" in proc.stdout and "terminate called" not in proc.stdout for proc in ends)
    assert all(proc.stdout.count("0 DDP alive after the group closed") == 2 for proc in ends), ends[0].stdout
