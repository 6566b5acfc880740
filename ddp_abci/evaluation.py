"""Evaluation on a held-out set: no_grad, autocast, every item counted exactly once across ranks."""
from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import torch
from torch.utils.data import Dataset, IterableDataset

from .data import ShardBatchSampler, batch_fetcher, batch_len, to_device
from .model import LossFn
from .parallel.collectives import gather_for_metrics, reduce
from .parallel.launch import Launch
from .precision import autocast
from .streams import rank_batches

# A metric maps (model, batch) to one value per item of the batch: accuracy's 0/1, an RMSE.
MetricFn = Callable[[torch.nn.Module, Any], torch.Tensor]


class Shard(NamedTuple):
    """One rank's evaluation pass, before the ranks combine it."""
    loss_sum: torch.Tensor            # float64: sum over this rank's items of the batch loss x batch size
    count: int                        # this rank's items
    values: dict[str, torch.Tensor]   # metric -> one float64 value per item, in `indices` order
    indices: list[int]                # this rank's items' dataset indices
    padded_len: int                   # every rank's padded length (a gather needs equal shapes)


def evaluate(model: torch.nn.Module, dataset: Dataset, loss_fn: LossFn, launch: Launch, device: torch.device,
             precision: str, per_rank_batch: int, metrics: Mapping[str, MetricFn] | None = None,
             collate_fn: Callable | None = None) -> tuple[dict[str, float], int]:
    """({"loss": mean, metric: mean, ...}, how many items counted), the same on every rank.
    Collective: every rank calls it."""
    if isinstance(dataset, IterableDataset):
        return _evaluate_stream(model, dataset, loss_fn, launch, device, precision, per_rank_batch, metrics or {},
                                collate_fn)
    return combine(evaluate_shard(model, dataset, loss_fn, launch, device, precision, per_rank_batch, metrics,
                                  collate_fn), device)


@torch.no_grad()
def _evaluate_stream(model: torch.nn.Module, dataset: IterableDataset, loss_fn: LossFn, launch: Launch,
                     device: torch.device, precision: str, per_rank_batch: int, metrics: Mapping[str, MetricFn],
                     collate_fn: Callable | None) -> tuple[dict[str, float], int]:
    """A held-out stream: each rank evaluates its share (streams.RankShare's, every item once,
    the short last batch too), and the sums of losses and metric values are reduced. The
    shares are disjoint, so nothing needs dropping as a repeat."""
    was_training = model.training
    model.eval()
    names = list(metrics)
    sums = torch.zeros(2 + len(names), dtype=torch.float64, device=device)  # loss x items, items, metric sums
    for batch in rank_batches(dataset, launch.rank, launch.world_size, per_rank_batch, collate_fn):
        batch = to_device(batch, device, non_blocking=True)
        items = batch_len(batch)
        with autocast(precision, device):
            sums[0] += loss_fn(model, batch).double() * items
            for i, name in enumerate(names):
                sums[2 + i] += metrics[name](model, batch).detach().double().sum()
        sums[1] += items
    model.train(was_training)
    totals = reduce(sums, "sum")
    count = totals[1].clamp(min=1)
    results = {"loss": (totals[0] / count).item(), **{name: (totals[2 + i] / count).item()
                                                      for i, name in enumerate(names)}}
    return results, int(totals[1].item())


@torch.no_grad()
def evaluate_shard(model: torch.nn.Module, dataset: Dataset, loss_fn: LossFn, launch: Launch, device: torch.device,
                   precision: str, per_rank_batch: int, metrics: Mapping[str, MetricFn] | None = None,
                   collate_fn: Callable | None = None) -> Shard:
    """This rank's share of the held-out set, evaluated locally (no collective).

    The loss is the mean of loss_fn over the items, each batch weighted by its size (exact
    for a per-item-mean loss such as cross-entropy). Each metric is the exact mean of its
    per-item values: they travel with their indices through gather_for_metrics.
    DistributedSampler's padding (it repeats items so that shards are equal) is left out
    here, so each rank evaluates only its own items, and none twice.
    """
    was_training = model.training
    model.eval()
    sampler = ShardBatchSampler(dataset, launch, per_rank_batch, shuffle=False)
    own = sampler.shard()[:len(range(launch.rank, len(dataset), launch.world_size))]  # no padding
    fetch = batch_fetcher(dataset, collate_fn)
    loss_sum, count = torch.zeros((), dtype=torch.float64, device=device), 0
    values: dict[str, list[torch.Tensor]] = {name: [] for name in metrics or {}}
    for first in range(0, len(own), per_rank_batch):
        idx = own[first:first + per_rank_batch]
        batch = to_device(fetch[idx], device, non_blocking=True)
        with autocast(precision, device):
            loss_sum += loss_fn(model, batch).double() * batch_len(batch)
            for name, fn in (metrics or {}).items():
                values[name].append(fn(model, batch).detach().double().reshape(-1))
        count += len(idx)
    model.train(was_training)
    empty = torch.zeros(0, dtype=torch.float64, device=device)
    return Shard(loss_sum, count, {name: torch.cat(parts) if parts else empty for name, parts in values.items()},
                 own, sampler.num_samples)


def combine(shard: Shard, device: torch.device) -> tuple[dict[str, float], int]:
    """Collective: every rank's shard made into the figures, the same on every rank."""
    totals = reduce(torch.stack([shard.loss_sum, torch.tensor(float(shard.count), dtype=torch.float64,
                                                               device=device)]), "sum")
    results = {"loss": (totals[0] / totals[1].clamp(min=1)).item()}
    indices = torch.tensor(shard.indices, device=device)
    for name, values in shard.values.items():
        results[name] = _mean_once(values, indices, shard.padded_len)
    return results, int(totals[1].item())


def _mean_once(values: torch.Tensor, indices: torch.Tensor, padded_len: int) -> float:
    """Mean over all ranks' items of per-item values: each rank pads to the same length (a
    gather needs equal shapes) with a repeat of its own first item, which
    gather_for_metrics then drops as the repeat it is."""
    pad = padded_len - values.numel()
    if pad:
        values = torch.cat([values, values[:1].expand(pad)])
        indices = torch.cat([indices, indices[:1].expand(pad)])
    kept, _ = gather_for_metrics(values, indices)
    return kept.mean().item()

