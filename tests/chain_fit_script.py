"""A user's own fit() script, as the job scripts run it (TRAIN_SCRIPT): it takes the trainer's
flags (parse_command_line), so the job scripts' --ckpt-dir, --resume and --stop-after reach it.
The model and data are its own: a small regression on fixed random data."""
import sys

import torch

from ddp_abci import fit, parse_command_line

config, launch, _ = parse_command_line(global_batch=64, lr=1e-3, betas=(0.9, 0.999))
g = torch.Generator().manual_seed(7)
inputs = torch.randn(4096, 32, generator=g)
targets = inputs @ torch.randn(32, 8, generator=g)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
data = torch.utils.data.TensorDataset(inputs, targets)
sys.exit(fit(model, data, lambda m, batch: torch.nn.functional.mse_loss(m(batch[0]), batch[1]), config, **launch))
