"""A user's fit() script that says, on every rank, what reached it: its own package (installed into
the job's VENV, not into the image), the variables set before submit.sh, and whether the secret's
value arrived (by its digest: the value itself is printed nowhere). Then it trains paced steps,
so that the job lives while the test reads every process's command line.
usage: SCRIPT [trainer flags] --token-sha HEX [--pace SECONDS]   (TRAIN_SCRIPT)"""
import argparse
import hashlib
import os
import socket
import sys
import time

import okpkg  # from the VENV: an ImportError here is the test's failure
import torch

from ddp_abci import fit, launched_rank, parse_command_line

config, launch, rest = parse_command_line(epochs=100000, global_batch=8, lr=0.01, own=("--token-sha", "--pace"))
own = argparse.ArgumentParser(prog="rank_env_script.py")
own.add_argument("--token-sha", required=True)
own.add_argument("--pace", type=float, default=0.05)
args = own.parse_args(rest)
token = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()
print(f"rank {launched_rank()} on {socket.gethostname()}: okpkg {okpkg.__name__} from {okpkg.__file__}; "
      f"HF_HOME={os.environ.get('HF_HOME')} MY_SETTING={os.environ.get('MY_SETTING')} "
      f"token arrived: {token == args.token_sha}", flush=True)
g = torch.Generator().manual_seed(7)
inputs = torch.randn(256, 8, generator=g)
torch.manual_seed(0)


def loss_fn(model, batch):
    time.sleep(args.pace)
    return torch.nn.functional.mse_loss(model(batch[0]), batch[0][:, :2])


sys.exit(fit(torch.nn.Linear(8, 2), torch.utils.data.TensorDataset(inputs), loss_fn, config, launch=launch))
