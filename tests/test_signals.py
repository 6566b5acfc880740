"""Stop signals (parallel/signals.py): recorded by the handler, acted on by the loop."""
import os
import signal

from ddp_abci.parallel.signals import StopRequest


def test_a_stop_signal_is_recorded_not_acted_on():
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
