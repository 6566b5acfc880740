"""Fabric variant: the seed's job on Lightning Fabric 2.6, for comparison.

    mpirun -n 2 python -m ddp_abci.fabric_variant --epochs 1

Fabric runs under mpirun through its own MPIEnvironment (rank and size from mpi4py, rank 0's
host and a free port broadcast to all), without mpirun as one process (the GPU check), with
the DDP strategy (CPU or one GPU a rank) and the same model, data,
global batch, loss and optimizer as the other sides: the seed's autoencoder, LinspaceDataset,
RMSE, Adam (0, 0.99) in torch's per-tensor loop. Each rank takes every W-th item of each
global batch through a DistributedSampler, as the raw trainer's default split. Written as a
Fabric user would; only the benchmark's stopwatch (compare/side_clock.py) is ours.

lightning is imported only when this module runs: an optional extra (`bench`).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

from ..autoencoder_job import AutoencoderJob
from ..cli import OneLineParser, add_options, report
from ..config import TrainConfig
from ..errors import UsageError
from .accelerate_variant import SHARED_FLAGS
from .side_clock import SideClock, peak_rss_mib, write


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ddp_abci.fabric_variant",
                      description="The seed's job on Lightning Fabric, for comparison with ddp_abci.train.")
    add_options(p, TrainConfig, only=SHARED_FLAGS, defaults={"amp": "no"})
    add_options(p, AutoencoderJob, only=("num_items", "dim_in", "dim_hidden"))
    return p


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = build_parser().parse_args(argv)
    if args.amp != "no":
        return report(UsageError("the Fabric side compares fp32 on the CPU: use --amp no"))
    return run(args, started)


def run(args: argparse.Namespace, process_started: float) -> int:
    import lightning.fabric as L
    import torch
    import torch.distributed.nn.functional  # noqa: F401  before the group: see parallel/process_group.py
    from lightning.fabric.plugins.environments import MPIEnvironment
    from torch.utils.data import DataLoader, DistributedSampler

    from ..autoencoder import LinspaceDataset, build_model, rmse_loss

    clock = SideClock(process_started)
    accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    if "OMPI_COMM_WORLD_SIZE" in os.environ:  # under mpirun
        environment = MPIEnvironment()
        fabric = L.Fabric(accelerator=accelerator, strategy="ddp", devices=environment.world_size(), num_nodes=1,
                          plugins=[environment], precision="32-true")
    else:
        fabric = L.Fabric(accelerator=accelerator, devices=1, precision="32-true")
    fabric.launch()  # under mpirun: nothing to launch, the group opens here
    clock.mark("group")
    world = fabric.world_size
    if args.global_batch % world:
        return report(UsageError(f"global batch {args.global_batch} does not divide by world size {world}"))
    model = build_model(args.seed, args.dim_in, args.dim_hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.0, 0.99))
    model, optimizer = fabric.setup(model, optimizer)
    dataset = LinspaceDataset(args.dim_in, num_items=args.num_items)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=fabric.global_rank, shuffle=True, seed=args.seed)
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=args.global_batch // world, sampler=sampler,
                                                 num_workers=args.workers), use_distributed_sampler=False)
    clock.mark("ddp")
    fabric.print(f"fabric variant: world size {world}, strategy ddp, global batch {args.global_batch}")

    steps, loss_mean = 0, float("nan")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        loss_sum, batches = torch.zeros((), device=fabric.device), 0
        for x in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = rmse_loss(x, model(x))
            fabric.backward(loss)
            optimizer.step()
            loss_sum, batches, steps = loss_sum + loss.detach(), batches + 1, steps + 1
            clock.step_done(x.shape[0] * world)
            if args.max_steps and steps >= args.max_steps:
                break
        loss_mean = fabric.all_reduce(loss_sum / max(batches, 1), reduce_op="mean").item()
        fabric.print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_mean:.4f} (mean over ranks), global step {steps}")
        if args.max_steps and steps >= args.max_steps:
            break
    peaks = [peak_rss_mib()] * world
    if torch.distributed.is_initialized():
        torch.distributed.all_gather_object(peaks, peak_rss_mib())
    if fabric.global_rank == 0:
        import lightning

        write(args.summary_json, clock.summary("fabric", world, args.global_batch, "no", steps, loss_mean, peaks,
                                               device=str(fabric.device), torch=torch.__version__,
                                               lightning=lightning.__version__))
        if args.save_model:
            torch.save(getattr(model, "module", model).state_dict(), args.save_model)
    if world > 1:
        fabric.barrier()
    # Free DDP before the group goes (see parallel/process_group.close_process_group), then end it:
    # Fabric 2.6 ends only an NCCL group itself, at exit (lightning/fabric/utilities/distributed.py,
    # _init_dist_connection registers _destroy_dist_connection for "nccl"); gloo's it leaves open.
    del model, optimizer, loader
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
