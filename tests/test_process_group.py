"""Opening the process group (parallel/process_group.py): a backend's failure told from a rendezvous'."""

import pytest

from ddp_abci.parallel.launch import Launch


def test_an_nccl_error_at_init_is_a_backend_failure_not_a_rendezvous_one(monkeypatch):
    import torch.distributed as dist

    from ddp_abci.parallel.process_group import BackendFailed, open_process_group

    def fail(*args, **kwargs):
        raise dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp, unhandled cuda error")

    monkeypatch.setattr(dist, "init_process_group", fail)
    with pytest.raises(BackendFailed) as raised:
        open_process_group(Launch(0, 1, 0, 1, "127.0.0.1", 29500, "single"))
    assert "could not start" in str(raised.value) and "could not meet" not in str(raised.value)
