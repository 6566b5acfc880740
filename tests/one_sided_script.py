"""Run under mpirun -n 2 by test_watchdog.py: a fit() script whose loss_fn calls
torch.distributed.all_reduce on rank 0 only, at its third call (the others never join).
argv: --timeout, the checkpoint folder, and the seconds rank 0 waits before that call (rank 1's
own collective, DDP's in its next forward, then times out first)."""
import sys
import time

import torch
import torch.distributed as dist

from ddp_abci import TrainConfig, fit

calls = []
LATE_S = float(sys.argv[3])


def loss_fn(model, x):
    calls.append(1)
    if dist.get_rank() == 0 and len(calls) == 3:
        time.sleep(LATE_S)
        dist.all_reduce(torch.ones(1))  # only rank 0 gets here: this is the line the verdict names
    return ((model(x) - x) ** 2).mean()


torch.manual_seed(0)
sys.exit(fit(torch.nn.Linear(4, 4), torch.randn(64, 4), loss_fn,
             TrainConfig(epochs=5, global_batch=8, timeout_s=float(sys.argv[1]), ckpt_dir=sys.argv[2])))
