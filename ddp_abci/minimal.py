"""The seed's training script with raw torch.distributed instead of Accelerate, in one file.

    mpirun -n 2 python -m ddp_abci.minimal --epochs 1 --seed 0 --save-model a.pt

It imports only torch, numpy and mpi4py, so it can be copied alone. Each block names the
Accelerate call it replaces and the ddp_abci function that does the same with what
production needs (checkpoints, stop signals, errors in one line, multi-node address).
"""
import argparse
import gc
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional  # noqa: F401  before the group opens: imported later (DDP does) it pins the group
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class SimpleModule(nn.Module):  # the seed's model: Linear 1000 -> 100 -> 1000
    def __init__(self, dim_in=1000, dim_hidden=100):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim_in, dim_hidden), nn.Linear(dim_hidden, dim_in))

    def forward(self, x):
        return self.net(x)


class DummyDataset(Dataset):  # the seed's data: item i is linspace(0, i, 1000) in float32
    def __init__(self, dim=1000, num_data=10000):
        self.dim, self.num_data = dim, num_data

    def __len__(self):
        return self.num_data

    def __getitem__(self, idx):
        return torch.from_numpy(np.linspace(0, idx, self.dim).astype(np.float32))


def main():
    p = argparse.ArgumentParser(prog="python -m ddp_abci.minimal")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--bs", type=int, default=50, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--amp", default="fp16", choices=["no", "fp16", "bf16"], help="fp16 falls back to fp32 on the CPU")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-model", default=None, help="rank 0 saves the trained state_dict here")
    args = p.parse_args()

    # Accelerator(): who am I -- launch.discover_launch() (mpi4py, or torchrun/Slurm variables)
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks on this host
    local_rank, local_world = node.Get_rank(), node.Get_size()
    # Accelerator(): rank 0's address and a free port, sent to all -- rendezvous.choose_master_addr()
    addr = port = None
    if rank == 0:
        addr = socket.gethostbyname(socket.gethostname()) if world > 1 else "127.0.0.1"
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    addr, port = comm.bcast((addr, port), root=0)

    # Accelerator(): the process group, NCCL on GPUs, gloo on the CPU -- process_group.open_process_group()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # before init: NCCL binds to the current device
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # the host's cores, shared out
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=world, device_id=device if cuda else None)

    # Accelerator(mixed_precision=...): autocast dtype and GradScaler -- precision.resolve_precision()
    amp = "no" if args.amp == "fp16" and not cuda else args.amp
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")

    # SimpleModule(...) + prepare(model): seeded build, DDP -- model.build_model(), model.wrap_model()
    torch.manual_seed(args.seed)  # every rank builds the same weights (DDP broadcasts rank 0's too)
    model = DDP(SimpleModule().to(device), device_ids=[local_rank] if cuda else None)

    # DataLoader(...) + prepare(dataloader) with split_batches: --bs is the global batch -- data.build_loader()
    if args.bs % world:
        raise SystemExit(f"error: --bs {args.bs} does not divide by {world} ranks")
    dataset = DummyDataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.bs // world, sampler=sampler, pin_memory=cuda)

    # torch.optim.Adam + prepare(optimizer) -- model.autoencoder_optimizer(); the scaler steps it below
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.0, 0.99))

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # prepare(dataloader) reshuffles each epoch -- ShardBatchSampler.start_epoch()
        loss_sum, steps = torch.zeros((), device=device), 0
        for x in loader:
            x = x.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            # the prepared model's autocast forward -- precision.autocast()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = ((x - model(x)) ** 2).mean().sqrt()  # the seed's RMSE
            # accelerator.backward(loss): scaled backward; DDP all-reduces the gradients -- Trainer.train_step()
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # optimizer.step() of the prepared optimizer
            scaler.update()
            loss_sum, steps = loss_sum + loss.detach(), steps + 1
        # print on is_main_process: the epoch loss over all ranks, not rank 0's -- Trainer._epoch_report()
        totals = torch.stack([loss_sum.float(), torch.tensor(float(steps), device=device)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"Epoch {epoch + 1} : {(totals[0] / totals[1]).item():.4f}", flush=True)

    # accelerator.save(unwrap_model(model).state_dict(), path) on the main process -- run_end.save_model()
    if args.save_model and rank == 0:
        torch.save(model.module.state_dict(), args.save_model)
    # end_training(): free DDP, then close the group -- process_group.close_process_group()
    del model, optimizer
    gc.collect()  # DDP's reducer sits in reference cycles: free it, or gloo's threads outlive the group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
