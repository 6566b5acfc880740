"""The raw code is the same algorithm as its peers: minimal.py, the trainer, the Accelerate variant,
the Fabric variant and the textbook script end one epoch of the seed's job with the same weights
(2 ranks, fp32, same seed)."""
import pytest
import torch

from ddp_abci.parallel.rendezvous import free_port
from helpers import PYTHON, assert_clean, env, load, on_ranks, run

pytestmark = pytest.mark.untimed

ONE_EPOCH = ["--epochs", "1", "--seed", "0", "--bs", "50"]


def weights(tmp_path, name, module, *args, through=()):
    """Run `module` on 2 ranks (behind the `through` wrapper, if any) and load the weights it saved."""
    path = tmp_path / f"{name}.pt"
    cmd = on_ranks(2, *through, "-m", module, *ONE_EPOCH, *args, "--save-model", str(path))
    proc = run(cmd, env=env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1"))), timeout=180)
    assert_clean(proc)
    return load(path)


@pytest.fixture(scope="module")
def trainer_no_fused(tmp_path_factory, mpirun):
    """The raw trainer at the parity setting (torch's per-tensor Adam), strided split."""
    return weights(tmp_path_factory.mktemp("trainer"), "train", "ddp_abci.train", "--no-fused-adam")


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_minimal_py_and_the_trainer_end_with_the_same_weights(tmp_path, trainer_no_fused):
    minimal = weights(tmp_path, "minimal", "ddp_abci.minimal", "--amp", "no")
    assert max_difference(minimal, trainer_no_fused) <= 1e-5


def test_fabric_and_the_trainer_end_with_the_same_weights(tmp_path, trainer_no_fused):
    pytest.importorskip("lightning", reason="lightning comes with the test extra")
    fabric = weights(tmp_path, "fabric", "ddp_abci.fabric_variant")
    assert max_difference(fabric, trainer_no_fused) <= 1e-5  # measured: 0.0


def test_the_textbook_script_and_the_trainer_end_with_the_same_weights(tmp_path, trainer_no_fused):
    # torchrun's variables from Open MPI's, as the tutorial's script expects them
    textbook = weights(tmp_path, "textbook", "ddp_abci.textbook", through=("-m", "ddp_abci.compare.accelerate_env",
                                                                          PYTHON))
    assert max_difference(textbook, trainer_no_fused) <= 1e-5  # measured: 0.0


def test_the_contiguous_split_trainer_and_accelerate_end_with_the_same_weights(tmp_path, mpirun):
    accelerate = weights(tmp_path, "accelerate", "ddp_abci.accelerate_variant")
    trainer = weights(tmp_path, "train", "ddp_abci.train", "--no-fused-adam", "--split", "contiguous")
    assert max_difference(accelerate, trainer) <= 1e-5


def test_with_a_per_sample_mean_loss_the_split_does_not_matter(tmp_path, mpirun):
    strided = weights(tmp_path, "strided", "ddp_abci.train", "--loss", "mse")
    contiguous = weights(tmp_path, "contiguous", "ddp_abci.train", "--loss", "mse", "--split", "contiguous")
    assert max_difference(strided, contiguous) <= 1e-5


def test_accelerates_seedable_split_batches_are_the_contiguous_split_batch_for_batch():
    from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler
    from torch.utils.data import BatchSampler

    from ddp_abci.autoencoder import LinspaceDataset
    from ddp_abci.data import ShardBatchSampler
    from ddp_abci.parallel.launch import Launch

    ds = LinspaceDataset(num_items=400)
    for rank in range(2):
        sampler = SeedableRandomSampler(range(400), data_seed=7)
        sampler.set_epoch(3)
        theirs = list(BatchSamplerShard(BatchSampler(sampler, 50, False), 2, rank, split_batches=True))
        ours = ShardBatchSampler(ds, Launch(rank, 2, rank, 2, "x", 1, "t"), 25, seed=7, split="contiguous")
        ours.start_epoch(3)
        assert list(ours) == theirs
    assert torch.is_tensor(ds[[0]])
