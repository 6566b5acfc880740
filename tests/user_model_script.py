"""Run under mpirun by test_user_models.py: a model, dataset and loss the library did not write,
trained through ddp_abci.fit. usage: user_model_script.py KIND CKPT_DIR [options]

KIND: tuples (x, y) items and a per-item MSE; dicts ({"a", "b", "y"} items, a model with
BatchNorm whose forward takes two inputs); or a broken input: bad-item, vector-loss, raising-loss.
"""
import argparse
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from ddp_abci import TrainConfig, fit


class Pairs(Dataset):
    """x in R^8, y = a fixed linear map of x; with noise, y draws from numpy's global RNG."""

    def __init__(self, n=96, noise=False):
        g = torch.Generator().manual_seed(1)
        self.x, self.w, self.noise = torch.randn(n, 8, generator=g), torch.randn(8, 2, generator=g), noise

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        y = self.x[i] @ self.w
        if self.noise:
            y = y + float(np.random.normal(scale=0.1))
        return self.x[i], y


class Dicts(Pairs):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return {"a": x[:4], "b": x[4:], "y": y}


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 16), nn.Linear(4, 16)
        self.norm, self.out = nn.BatchNorm1d(16), nn.Linear(16, 2)

    def forward(self, a, b):
        return self.out(torch.relu(self.norm(self.a(a) + self.b(b))))


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def dict_mse(model, batch):
    return ((model(batch["a"], batch["b"]) - batch["y"]) ** 2).mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind")
    p.add_argument("ckpt_dir")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--bs", type=int, default=16)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--noise", action="store_true")
    args = p.parse_args()
    config = TrainConfig(epochs=args.epochs, global_batch=args.bs, lr=1e-2, betas=(0.9, 0.999), seed=5,
                         ckpt_dir=args.ckpt_dir, resume=args.resume, max_steps=args.max_steps, stop_check_every=1)
    torch.manual_seed(0)
    model, data, loss = nn.Linear(8, 2), Pairs(noise=args.noise), mse
    if args.kind == "dicts":
        model, data, loss = TwoInputs(), Dicts(noise=args.noise), dict_mse
    elif args.kind == "bad-item":
        data = [("a text", object())] * 96  # default_collate batches strings, not objects
    elif args.kind == "vector-loss":
        loss = lambda model, batch: (model(batch[0]) - batch[1]) ** 2  # noqa: E731  (no .mean())
    elif args.kind == "raising-loss":
        def loss(model, batch):
            raise KeyError("labels")
    return fit(model, data, loss, config, eval_set=Pairs(n=20) if args.kind == "tuples" else None)


if __name__ == "__main__":
    sys.exit(main())
