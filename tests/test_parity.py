"""The raw code is the same algorithm as Accelerate: minimal.py, the trainer and the Accelerate
variant end one epoch of the seed's job with the same weights (2 ranks, fp32, same seed)."""
import torch

from helpers import assert_clean, env, load, mpirun_cmd, run

ONE_EPOCH = ["--epochs", "1", "--seed", "0", "--bs", "50"]


def weights(tmp_path, name, module, *args):
    path = tmp_path / f"{name}.pt"
    proc = run(mpirun_cmd(2, *ONE_EPOCH, *args, "--save-model", str(path), module=module),
               env=env(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531"), timeout=180)
    assert_clean(proc)
    return load(path)


def max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_minimal_py_and_the_trainer_end_with_the_same_weights(tmp_path, mpirun):
    minimal = weights(tmp_path, "minimal", "ddp_abci.minimal", "--amp", "no")
    trainer = weights(tmp_path, "train", "ddp_abci.train", "--no-fused-adam")
    assert max_difference(minimal, trainer) <= 1e-5


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

    from ddp_abci.data import LinspaceDataset, ShardBatchSampler
    from ddp_abci.dist.launch import Launch

    ds = LinspaceDataset(num_items=400)
    for rank in range(2):
        sampler = SeedableRandomSampler(range(400), data_seed=7)
        sampler.set_epoch(3)
        theirs = list(BatchSamplerShard(BatchSampler(sampler, 50, False), 2, rank, split_batches=True))
        ours = ShardBatchSampler(ds, Launch(rank, 2, rank, 2, "x", 1, "t"), 25, seed=7, split="contiguous")
        ours.start_epoch(3)
        assert list(ours) == theirs
    assert torch.is_tensor(ds[[0]])
