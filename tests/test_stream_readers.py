"""Each kind of stream read as its library expects, and what cannot work refused in one line
before any work: in this process, nothing read but where a test says so."""
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, WeightedRandomSampler

from ddp_abci.config import TrainConfig
from ddp_abci.errors import UsageError
from ddp_abci.preflight import check_collates
from ddp_abci.stream_readers import AlreadySplit, HuggingFace, Reader, WebDataset, reader_for, reading_failure
from ddp_abci.training_set import training_set

CPU = torch.device("cpu")


class Numbers(IterableDataset):
    def __init__(self, count=20):
        self.count = count

    def __iter__(self):
        return iter(range(self.count))


def items(reader, worker=0, workers=1):
    share, own = reader.rank_share(0)
    return list(reader.worker_items(share, own, worker, workers, None)[1])


def test_a_stream_of_unknown_kind_is_read_whole_by_every_rank_which_keeps_its_items():
    assert items(reader_for(Numbers(), 1, 2, 5, 2), worker=1, workers=2) == [3, 7, 11, 15, 19]  # i % 4 == 1 + 2


def test_a_stream_marked_already_split_is_never_split_by_rank_again():
    reader = reader_for(AlreadySplit(Numbers(10)), 1, 2, 5, 2)
    assert items(reader) == list(range(10))
    assert items(reader, worker=1, workers=2) == [1, 3, 5, 7, 9]  # its workers' split is still done here


def test_a_stream_already_split_by_worker_too_is_read_as_it_is_by_each_worker():
    assert items(reader_for(AlreadySplit(Numbers(10), by_worker=True), 1, 2, 5, 2), worker=1, workers=2) == \
        list(range(10))


def test_each_library_is_recognised_by_its_class_without_being_imported():
    import datasets
    import webdataset

    hf = datasets.IterableDataset.from_generator(lambda: iter([{"id": 1}]))
    pipeline = webdataset.WebDataset(["a.tar", "b.tar"], shardshuffle=False)
    assert isinstance(reader_for(hf, 0, 2, 5, 0), HuggingFace)
    assert isinstance(reader_for(pipeline.map(lambda s: s), 0, 2, 5, 0), WebDataset)
    assert type(reader_for(Numbers(), 0, 2, 5, 0)) is Reader


def test_a_webdataset_pipeline_gets_this_ranks_split_of_its_shard_list_in_place_of_its_node_splitter():
    import webdataset

    pipeline = webdataset.WebDataset([f"{n}.tar" for n in range(6)], shardshuffle=False)  # single_node_only
    reader = reader_for(pipeline, 1, 2, 5, 0)
    urls = [u["url"] for u in reader.dataset.pipeline[1](iter(reader.dataset.pipeline[0]))]
    assert urls == ["1.tar", "3.tar", "5.tar"] and webdataset.shardlists.single_node_only in pipeline.pipeline


def test_a_webdataset_order_is_keyed_by_the_seeds_of_the_stages_that_shuffle_only():
    import webdataset

    def key(**kw):  # each WebDataset draws a seed of its own when given none, as in a new process
        return reader_for(webdataset.WebDataset(["a.tar", "b.tar"], **kw), 0, 2, 5, 0).order_key()

    assert key(shardshuffle=False) is None and key(shardshuffle=False) is None
    assert key(shardshuffle=100, seed=5) == key(shardshuffle=100, seed=5) == [5]
    assert key(shardshuffle=100) != key(shardshuffle=100)


def test_a_hugging_face_stream_split_for_another_rank_is_refused_naming_the_fix():
    import datasets
    from datasets.distributed import split_dataset_by_node

    split = split_dataset_by_node(datasets.IterableDataset.from_generator(lambda: iter([{"id": 1}])), rank=0,
                                  world_size=2)
    with pytest.raises(UsageError, match="for rank 0 of 2, this is rank 1 of 2: split it with those"):
        reader_for(split, 1, 2, 5, 0)


def test_items_the_collate_step_batches_pass_numpy_scalars_strings_and_nested_dicts_included():
    import numpy as np

    check_collates({"id": np.int64(3), "w": np.float32(0.5), "text": "a b", "nested": {"x": torch.zeros(2)}}, None)


def test_an_item_the_collate_step_cannot_batch_is_refused_with_its_own_message():
    with pytest.raises(UsageError, match=r"cannot be batched by default_collate: TypeError: default_collate: batch "
                                         r"must contain tensors"):
        check_collates({"x": object()}, None)


def test_a_dataloader_worker_failure_keeps_the_libraries_message_past_its_traceback():
    class Fails(IterableDataset):
        def __iter__(self):
            raise ValueError("shard 7 of s3://bucket/" + "x" * 300 + " is missing its index")
            yield

    batches = iter(DataLoader(Fails(), num_workers=1))
    with pytest.raises(ValueError) as raised:
        next(batches)
    del batches  # its worker is told to end now, not joined at the interpreter's exit
    line = reading_failure(raised.value)
    assert line.endswith("is missing its index (raised as ValueError in DataLoader worker process 0)"), line


def loader_set(loader, **config):
    return training_set(loader, TrainConfig(**config), None, CPU, 2)


def test_a_dataloader_is_taken_apart_its_dataset_collate_and_workers_kept_its_sampler_replaced():
    data = TensorDataset(torch.arange(40.0))
    kept = loader_set(DataLoader(data, batch_size=10, shuffle=True, num_workers=2, collate_fn=list), global_batch=20)
    assert (kept.dataset, kept.collate_fn, kept.workers, kept.shuffle, kept.stream, kept.items) == \
        (data, list, 2, True, False, 40)


def test_a_dataloader_batch_size_is_either_the_global_batch_or_each_ranks():
    data = TensorDataset(torch.arange(40.0))
    assert loader_set(DataLoader(data, batch_size=20), global_batch=20).items == 40  # split over the ranks
    with pytest.raises(UsageError, match=r"batch_size=8, and global_batch \(--bs\) is 20 on 2 rank\(s\): set "
                                         r"global_batch=8 .* or 16 \(8 per rank\)"):
        loader_set(DataLoader(data, batch_size=8), global_batch=20)


def test_a_dataloader_with_a_sampler_of_its_own_is_refused_naming_what_to_pass_instead():
    data = TensorDataset(torch.arange(40.0))
    weighted = DataLoader(data, batch_size=10, sampler=WeightedRandomSampler([1.0] * 40, 40))
    with pytest.raises(UsageError, match="WeightedRandomSampler of its own: it cannot be shared out by rank"):
        loader_set(weighted, global_batch=20)


def test_a_dataloader_and_a_config_that_both_set_workers_differently_are_refused():
    data = TensorDataset(torch.arange(40.0))
    with pytest.raises(UsageError, match=r"workers \(--workers\) is 1 and the training set's a DataLoader has 2"):
        loader_set(DataLoader(data, batch_size=10, num_workers=2), global_batch=20, workers=1)
