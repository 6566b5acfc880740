"""Run under mpirun -n 2 by test_everyday_api.py: the Trainer held as scripts hold it without
`with Trainer(...)`: `rc = Trainer(...).run()` inside `with distributed(launch)`, then exit rc.
Says how many DistributedDataParallel objects outlived the group, before any collection."""
import gc
import sys

import torch

from ddp_abci import TrainConfig, Trainer, discover_launch, distributed

launch = discover_launch()
with distributed(launch) as device:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4))
    rc = Trainer(TrainConfig(epochs=1, global_batch=16), launch, device, model=torch.nn.Linear(4, 1), train_set=data,
                 loss_fn=lambda model, batch: model(batch[0]).pow(2).mean()).run()
alive = sum(isinstance(o, torch.nn.parallel.DistributedDataParallel) for o in gc.get_objects())
print(f"rank {launch.rank}: {alive} DDP alive after the group closed", flush=True)
sys.exit(rc)
