"""The textbook script: the seed's job written as PyTorch's DDP tutorial teaches it
(pytorch/examples, distributed/ddp-tutorial-series/multinode.py), with no trick of this project's.

    mpirun -n 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 \
        python -m ddp_abci.compare.accelerate_env python -m ddp_abci.textbook --epochs 1

torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; under mpirun
mapped from Open MPI's by accelerate_env), DistributedSampler and a DataLoader over single
items, gloo's all-reduce on the CPU, torch's per-tensor Adam. The flags after --bs each apply
one of the raw trainer's choices, so that the benchmark can show where its lead comes from
(docs/benchmark.md, "where raw's lead comes from"); without them this is the tutorial's code.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

from ..autoencoder_job import AutoencoderJob
from ..cli import OneLineParser, add_options
from ..config import TrainConfig
from .accelerate_variant import SHARED_FLAGS
from .side_clock import SideClock, peak_rss_mib, write

# The raw trainer's choices, one flag each, in the order the benchmark applies them.
SWITCHES = (("--share-threads", "CPU threads shared out: cores / local ranks (parallel/process_group.cpu_threads)"),
            ("--mpi-hook", "gradients all-reduced through MPI (parallel/mpi_hook.py) instead of gloo"),
            ("--bucket-view", "gradients kept in DDP's all-reduce buckets (gradient_as_bucket_view): one copy less"),
            ("--fused-adam", "the fused Adam (one kernel per parameter group)"),
            ("--batched-fetch", "each batch made in one call (LinspaceDataset's batched_getitem)"),
            ("--direct-loader", "the sampler and dataset read directly, without the DataLoader's iterator"))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ddp_abci.textbook", description="The seed's job as the DDP tutorial writes it.")
    add_options(p, TrainConfig, only=SHARED_FLAGS, defaults={"amp": "no"})
    add_options(p, AutoencoderJob, only=("num_items", "dim_in", "dim_hidden"))
    for flag, help in SWITCHES:
        p.add_argument(flag, action="store_true", help=f"the raw trainer's choice: {help}")
    return p


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = build_parser().parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401  before the group: see parallel/process_group.py
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from ..autoencoder import LinspaceDataset, build_model, rmse_loss

    clock = SideClock(started)
    missing = [v for v in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:  # the tutorial's script reads torchrun's variables and nothing else
        print(f"error: the textbook script reads torchrun's variables, and these are not set: "
              f"{', '.join(missing)}; run it under torchrun, or under mpirun as python -m "
              "ddp_abci.compare.accelerate_env python -m ddp_abci.textbook (with -x MASTER_ADDR=<rank 0's host>)",
              file=sys.stderr, flush=True)
        return 2
    # ddp_setup(): torchrun's variables, env:// rendezvous; NCCL and one GPU a rank where there are GPUs
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    clock.mark("group")
    if args.share_threads:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))

    # load_train_objs() and prepare_dataloader()
    dataset = LinspaceDataset(args.dim_in, num_items=args.num_items)
    model = DDP(build_model(args.seed, args.dim_in, args.dim_hidden).to(device),
                device_ids=[local_rank] if device.type == "cuda" else None, gradient_as_bucket_view=args.bucket_view)
    if args.mpi_hook:
        from ..parallel.mpi_hook import register_mpi_hook

        register_mpi_hook(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.0, 0.99), fused=args.fused_adam or None)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.global_batch // world, sampler=sampler, shuffle=False,
                        pin_memory=torch.cuda.is_available(), num_workers=args.workers)
    batches = _batches(loader, sampler, dataset, args)
    clock.mark("ddp")

    # Trainer.train(): _run_epoch() over _run_batch()
    steps, loss_mean = 0, float("nan")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        loss_sum, count = torch.zeros((), device=device), 0
        for source in batches():
            source = source.to(device)
            optimizer.zero_grad()
            loss = rmse_loss(source, model(source))
            loss.backward()
            optimizer.step()
            loss_sum, count, steps = loss_sum + loss.detach(), count + 1, steps + 1
            clock.step_done(source.shape[0] * world)
            if args.max_steps and steps >= args.max_steps:
                break
        totals = torch.stack([loss_sum, torch.tensor(float(count), device=device)])
        dist.all_reduce(totals)
        loss_mean = (totals[0] / totals[1]).item()
        if rank == 0:
            print(f"[GPU{local_rank}] Epoch {epoch} | Batchsize: {args.global_batch // world} | Steps: {count} | "
                  f"loss {loss_mean:.4f}", flush=True)
        if args.max_steps and steps >= args.max_steps:
            break
    peaks = [None] * world
    dist.all_gather_object(peaks, peak_rss_mib())
    if rank == 0:
        switches = [flag for flag, _ in SWITCHES if getattr(args, flag[2:].replace("-", "_"))]
        write(args.summary_json, clock.summary("textbook", world, args.global_batch, "no", steps, loss_mean, peaks,
                                               device=str(device), torch=torch.__version__, switches=switches))
        if args.save_model:
            torch.save(model.module.state_dict(), args.save_model)
    del model, optimizer  # DDP freed before the group: see parallel/process_group.close_process_group
    gc.collect()
    dist.destroy_process_group()
    return 0


def _batches(loader, sampler, dataset, args):
    """The epoch's batches: the tutorial's `for source in self.train_data`, or, with the
    raw trainer's data switches, its own code (data.batch_fetcher, data.iterate)."""
    if not (args.batched_fetch or args.direct_loader):
        return lambda: iter(loader)
    from torch.utils.data import DataLoader
    from torch.utils.data.sampler import BatchSampler

    from ..data import batch_fetcher, iterate

    batched = DataLoader(batch_fetcher(dataset, batched=args.batched_fetch), batch_size=None,
                         sampler=BatchSampler(sampler, loader.batch_size, drop_last=False))
    return lambda: iterate(batched, direct=args.direct_loader)


if __name__ == "__main__":
    sys.exit(main())
