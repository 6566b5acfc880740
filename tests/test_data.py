"""The batches (data.py): the global batch split over the ranks, each rank's shard, the order of an
epoch and its resume."""

import pytest
import torch

from ddp_abci.autoencoder import LinspaceDataset
from ddp_abci.data import ShardBatchSampler, build_loader, iterate, per_rank_batch
from ddp_abci.errors import UsageError
from ddp_abci.parallel.launch import Launch


def launch(rank=0, world=1):
    return Launch(rank, world, rank, world, "127.0.0.1", 1, "test")


@pytest.mark.parametrize("workers", [0, 1])
def test_the_trainers_batches_are_the_dataloaders_own_with_or_without_workers(workers):
    loader = build_loader(LinspaceDataset(num_items=400), launch(1, 2), 50, seed=3, workers=workers)
    loader.sampler.start_epoch(1, skip_batches=2)
    expected = list(loader)
    loader.sampler.start_epoch(1, skip_batches=2)
    got = list(iterate(loader))
    assert len(got) == len(expected) == 6 and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_the_global_batch_is_split_over_the_ranks():
    assert per_rank_batch(256, 16) == 16


def test_a_batch_that_does_not_divide_names_both_numbers():
    with pytest.raises(UsageError, match=r"global_batch \(--bs\) 50 does not divide by world size 3"):
        per_rank_batch(50, 3)


def test_ranks_take_disjoint_shards_that_cover_the_epoch():
    ds = LinspaceDataset(num_items=100)
    seen = []
    for r in range(2):
        loader = build_loader(ds, launch(r, 2), 10, seed=3)
        loader.sampler.start_epoch(0)
        assert all(len(batch) == 5 for batch in loader)
        seen += [int(x[-1]) for batch in loader for x in batch]
    assert sorted(seen) == list(range(100))


def test_each_epoch_is_shuffled_anew():
    s = ShardBatchSampler(LinspaceDataset(num_items=100), launch(), 10, seed=0)
    s.start_epoch(0)
    first = list(s)
    s.start_epoch(1)
    assert list(s) != first


def test_skipping_resumes_the_same_order_part_way_through():
    s = ShardBatchSampler(LinspaceDataset(num_items=100), launch(), 10, seed=0)
    s.start_epoch(4)
    whole = list(s)
    s.start_epoch(4, skip_batches=3)
    assert list(s) == whole[3:] and len(s) == 7
