"""Run under mpirun by test_watchdog.py: the seed's job through `python -m ddp_abci.train`,
with rank 1 made to misbehave in one of the ways that hang DDP jobs. Test-only: the library
has no such hook. usage: misbehave_script.py MODE [trainer flags]

MODE:
  skip-agreement  rank 1 skips its stop agreement at step 8 (rank-dependent code around a collective)
  save-alone      rank 1 calls the checkpoint save on its own after step 3 (an `if rank == ...` around it)
  slow-loss       rank 1's loss_fn takes three times --timeout at step 5 (alive, but never arrives)
  raise-loss      rank 1's loss_fn raises at step 5 (it says so; the others must not wait)
  late-close      rank 1 reaches the end of a good run 3/8 of --timeout after rank 0 (a rank
                  the machine left unscheduled for a while)
"""
import os
import sys
import time

from ddp_abci import train
from ddp_abci.autoencoder import AutoencoderLoss
from ddp_abci.trainer import Trainer

mode, argv = sys.argv[1], sys.argv[2:]
timeout = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else 120.0

if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    if mode == "skip-agreement":
        agree = Trainer._agree

        def _agree(self):
            return 0 if self.step == 8 else agree(self)

        Trainer._agree = _agree
    elif mode == "save-alone":
        train_step = Trainer.train_step

        def train_step_then_save(self, groups):
            result = train_step(self, groups)
            if self.step == 2:  # the step being finished is the third
                self._save()
            return result

        Trainer.train_step = train_step_then_save
    elif mode in ("slow-loss", "raise-loss"):
        call, calls = AutoencoderLoss.__call__, []

        def slow_or_raising(self, model, x):
            calls.append(1)
            if len(calls) == 5:
                if mode == "raise-loss":
                    raise ValueError("a bad batch on rank 1")
                time.sleep(3 * timeout)
            return call(self, model, x)

        AutoencoderLoss.__call__ = slow_or_raising
    elif mode == "late-close":
        close = Trainer.close

        def late_close(self, together=False):
            time.sleep(1.5 * timeout / 4)  # 3 heartbeats (every timeout / 8); rank 0 waits up to 2 and 2 s
            close(self, together)

        Trainer.close = late_close

sys.exit(train.main(argv))
