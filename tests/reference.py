"""An independent single-process reference for a W-rank DDP run: each rank's gradient
computed separately on the shard DistributedSampler would give it, then averaged."""
from __future__ import annotations

import numpy as np
import torch

from ddp_abci.autoencoder import SimpleModule


def item(i: int, dim: int = 1000) -> torch.Tensor:
    return torch.from_numpy(np.linspace(0, i, dim).astype(np.float32))


def shard_order(num_items: int, world: int, rank: int, seed: int, epoch: int) -> list[int]:
    """DistributedSampler's documented order: randperm seeded with seed + epoch, padded to a
    multiple of the world, then every world-th item starting at rank."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(num_items, generator=g).tolist()
    total = -(-num_items // world) * world
    perm += perm[: total - num_items]
    return perm[rank:total:world]


def reference_run(*, steps_per_epoch: int, epochs: int, num_items: int, global_batch: int, world: int,
                  seed: int = 0, lr: float = 1e-4, accum: int = 1, clip_norm: float = 0.0):
    """Returns (model, optimizer, per-epoch mean losses over all ranks).

    With accum K a step's loss on each rank is the mean of its K micro-batch losses; with
    clip_norm the averaged gradient is clipped to that total norm before the step."""
    torch.manual_seed(seed)
    model = SimpleModule()
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.0, 0.99))
    b = global_batch // world
    epoch_losses = []
    for epoch in range(epochs):
        shards = [shard_order(num_items, world, r, seed, epoch) for r in range(world)]
        losses = []
        for k in range(steps_per_epoch):
            grads = []
            for r in range(world):
                model.zero_grad()
                micro = [((x - model(x)) ** 2).mean().sqrt()
                         for m in range(k * accum, (k + 1) * accum)
                         for x in [torch.stack([item(i) for i in shards[r][m * b:(m + 1) * b]])]]
                loss = sum(micro) / accum
                loss.backward()
                grads.append([p.grad.clone() for p in model.parameters()])
                losses.append(loss.item())
            for p, *per_rank in zip(model.parameters(), *grads, strict=True):
                p.grad = sum(per_rank) / world
            if clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            opt.step()
        epoch_losses.append(sum(losses) / len(losses))
    return model, opt, epoch_losses
