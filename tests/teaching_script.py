"""Run under mpirun -n 2 by test_teaching.py: what Accelerate 1.16 does in a distributed job,
beside what the raw code here does, recorded as facts. usage: teaching_script.py OUT.json

Each fact is what one rank observed; rank 0 gathers them and writes OUT.json. Accelerate's
state is a singleton, so each Accelerator is made after the previous one is reset.
"""
import contextlib
import io
import json
import os
import sys

import torch
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK = COMM.Get_rank()
facts: dict = {}


def record(name, value):
    facts[name] = COMM.gather(value, root=0)


def fresh_accelerator(**kwargs):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(cpu=True, **kwargs)


# -- process start: what Accelerate reads and writes -------------------------------------
env_before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
if RANK == 1:
    os.environ["LOCAL_RANK"] = "0"  # as if rank 1 ran on a second node (the per-node print below)
    os.environ["LOCAL_WORLD_SIZE"] = "1"
from accelerate import Accelerator  # noqa: E402

accelerator = Accelerator(cpu=True)
record("env_before", env_before)
record("env_after", {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")})
record("process_index", accelerator.process_index)
record("num_processes", accelerator.num_processes)
record("backend", torch.distributed.get_backend())
record("threads", torch.get_num_threads())

# -- the epoch loss: each rank's own, or the mean over ranks --------------------------------
from ddp_abci.parallel.collectives import reduce  # noqa: E402

own = torch.tensor(float(RANK + 1))  # each rank's epoch loss differs
record("loss_own_and_means", [own.item(), accelerator.reduce(own, "mean").item(), reduce(own, "mean").item()])

# -- print: once per node (on each node's local main process) ------------------------------

from ddp_abci.parallel.collectives import print_main, print_per_node  # noqa: E402
from ddp_abci.parallel.launch import Launch  # noqa: E402

as_if_two_nodes = Launch(RANK, 2, 0, 1, "127.0.0.1", 1, "test")  # each rank alone on its node
printed = {}
for name, call in (("accelerate", lambda: accelerator.print("x")),
                   ("print_main", lambda: print_main(as_if_two_nodes, "x")),
                   ("print_per_node", lambda: print_per_node(as_if_two_nodes, "x"))):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    printed[name] = out.getvalue() == "x\n"
record("printed", printed)

# -- the prepared scheduler: num_processes steps per optimizer step (split_batches off) ------
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
model(torch.ones(1, 4)).sum().backward()
optimizer.step()
scheduler.step()
record("scheduler_last_epoch_after_one_step", scheduler.scheduler.last_epoch)

# -- the compile order: the DDP-wrapped model is compiled -----------------------------------
accelerator = fresh_accelerator(dynamo_backend="inductor")
prepared = accelerator.prepare(torch.nn.Linear(4, 2))  # compile is lazy: nothing runs here
record("accelerate_compiled", [type(prepared).__name__, type(getattr(prepared, "_orig_mod", prepared)).__name__])

# -- the prepared DataLoader reads one batch ahead; inside accumulate() its last batch syncs --
from accelerate.utils import DataLoaderConfiguration  # noqa: E402

accelerator = fresh_accelerator(gradient_accumulation_steps=2,
                                dataloader_config=DataLoaderConfiguration(split_batches=True))
data = torch.utils.data.TensorDataset(torch.arange(10.0).reshape(10, 1))  # 5 global batches of 2
model = accelerator.prepare(torch.nn.Linear(1, 1))
loader = accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=2))
seen = []
for _batch in loader:
    with accelerator.accumulate(model):
        seen.append([accelerator.gradient_state.end_of_dataloader, accelerator.sync_gradients,
                     model.require_backward_grad_sync])
record("lookahead", seen)

# -- the raw trainer: the same compile order, and its short last group ------------------------
from ddp_abci.autoencoder_job import AutoencoderJob  # noqa: E402
from ddp_abci.config import TrainConfig  # noqa: E402
from ddp_abci.parallel.launch import discover_launch  # noqa: E402
from ddp_abci.trainer import Trainer  # noqa: E402

accelerator.end_training()  # the Trainer opens its own group; Accelerate's must go first
record("group_after_end_training", torch.distributed.is_initialized())
os.environ.pop("LOCAL_RANK")
os.environ.pop("LOCAL_WORLD_SIZE")
os.environ.pop("MASTER_PORT")  # Accelerate's store may still hold it: rank 0 picks a free one
launch = discover_launch()
from ddp_abci.parallel.process_group import distributed  # noqa: E402
from ddp_abci.steps import grad_sync  # noqa: E402

with distributed(launch) as device:
    config = TrainConfig(compile=True, global_batch=10)
    with Trainer(config, launch, device, seed_job=AutoencoderJob(num_items=40)) as t:
        record("raw_compiled", [type(t.model).__name__, type(t.model._orig_mod).__name__])
    # The epoch loss the trainer prints: rank r's loss is r + 1 on every item, the mean over ranks 1.5.
    out = io.StringIO()
    with contextlib.redirect_stdout(out), Trainer(
            TrainConfig(epochs=1, global_batch=2), launch, device, model=torch.nn.Linear(1, 1),
            train_set=torch.ones(2, 1), loss_fn=lambda model, x: model(x).sum() * 0 + RANK + 1) as t:
        t.run()
    line = [x for x in out.getvalue().splitlines() if x.startswith("epoch 1/1")]
    record("raw_epoch_loss", float(line[0].split("loss ")[1].split(",")[0]) if line else None)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    raw_sync = []
    for last in (False, True):
        with grad_sync(ddp, last):
            raw_sync.append(ddp.require_backward_grad_sync)
    record("raw_sync", raw_sync)
    del ddp
record("group_after_close", torch.distributed.is_initialized())

if RANK == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(facts, f)
