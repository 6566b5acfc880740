"""Stop signals: SIGTERM (PBS and Grid Engine at walltime, forwarded by mpirun), SIGUSR1
(Slurm's --signal; forwarded by mpirun without ending the job) and SIGINT (Ctrl-C) ask every
rank to finish its step, save, and exit 75. A second Ctrl-C interrupts at once.

This module only records the request; the training loop decides when all ranks agree (see
agreement.Agreement). It imports nothing heavy, so that the command line can install the
handlers before torch loads: a signal during start-up is kept too.
"""
from __future__ import annotations

import signal
import time

from ..exits import EXIT_STOPPED  # noqa: F401  (exported: ddp_abci.EXIT_STOPPED)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
DEADLINE = 1000   # not a signal: the stop agreement's code for --stop-after (above every signal number)


class StopRequest:
    """`with StopRequest() as stop:` records the first stop signal in `stop.received`."""

    def __init__(self) -> None:
        self.received = 0
        self.created = time.monotonic()  # --stop-after counts from here: the process's first moments
        self.created_unix = time.time()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequest":
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # Ctrl-C twice: the user does not want to wait for the save
        self.received = self.received or signum  # only record: the loop acts at a safe point


def signal_name(signum: int) -> str:
    return "the --stop-after deadline" if signum == DEADLINE else signal.Signals(signum).name
