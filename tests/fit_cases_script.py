"""Run under mpirun by test_fit_mistakes.py: the DDP mistakes people bring to fit(), one
fit() call each, in one job (fit() runs again and again in one process). Rank 0 prints
`== case NAME: exit STATUS` on stderr after each, where fit()'s own error lines go, so the
test reads each case's lines between two markers; what the cases that train leave behind
(weights before and after, each rank's buffers) goes to CKPT_ROOT/facts.json.
usage: fit_cases_script.py CKPT_ROOT [CASE ...]
"""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from ddp_abci import TrainConfig, fit
from ddp_abci.parallel.launch import discover_launch

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
g = torch.Generator().manual_seed(0)
X, Y = torch.randn(64, 8, generator=g), torch.randn(64, 2, generator=g)
DATA = TensorDataset(X, Y)


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x):
        return self.used(x)


class BranchOnRank(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 2), nn.Linear(8, 2)

    def forward(self, x):
        y = self.a(x)
        return y + self.b(x) if RANK == 0 else y  # b used on rank 0 only


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.norm, self.out = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.lin(x))))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(DATA)


class ShapeChangesLater(Dataset):
    """Item 0 and the first batches look fine; item 61 (in rank 1's last batch) is longer."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.ones(9 if i == 61 else 8), torch.zeros(2)


class Ragged(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.ones(1 + i % 3), torch.zeros(2)


def pad(items):
    xs = nn.utils.rnn.pad_sequence([x for x, _ in items], batch_first=True)
    return torch.nn.functional.pad(xs, (0, 8 - xs.shape[1])), torch.stack([y for _, y in items])


def config(**kw):
    base = dict(epochs=2, global_batch=16, lr=1e-2, betas=(0.9, 0.999), seed=1, timeout_s=30)
    return TrainConfig(**{**base, **kw})


def linear():
    torch.manual_seed(0)
    return nn.Linear(8, 2)


def decay_split(params):  # the README's weight-decay split: two passes over the list
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=1e-2)


def saved(path):
    return lambda: torch.load(os.path.join(path, "last.pt"), weights_only=True)["model"]


# The two cases that open a group themselves, as a user's code would: bounded (torch's default
# is 30 minutes), so that a hang there fails the test with its traceback.
RAW_GROUP_TIMEOUT = timedelta(seconds=60)


def existing_group():
    launch = discover_launch()
    dist.init_process_group("gloo", init_method=launch.init_method, rank=launch.rank, world_size=launch.world_size,
                            timeout=RAW_GROUP_TIMEOUT)
    try:
        return fit(linear(), DATA, mse, config())
    finally:
        dist.destroy_process_group()


def wrapped_model():
    launch = discover_launch()
    dist.init_process_group("gloo", init_method=launch.init_method, rank=launch.rank, world_size=launch.world_size,
                            timeout=RAW_GROUP_TIMEOUT)
    model = nn.parallel.DistributedDataParallel(linear())
    dist.destroy_process_group()
    return fit(model, DATA, mse, config())


FACTS = {}


def remember(case, model, fn):
    """Run fn (a fit() call) and record the model's weights before and after, on rank 0, and
    every rank's buffers (through MPI: fit() has closed the process group)."""
    from mpi4py import MPI

    before = {k: v.clone() for k, v in model.state_dict().items()}
    status = fn(model)
    after = model.state_dict()
    FACTS[case] = {"changed": {k: not torch.equal(before[k], after[k]) for k in before},
                   "buffer_sums": MPI.COMM_WORLD.allgather([b.double().sum().item() for b in model.buffers()])}
    return status


def main():
    root = sys.argv[1]
    d = lambda case: os.path.join(root, case)  # noqa: E731
    cases = {
        "unused-layer": lambda: fit(WithUnused(), DATA, mse, config()),
        "unused-on-some-ranks": lambda: fit(BranchOnRank(), DATA, mse, config()),
        "find-unused-parameters": lambda: remember("find-unused-parameters", WithUnused(), lambda m: fit(
            m, DATA, mse, config(find_unused_parameters=True, ckpt_dir=d("find")))),
        "weight-decay-split": lambda: remember("weight-decay-split", linear(), lambda m: fit(
            m, DATA, mse, config(ckpt_dir=d("decay")), optimizer=decay_split)),
        "optimizer-class": lambda: fit(linear(), DATA, mse, config(ckpt_dir=d("sgd")), optimizer=torch.optim.SGD),
        "factory-returns-str": lambda: fit(linear(), DATA, mse, config(), optimizer=lambda params: "adam"),
        "factory-returns-scheduler": lambda: fit(linear(), DATA, mse, config(), optimizer=lambda params: (
            torch.optim.lr_scheduler.StepLR(torch.optim.SGD(params, lr=0.1), 1))),
        "optimizer-instance": lambda: fit(linear(), DATA, mse, config(),
                                          optimizer=torch.optim.Adam(nn.Linear(8, 2).parameters())),
        "group-without-params": lambda: fit(linear(), DATA, mse, config(),
                                            optimizer=lambda params: torch.optim.SGD([{"lr": 0.1}], lr=0.1)),
        "bias-left-out": lambda: fit(linear(), DATA, mse, config(), optimizer=lambda params: torch.optim.SGD(
            (p for p in params if p.ndim >= 2), lr=0.1)),
        "stream-cosine-without-length": lambda: fit(linear(), Stream(), mse, config(schedule="cosine")),
        "ragged-items": lambda: fit(linear(), Ragged(), mse, config()),
        "ragged-items-collated": lambda: fit(linear(), Ragged(), mse, config(ckpt_dir=d("ragged")), collate_fn=pad),
        "batchnorm-last-batch-of-one": lambda: fit(WithNorm(), TensorDataset(X[:34], Y[:34]), mse,
                                                   config(global_batch=16, epochs=1)),
        "batchnorm-drop-last": lambda: fit(WithNorm(), TensorDataset(X[:34], Y[:34]), mse,
                                           config(global_batch=16, epochs=2, drop_last=True, ckpt_dir=d("drop"))),
        "batchnorm-statistics": lambda: remember("batchnorm-statistics", WithNorm(), lambda m: fit(
            m, DATA, mse, config(ckpt_dir=d("norm"), eval_every=2), eval_set=DATA)),
        "sync-batchnorm-on-cpu": lambda: fit(WithNorm(), DATA, mse, config(sync_batchnorm=True)),
        "detached-loss": lambda: fit(linear(), DATA, lambda model, batch: mse(model, batch).detach(), config()),
        "existing-process-group": existing_group,
        "ddp-wrapped-model": wrapped_model,
        "metric-returns-a-mean": lambda: fit(linear(), DATA, mse, config(eval_every=1), eval_set=DATA,
                                             metrics={"mae": lambda model, b: (model(b[0]) - b[1]).abs().mean()}),
        "metric-returns-a-float": lambda: fit(linear(), DATA, mse, config(eval_every=1), eval_set=DATA,
                                              metrics={"one": lambda model, b: 1.0}),
        # Not in the default list: it ends the job (one rank's failure ends every rank).
        "shape-changes-later": lambda: fit(linear(), ShapeChangesLater(), mse, config(split="contiguous")),
    }
    for case in sys.argv[2:] or [c for c in cases if c != "shape-changes-later"]:
        status = cases[case]()
        if RANK == 0:
            print(f"== case {case}: exit {status}", file=sys.stderr, flush=True)
    if RANK == 0:
        with open(os.path.join(root, "facts.json"), "w") as f:
            json.dump(FACTS, f)


if __name__ == "__main__":
    main()
