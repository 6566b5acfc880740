"""Data, precision, configuration and checkpoint files, one behaviour each."""
import os
import signal
import time

import numpy as np
import pytest
import torch

from ddp_abci.autoencoder import LinspaceDataset, SimpleModule, linspace_rows
from ddp_abci.checkpointing import checkpoint as ckpt
from ddp_abci.config import TrainConfig
from ddp_abci.data import ShardBatchSampler, build_loader, iterate, per_rank_batch
from ddp_abci.errors import UsageError
from ddp_abci.parallel.launch import Launch
from ddp_abci.parallel.signals import StopRequest
from ddp_abci.precision import make_scaler, resolve_precision

CPU = torch.device("cpu")


def launch(rank=0, world=1):
    return Launch(rank, world, rank, world, "127.0.0.1", 1, "test")


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


@pytest.mark.parametrize("workers", [0, 1])
def test_the_trainers_batches_are_the_dataloaders_own_with_or_without_workers(workers):
    loader = build_loader(LinspaceDataset(num_items=400), launch(1, 2), 50, seed=3, workers=workers)
    loader.sampler.start_epoch(1, skip_batches=2)
    expected = list(loader)
    loader.sampler.start_epoch(1, skip_batches=2)
    got = list(iterate(loader))
    assert len(got) == len(expected) == 6 and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_the_dataset_works_with_a_plain_dataloader_as_in_the_seed():
    batch = next(iter(torch.utils.data.DataLoader(LinspaceDataset(), batch_size=4)))
    assert batch.shape == (4, 1000) and batch[3][-1] == 3


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


def test_auto_precision_is_fp32_on_the_cpu():
    assert resolve_precision("auto", CPU) == "no"


@pytest.mark.parametrize("capability, chosen", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 0), "fp16")],
                         ids=["H100/H200", "A100", "V100"])
def test_auto_precision_is_bf16_where_the_gpu_computes_it_and_fp16_with_its_scaler_below(monkeypatch, capability,
                                                                                          chosen):
    # No GPU here: the device's compute capability is the one fact the choice reads.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert resolve_precision("auto", torch.device("cuda", 0)) == chosen


def test_fp16_on_the_cpu_is_refused_naming_the_alternatives():
    with pytest.raises(UsageError, match="--amp bf16 or --amp no"):
        resolve_precision("fp16", CPU)


def test_an_unknown_precision_lists_the_choices():
    with pytest.raises(UsageError, match="auto, no, fp16, bf16"):
        resolve_precision("fp8", CPU)


def test_the_grad_scaler_is_active_for_fp16_only():
    assert not make_scaler("bf16", CPU).is_enabled()
    assert not make_scaler("no", CPU).is_enabled()


def test_resume_without_a_checkpoint_folder_is_refused():
    with pytest.raises(UsageError, match="--ckpt-dir"):
        TrainConfig(resume=True)


def test_the_config_in_a_checkpoint_is_plain_data():
    assert TrainConfig().to_dict()["betas"] == [0.0, 0.99]


def test_a_stop_signal_is_recorded_not_acted_on():
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def _state(model=None):
    model = model or SimpleModule()
    return {"format": ckpt.FORMAT, "model": model.state_dict(), "optimizer": {}, "scaler": {}, "epoch": 1,
            "step": 2, "world_size": 2, "config": {}, "batch_in_epoch": 0, "sampler_epoch": 1,
            "global_batch": 50, "rng": ckpt.rng_state()}


def test_a_checkpoint_round_trips_with_weights_only(tmp_path):
    path = tmp_path / "last.pt"
    ckpt.save_atomic(_state(), path)
    assert ckpt.load_checkpoint(path)["step"] == 2


def test_a_write_that_fails_half_way_leaves_the_old_checkpoint_whole(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    ckpt.save_atomic(_state(), path)
    before = path.read_bytes()

    def crash(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError):
        ckpt.save_atomic(_state(), path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.pt"]  # no temporary file left behind


def test_a_truncated_checkpoint_is_refused_and_left_as_it_is(tmp_path):
    path = tmp_path / "last.pt"
    ckpt.save_atomic(_state(), path)
    data = path.read_bytes()[:1000]
    path.write_bytes(data)
    with pytest.raises(ckpt.CheckpointError, match="truncated or not a ddp_abci checkpoint"):
        ckpt.load_checkpoint(path)
    assert path.read_bytes() == data


def test_a_torch_file_that_is_not_ours_is_refused(tmp_path):
    path = tmp_path / "last.pt"
    torch.save({"model": {}}, path)
    with pytest.raises(ckpt.CheckpointError, match="not a ddp_abci/1 checkpoint"):
        ckpt.load_checkpoint(path)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_crafted_checkpoint_cannot_run_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "last.pt"
    with open(path, "wb") as f:
        torch.save({"format": ckpt.FORMAT, "model": _Exploit()}, f)
    with pytest.raises(ckpt.CheckpointError):
        ckpt.load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


def test_a_checkpoint_of_another_model_shape_is_refused_naming_the_tensor(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match=r"net.0.weight: \(64, 1000\)"):
        ckpt.check_model_shape(_state(SimpleModule(1000, 64)), SimpleModule(), tmp_path / "last.pt")


def test_an_unwritable_checkpoint_folder_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ckpt.CheckpointError, match="cannot be written"):
        ckpt.check_writable(blocker / "ckpt")


def test_bf16_on_a_gpu_that_only_emulates_it_is_refused_naming_fp16(monkeypatch):
    import torch

    from ddp_abci.errors import UsageError
    from ddp_abci.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what torch says: emulation counts
    with pytest.raises(UsageError, match="only emulates bf16; use --amp fp16"):
        resolve_precision("bf16", torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_precision("bf16", torch.device("cuda", 0)) == "bf16"


def test_an_nccl_error_at_init_is_a_backend_failure_not_a_rendezvous_one(monkeypatch):
    import torch.distributed as dist

    from ddp_abci.parallel.launch import Launch
    from ddp_abci.parallel.process_group import BackendFailed, open_process_group

    def fail(*args, **kwargs):
        raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp, unhandled cuda error")

    monkeypatch.setattr(dist, "init_process_group", fail)
    with pytest.raises(BackendFailed) as raised:
        open_process_group(Launch(0, 1, 0, 1, "127.0.0.1", 29500, "single"))
    assert "could not start" in str(raised.value) and "could not meet" not in str(raised.value)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_torch_loads_with_the_collector_paused_and_its_state_is_restored(enabled_before):
    import gc

    from ddp_abci.fitting import collector_paused

    (gc.enable if enabled_before else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled_before
    finally:
        gc.enable()


@pytest.mark.parametrize("stop_at, said", [(-30, "--stop-at is past (-30s from now): the run stops at its first check"),
                                           (3600, "--stop-at stops, saves and exits 75 with at least")])
def test_the_starts_deadline_line_says_when_the_deadline_is_already_past(stop_at, said):
    from ddp_abci.parallel.agreement import Agreement
    from ddp_abci.parallel.gradients import gradient_path

    agreement = Agreement(StopRequest(), 8, gradient_path("gloo"), torch.device("cpu"), 0, 1, guard_finite=True,
                          max_fp16_skips=0, stop_at=time.time() + stop_at)
    assert said in agreement.deadline_line()
