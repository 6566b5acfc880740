"""The checkpoint file (checkpointing/checkpoint.py): written atomically, loaded with weights_only,
refused in one line when it is not ours, truncated or of another shape. Runs that save and
resume: test_checkpoints.py."""
import os

import pytest
import torch

from ddp_abci.autoencoder import SimpleModule
from ddp_abci.checkpointing import checkpoint as ckpt


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
