"""A user's fit() script whose steps take --pace seconds, most of it asleep: what the scheduler
labs' chains train, so that a job of a minute costs the suite its minute of waiting and little
of the machine's two cores. usage: SCRIPT [trainer flags] [--pace SECONDS] (TRAIN_SCRIPT).

The trainer's flags come through parse_command_line as in any TRAIN_SCRIPT; --pace is the
script's own. The sleep changes no number: two runs of one seed end bit for bit alike however
they were cut into jobs."""
import argparse
import sys
import time

import torch

from ddp_abci import fit, parse_command_line

config, launch, rest = parse_command_line(epochs=100000, global_batch=8, lr=0.01, own=("--pace",))
own = argparse.ArgumentParser(prog="paced_script.py")
own.add_argument("--pace", type=float, default=0.05)
pace_s = own.parse_args(rest).pace
g = torch.Generator().manual_seed(7)
inputs = torch.randn(2048, 8, generator=g)
targets = inputs @ torch.randn(8, 2, generator=g)
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)


def loss_fn(model, batch):
    time.sleep(pace_s)
    return torch.nn.functional.mse_loss(model(batch[0]), batch[1])


sys.exit(fit(model, torch.utils.data.TensorDataset(inputs, targets), loss_fn, config, launch=launch))
