"""Run under mpirun -n 2 by test_watchdog.py: a fit() script whose loss_fn calls
torch.distributed.all_reduce on rank 0 only, at its third call (the others never join)."""
import sys

import torch
import torch.distributed as dist

from ddp_abci import TrainConfig, fit

calls = []


def loss_fn(model, x):
    calls.append(1)
    if dist.get_rank() == 0 and len(calls) == 3:
        dist.all_reduce(torch.ones(1))  # only rank 0 gets here: this is the line the verdict names
    return ((model(x) - x) ** 2).mean()


torch.manual_seed(0)
sys.exit(fit(torch.nn.Linear(4, 4), torch.randn(64, 4), loss_fn,
             TrainConfig(epochs=5, global_batch=8, timeout_s=float(sys.argv[1]), ckpt_dir=sys.argv[2])))
