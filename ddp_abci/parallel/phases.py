"""What the main thread is in, as a stack the watchdog's threads read: a collective (`waiting`,
timed against --timeout), local work (`working`, shown to the other ranks, not timed), or reading
its data (`awaiting_data`: local work, timed all the same).

Each entry is (name, is a collective, when it began on time.monotonic()). The main thread alone
pushes and pops; the watch and heartbeat threads read the top, which a list's append and pop
keep whole under the interpreter lock.
"""
from __future__ import annotations

import time
from typing import Callable

Entry = tuple[str, bool, float]


class PhaseStack:
    """The main thread's phases. on_lost(error): a collective lost its peer (it waits for the
    job's end); on_timed_out(entry): gloo's own timeout ended a collective first (the verdict)."""

    def __init__(self, on_lost: Callable[[BaseException], None], on_timed_out: Callable[[Entry], None]) -> None:
        self.on_lost, self.on_timed_out = on_lost, on_timed_out
        self.entries: list[Entry] = [("starting up", False, time.monotonic())]
        self.waited_s = 0.0                  # seconds spent in collectives so far (the straggler clock leaves them out)
        self.data_since: float | None = None  # reading a batch since then (awaiting_data)

    @property
    def top(self) -> Entry:
        return self.entries[-1]

    def waiting(self, name: str, waits_from: Callable[[], float] | None = None) -> Phase:
        """Around a collective: timed against --timeout. waits_from() tells, at its end, when
        the phase's own work ended and the wait began (gloo's backward: its last bucket ready)."""
        return Phase(self, name, True, waits_from)

    def working(self, name: str) -> Phase:
        """Around local work (loss_fn, a checkpoint write): shown to the others, not timed."""
        return Phase(self, name, False)

    def awaiting_data(self) -> DataPhase:
        """Around reading the next batch: local work, timed against --timeout all the same. A
        stream (or a loader's workers) that yields nothing that long ends the job, naming this
        rank and that it waited on its data; were it untimed, ranks all stuck reading would
        wait for ever, none of them in a collective."""
        return DataPhase(self, "reading its data", False)


class Phase:
    """`with phases.waiting(name):` / `working(name)`: one entry of the stack."""

    __slots__ = ("phases", "name", "collective", "waits_from")

    def __init__(self, phases: PhaseStack, name: str, collective: bool,
                 waits_from: Callable[[], float] | None = None) -> None:
        self.phases, self.name, self.collective, self.waits_from = phases, name, collective, waits_from

    def __enter__(self) -> None:
        self.phases.entries.append((self.name, self.collective, time.monotonic()))

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        phases = self.phases
        if error is not None and self.collective and peer_lost(error):
            # A peer's process ended (its launcher ends this rank in a moment) or the link to
            # it is gone: the collective is still, in effect, waiting. It stays on the stack,
            # timed, and the verdict names who stopped answering (exit 69), where this rank's
            # traceback (exit 1) would only blame the network.
            phases.on_lost(error)
        # gloo's own timeout (the process group's, the same --timeout) may fire before the
        # watch thread looks: the same verdict. The phase stays on the stack meanwhile: popped
        # first, this rank's heartbeats would say it is back in the training, and a lower rank
        # judging would name it "alive but never reached the collective" instead of a disagreement.
        if error is not None and self.collective and timed_out(error):
            phases.on_timed_out(phases.top)
        entry = phases.entries.pop()
        if entry[1]:  # the wait: the whole phase, or from when its own work ended (waits_from())
            began = max(entry[2], self.waits_from()) if self.waits_from is not None else entry[2]
            phases.waited_s += time.monotonic() - began


class DataPhase(Phase):
    """`with phases.awaiting_data():` a working phase whose start is also `data_since`, the
    watch thread's clock for a read that never returns (a class, not a generator: it runs
    once a step)."""

    __slots__ = ()

    def __enter__(self) -> None:
        now = time.monotonic()
        self.phases.entries.append((self.name, False, now))
        self.phases.data_since = now

    def __exit__(self, kind: object, error: BaseException | None, tb: object) -> None:
        self.phases.data_since = None
        self.phases.entries.pop()


# gloo's words when the connection to a peer breaks: its process ended (aborted, killed) or
# the network between them went (a cut link: "Read error [10.77.0.2]:675: Network is unreachable").
CONNECTION_LOST = ("closed by peer", "reset by peer", "Network is unreachable", "No route to host", "Broken pipe")


def peer_lost(error: BaseException) -> bool:
    """gloo's error when the connection to another rank broke."""
    text = str(error)
    return isinstance(error, RuntimeError) and any(words in text for words in CONNECTION_LOST)


def timed_out(error: BaseException) -> bool:
    """gloo's own collective timeout (the process group's), as it raises it."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)
