"""Run under mpirun -n 2 by test_comm_choice.py: --comm auto's start-up measurement where rank 1's
part of MPI's first large all-reduce comes LATE_S late, as behind a transport that stalls (the
communicator itself made in time, as the small messages of a stalling TCP transport are): the run
must take gloo within the probe's budget and say why."""
import sys
import time

from ddp_abci import TrainConfig, fit, launched_rank
from ddp_abci.parallel import comm_choice

LATE_S = comm_choice.PROBE_S + 3


class Late:
    """The communicator, whose non-blocking all-reduce rank 1 starts LATE_S late."""

    def __init__(self, comm):
        self.comm = comm

    def Dup(self):
        return Late(self.comm.Dup())

    def Iallreduce(self, *args, **kwargs):
        if launched_rank() == 1:
            time.sleep(LATE_S)
        return self.comm.Iallreduce(*args, **kwargs)


probe = comm_choice.probe
comm_choice.probe = lambda comm, *args, **kwargs: probe(Late(comm), *args, **kwargs)
sys.exit(fit(config=TrainConfig(epochs=1, global_batch=50, comm="auto")))
