"""Benchmark probes: what this machine allows, measured the same way the trainers run.

    python -m ddp_abci.compare.probes floor --bs 50            # one process, data in memory
    mpirun -n 2 python -m ddp_abci.compare.probes floor --bs 25 --threads 1 --lockstep
                                                             # every rank at once, gradients all-reduced
    mpirun -n 2 python -m ddp_abci.compare.probes floor --bs 25 --threads 1 --ddp
                                                             # the same through DDP, as the trainer runs it
    mpirun -n 2 python -m ddp_abci.compare.probes floor --bs 25 --threads 1 --ddp --data
                                                             # the same, each batch read as the trainer reads it
    mpirun -n 2 python -m ddp_abci.compare.probes allreduce    # the gradient all-reduce alone

Each prints one JSON line. The benchmark runs them and reports each trainer's throughput
as a fraction of the floor, and the all-reduce time against the step time. A floor's rate
is its whole timed loop's, as a trainer's is; an all-reduce's time is its fastest block's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def compute_floor(global_batch: int, steps: int, threads: int | None, amp: str, lockstep: bool = False,
                  ddp: bool = False, data: bool = False) -> dict:
    """Forward, backward and Adam step of the seed's model in a tight loop on one process,
    the batch already in memory: no loader, no communication. The throughput no trainer
    on this machine can beat.

    lockstep (under mpirun, CPU): every step also averages the gradients over the ranks with
    one in-place MPI Allreduce, as DDP must, so the ranks wait for each other every step:
    what a synchronous data-parallel step costs here without DDP, the loader or the trainer
    (and without overlapping the all-reduce with backward, which one thread a rank rules out).

    ddp (under mpirun): the same loop with the model in DDP as the trainer wraps it
    (model.wrap_model, and on the CPU the MPI comm hook): what keeping DDP costs a step,
    still without the loader or the trainer's code.

    data (with ddp): each step's batch read from the seed's training set as the trainer reads
    it (its sampler and batched fetch, no loader workers), in place of one batch kept in
    memory: the DDP floor with the data's own cost, still without the trainer's code."""
    import torch

    if ddp:
        return _ddp_floor(global_batch, steps, threads, amp, data)
    if threads:
        torch.set_num_threads(threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if lockstep and device.type != "cpu":
        return {"probe": "floor", "failed": True, "tail": "the lockstep floor is a CPU probe (MPI on host memory)"}
    return _floor_loop(None, global_batch, steps, amp, device, lockstep)


def _ddp_floor(global_batch: int, steps: int, threads: int | None, amp: str, data: bool = False) -> dict:
    import gc

    import torch

    from ..autoencoder import build_model
    from ..parallel.comm_choice import measure_and_choose
    from ..parallel.launch import discover_launch
    from ..parallel.process_group import distributed
    from ..plan import resolve_comm

    launch = discover_launch()
    with distributed(launch) as device:
        if threads:
            torch.set_num_threads(threads)
        comm, measured_ms = resolve_comm("auto", launch, device), None
        if comm == "measure":  # as the trainer chooses: by measuring the seed model's gradient
            path = measure_and_choose(4 * sum(p.numel() for p in build_model(0).parameters()))[0]
            comm, measured_ms = path.name, path.measured_ms
        result = _floor_loop(launch, global_batch, steps, amp, device, lockstep=False, comm=comm,
                             batches=_seed_batches(launch, global_batch) if data else None)
        gc.collect()  # DDP's reducer sits in reference cycles: free it while the group is open
    return dict(result, comm=comm, measured_ms=measured_ms, data=data)


def _seed_batches(launch, per_rank: int, num_items: int | None = None):
    """This rank's batches of the seed's training set (of num_items; the seed's by default),
    read as the trainer reads them (its sampler, the dataset's batched fetch, no loader
    workers), epoch after epoch."""
    from ..autoencoder import LinspaceDataset
    from ..autoencoder_job import AutoencoderJob
    from ..data import EpochBatches, build_loader

    job = AutoencoderJob()
    batches, epoch = EpochBatches(build_loader(LinspaceDataset(job.dim_in, num_items or job.num_items), launch,
                                               per_rank * launch.world_size)), 0
    while True:
        yield from batches.begin(epoch)
        epoch += 1


def _floor_loop(launch, global_batch: int, steps: int, amp: str, device, lockstep: bool,
                comm: str | None = None, batches=None) -> dict:
    """The timed loop; the model in DDP when a launch is given, its gradients through MPI
    where comm (resolve_comm's choice) is mpi, as the trainer does; each step's batch from
    `batches` (an iterator) when given, else one batch kept in memory."""
    import torch

    from ..autoencoder import LinspaceDataset, build_model, build_optimizer, rmse_loss
    from ..model import wrap_model
    from ..parallel.gradients import gradient_path
    from ..precision import autocast, make_scaler, resolve_precision

    precision = resolve_precision(amp, device)
    model = build_model(0).to(device)
    if launch is not None:
        model = wrap_model(model, device, launch.world_size)
        if comm is not None:
            gradient_path(comm).register(model)
    optimizer = build_optimizer(model, 1e-4, (0.0, 0.99))
    scaler = make_scaler(precision, device)
    x = LinspaceDataset()[list(range(global_batch))].to(device)
    flat_grads = _flat_grads(model) if lockstep else None

    def step() -> None:
        batch = x if batches is None else next(batches)
        with autocast(precision, device):
            loss = rmse_loss(batch, model(batch))
        if flat_grads is None:
            optimizer.zero_grad(set_to_none=True)
        else:
            flat_grads.zero_()  # keep the gradients as views of the one buffer MPI reduces
        scaler.scale(loss).backward()
        if flat_grads is not None:
            _mpi_average(flat_grads)
        scaler.step(optimizer)
        scaler.update()

    # The whole timed loop's rate, as a trainer's samples/s is its whole loop's (the first
    # step aside): a floor from its fastest block alone would be a best case that no
    # trainer measured over minutes can match (on a shared VM the fastest block runs well
    # ahead of the loop's mean: docs/benchmark.md). The fastest block is kept beside it.
    mean_ms, best_ms = _time(step, steps, device, warmup=20)  # warm-up: allocator, kernels, Adam state
    return {"probe": "floor", "samples_per_s": 1e3 * global_batch / mean_ms, "step_ms": mean_ms,
            "best_block_samples_per_s": 1e3 * global_batch / best_ms, "best_block_step_ms": best_ms,
            "steps": steps, "threads": torch.get_num_threads(), "device": str(device), "precision": precision}


def _flat_grads(model):
    """One buffer with every parameter's .grad a view into it, as DDP's
    gradient_as_bucket_view does per bucket: the all-reduce then copies nothing in or out,
    so the probe pays no cost the trainer does not."""
    import torch

    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def _mpi_average(flat) -> None:
    from mpi4py import MPI

    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
    flat.div_(MPI.COMM_WORLD.Get_size())


def allreduce_time(iters: int, backends: list[str], dim_in: int = 1000, dim_hidden: int = 100) -> dict:
    """Time of one all-reduce of a buffer the size of the model's gradients, on the
    process group (gloo or NCCL, as DDP uses it) and through mpi4py when available."""
    import torch
    import torch.distributed as dist

    from ..autoencoder import SimpleModule
    from ..parallel.launch import discover_launch
    from ..parallel.process_group import distributed

    numel = sum(p.numel() for p in SimpleModule(dim_in, dim_hidden).parameters())
    launch = discover_launch()
    out = {"probe": "allreduce", "world_size": launch.world_size, "bytes": numel * 4}
    with distributed(launch) as device:
        buf = torch.ones(numel, device=device)
        if "pg" in backends:
            out[f"{dist.get_backend()}_ms"] = fastest(lambda: dist.all_reduce(buf), iters, device)
            flag = torch.zeros(1, dtype=torch.int32, device=device)
            out[f"stop_flag_{dist.get_backend()}_ms"] = fastest(lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX),
                                                                iters, device)
        if "mpi" in backends and device.type == "cpu":
            from mpi4py import MPI

            from ..parallel.mpi_hook import mpi_max_vector

            arr = buf.numpy()
            out["mpi_ms"] = fastest(lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM), iters, device)
            out["stop_flag_mpi_ms"] = fastest(lambda: mpi_max_vector([0, 0]), iters, device)
    if launch.is_main:
        return out
    return {}


def _time(fn, iters: int, device, warmup: int = 10, blocks: int = 5) -> tuple[float, float]:
    """Milliseconds per call of fn after `warmup` calls, in `blocks` blocks of iters/blocks
    calls, the device synchronised around each: (the mean over all blocks, the fastest block)."""
    for _ in range(warmup):
        fn()
    per_block, times = max(1, iters // blocks), []
    for _ in range(blocks):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(per_block):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / per_block)
    return 1e3 * sum(times) / len(times), 1e3 * min(times)


def fastest(fn, iters: int, device) -> float:
    """The fastest block's milliseconds per call: the latency of one all-reduce is a limit,
    and on a shared machine interference only ever slows a block down."""
    return _time(fn, iters, device)[1]


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.compare.probes")
    sub = p.add_subparsers(dest="probe", required=True)
    f = sub.add_parser("floor")
    f.add_argument("--bs", type=int, default=50)
    f.add_argument("--steps", type=int, default=300)
    f.add_argument("--threads", type=int, default=None)
    f.add_argument("--amp", default="auto")
    f.add_argument("--lockstep", action="store_true", help="all-reduce the gradients over MPI every step")
    f.add_argument("--ddp", action="store_true", help="the model in DDP, as the trainer wraps it (under mpirun)")
    f.add_argument("--data", action="store_true", help="with --ddp: each batch read from the seed's set as the "
                                                       "trainer reads it")
    a = sub.add_parser("allreduce")
    a.add_argument("--iters", type=int, default=300)
    a.add_argument("--backends", default="pg,mpi")
    a.add_argument("--dim-in", type=int, default=1000)
    a.add_argument("--dim-hidden", type=int, default=100)
    args = p.parse_args(argv)
    if args.probe == "floor":
        result = compute_floor(args.bs, args.steps, args.threads, args.amp, args.lockstep, args.ddp, args.data)
    else:
        result = allreduce_time(args.iters, args.backends.split(","), args.dim_in, args.dim_hidden)
    if result:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
