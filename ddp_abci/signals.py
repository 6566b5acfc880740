"""Stop signals: SIGTERM (PBS and Grid Engine at walltime, mpirun forwarding) and SIGUSR1
(Slurm's --signal) ask every rank to finish its step, save, and exit."""
from __future__ import annotations

import signal

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped early with the checkpoint saved; resubmit with --resume


class StopRequest:
    """Remembers a stop signal and lets the ranks agree on the step where they stop.

    Ranks get the signal at slightly different moments, so each step's decision is an
    all-reduce (MAX of the signal number) taken at the same step on every rank. Doing it
    every `every` steps, not every step, keeps its cost off the throughput.
    """

    def __init__(self, every: int, device: torch.device) -> None:
        self.every = every
        self.device = device
        self.received = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        self.received = self.received or signum  # only record: the loop acts at a safe point

    def agreed(self, step: int) -> int:
        """The signal some rank received, once all ranks have seen it at this step; else 0."""
        if step % self.every:
            return 0
        flag = torch.tensor([self.received], dtype=torch.int32, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
