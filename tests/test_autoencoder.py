"""The seed's data (autoencoder.py): LinspaceDataset's items, as the blog builds them."""

import numpy as np
import pytest
import torch

from ddp_abci.autoencoder import LinspaceDataset, linspace_rows


def test_item_i_is_linspace_0_i_of_1000_float32_as_in_the_seed():
    ds = LinspaceDataset()
    assert len(ds) == 10000
    item = ds[7]
    assert item.dtype == torch.float32 and item.shape == (1000,)
    assert item[0] == 0 and item[-1] == 7


def test_a_batched_fetch_equals_the_items_one_by_one():
    ds = LinspaceDataset()
    idx = [0, 1, 5, 9999, 1234, 42]
    assert torch.equal(ds[idx], torch.stack([ds[i] for i in idx]))
    assert ds[idx].is_contiguous()


@pytest.mark.parametrize("dim", [1, 2, 3, 7, 1000])
def test_a_batched_fetch_equals_numpys_linspace_bit_for_bit_for_any_width_and_stop(dim):
    stops = [0, 1, 2, 3, 998, 999, 1000, 12345, 999_999, 2**31 - 1, 10**12 + 7]
    rows = linspace_rows(np.array(stops, dtype=np.float64), dim)
    for row, stop in zip(rows, stops, strict=True):
        assert np.array_equal(row, np.linspace(0, stop, dim).astype(np.float32)), (dim, stop)


def test_a_set_kept_whole_gives_the_batches_a_set_made_anew_gives():
    kept, made = LinspaceDataset(num_items=300, start=7), LinspaceDataset(num_items=300, start=7)
    made.KEPT_BYTES = 0  # over the bound: each batch's rows made anew
    idx = [299, 0, 5, 5, 123]
    assert torch.equal(kept[idx], made[idx]) and kept._rows is not None and made._rows is None
    batch = kept[idx]
    batch += 1  # a batch owns its rows: the kept set is unchanged
    assert torch.equal(kept[idx], made[idx])


def test_the_dataset_works_with_a_plain_dataloader_as_in_the_seed():
    batch = next(iter(torch.utils.data.DataLoader(LinspaceDataset(), batch_size=4)))
    assert batch.shape == (4, 1000) and batch[3][-1] == 3
