"""Run under mpirun -n 2 by test_collective_rules.py: every collective each rank makes, recorded,
over the configurations that change which ones the Trainer makes. usage: SCRIPT OUT_DIR

torch.distributed's collectives and the MPI paths (the gradient hook, the control all-reduce)
are wrapped to append their names to this rank's sequence; each configuration is one fit();
each rank writes OUT_DIR/rank-R.json: {configuration: [its exit status, the names in order]}.
"""
import errno
import functools
import json
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import ddp_abci.checkpointing.checkpoint as ckpt
from ddp_abci import TrainConfig, fit
from ddp_abci.autoencoder_job import AutoencoderJob
from ddp_abci.parallel import gradients, mpi_hook
from ddp_abci.parallel.signals import StopRequest

out, rank = Path(sys.argv[1]), int(__import__("os").environ["OMPI_COMM_WORLD_RANK"])
sequence: list[str] = []


def recorded(name, call):
    @functools.wraps(call)  # DDP checks a hook's signature
    def wrapper(*args, **kwargs):
        sequence.append(name)
        return call(*args, **kwargs)
    return wrapper


for name in ("all_reduce", "broadcast", "all_gather", "all_gather_object", "broadcast_object_list", "gather_object",
             "barrier", "reduce", "gather", "scatter", "all_to_all"):
    setattr(dist, name, recorded(name, getattr(dist, name)))
mpi_hook.mpi_allreduce_hook = recorded("mpi gradient all-reduce", mpi_hook.mpi_allreduce_hook)
gradients.MPIGradients.max_vector = recorded("mpi control all-reduce", gradients.MPIGradients.max_vector)
gradients.MPIGradients.sum_vector = recorded("mpi control all-reduce", gradients.MPIGradients.sum_vector)


class StopOnRankOne:
    """loss_fn that asks for a stop on rank 1 only, at its 6th call (the ranks must agree)."""

    def __init__(self, stop):
        self.stop, self.calls = stop, 0

    def __call__(self, model, x):
        self.calls += 1
        if rank == 1 and self.calls == 6:
            self.stop.received = signal.SIGUSR1
        return ((model(x) - x) ** 2).mean()


def failing_after(saves):
    real, done = ckpt.save_atomic, []

    def save(state, path):
        if len(done) >= saves:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        done.append(path)
        return real(state, path)
    return save


base = dict(epochs=2, global_batch=20, timeout_s=30)
job = AutoencoderJob(num_items=200, dim_in=16, dim_hidden=4)
results = {}
CONFIGURATIONS = {
    # plain pins the MPI hook: --comm auto (the others) measures MPI against gloo at the start,
    # and on a busy machine a sub-millisecond measurement once came out for gloo (a fresh clone's run)
    "plain": ({"comm": "mpi"}, {}),
    "gloo": ({"comm": "gloo"}, {}),
    "checkpoints every 3 steps": ({"ckpt_dir": str(out / "ck"), "save_every_steps": 3}, {}),
    "synchronous checkpoints": ({"ckpt_dir": str(out / "ck-sync"), "async_save": False}, {}),
    "evaluation and summary": ({"eval_every": 1, "summary_json": str(out / "summary.json")}, {}),
    "a stop asked on rank 1": ({"ckpt_dir": str(out / "ck-stop")}, {"stop": True}),
    "a save that fails": ({"ckpt_dir": str(out / "ck-full"), "save_every_steps": 2}, {"fail_after": 2}),
}
for name, (config, extra) in CONFIGURATIONS.items():
    sequence.clear()
    original = ckpt.save_atomic
    if "fail_after" in extra and rank == 0:
        ckpt.save_atomic = failing_after(extra["fail_after"])
    with StopRequest() as stop:
        loss_fn = StopOnRankOne(stop) if extra.get("stop") else None
        if loss_fn is not None:
            torch.manual_seed(0)
            parts = job.build(0, 0)
            status = fit(parts.model, parts.train_set, loss_fn, TrainConfig(**base, **config), stop=stop)
        else:
            status = fit(config=TrainConfig(**base, **config), seed_job=job, stop=stop)
    ckpt.save_atomic = original
    results[name] = [status, list(sequence)]
(out / f"rank-{rank}.json").write_text(json.dumps(results))
