"""Evaluation on a held-out split: no_grad, autocast, exact mean RMSE over every item once."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset

from .collectives import gather_for_metrics
from .data import ShardBatchSampler
from .launch import Launch
from .precision import autocast


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: Dataset, launch: Launch, device: torch.device, precision: str,
             per_rank_batch: int) -> tuple[float, int]:
    """Mean over the split's items of each item's RMSE, and how many items that counted.

    Each rank evaluates its shard (padded by DistributedSampler to equal length); the
    per-item values travel with their indices, so the padding's repeats are dropped.
    """
    was_training = model.training
    model.eval()
    sampler = ShardBatchSampler(dataset, launch, per_rank_batch, shuffle=False)
    values, indices = [], []
    for idx in sampler:
        x = dataset[idx].to(device, non_blocking=True)
        with autocast(precision, device):
            y = model(x)
        values.append(((x - y.float()) ** 2).mean(dim=1).sqrt())
        indices.append(torch.tensor(idx, device=device))
    model.train(was_training)
    per_item, _ = gather_for_metrics(torch.cat(values), torch.cat(indices))
    return per_item.mean().item(), per_item.numel()
