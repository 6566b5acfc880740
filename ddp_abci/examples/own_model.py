"""Your own model in the job scripts: a template. Copy it, put your model, data and loss in
place of the small regression below, and submit it with TRAIN_SCRIPT=path/to/it.py
(docs/abci.md, "Your own model").

parse_command_line gives it the trainer's flags, so what the job scripts pass every rank
(--ckpt-dir, --resume, --stop-after before the walltime, --bs, --epochs, your own -- ARGS)
reaches fit(): the deadline stop, the step checkpoints and the chains work as for
`python -m ddp_abci.train`. Run it here: `mpirun -n 2 python -m ddp_abci.examples.own_model`.
"""
import sys

import torch

from ddp_abci import fit, parse_command_line


def main() -> int:
    # Your defaults; every flag on the command line overrides them (--help lists them).
    config, launch, _ = parse_command_line(global_batch=64, lr=1e-3, betas=(0.9, 0.999), epochs=20)
    g = torch.Generator().manual_seed(7)  # the same data on every rank: DistributedSampler shares it out
    inputs = torch.randn(4096, 32, generator=g)
    targets = inputs @ torch.randn(32, 8, generator=g)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def loss_fn(model: torch.nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch[0]), batch[1])

    return fit(model, torch.utils.data.TensorDataset(inputs, targets), loss_fn, config, launch=launch)


if __name__ == "__main__":
    sys.exit(main())
