"""The heartbeat thread: this rank's step and phase written to rank 0's rendezvous store every
interval, every rank's read while this one has waited in a collective a quarter of --timeout,
and the verdict's errands run (claim it; ask every rank where it is).

It alone talks to the store. A store call hangs for good once rank 0 is frozen (torch 2.13's
TCPStore client never returns once its server is stopped), so the heartbeat runs apart from the
watch thread that decides, and a call that does not come back is itself the evidence against
rank 0 (`held_s`).
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable

from .diagnosis import Seen
from .launch import Launch
from .phases import PhaseStack

KEY = "ddp_abci/heartbeat/{}"
VERDICT_KEY = "ddp_abci/verdict"        # add()ed by each rank about to speak: the first (1) speaks
REPORT_KEY = "ddp_abci/hang"            # the speaker's step: every rank writes its stacks and where
WHERE_KEY = "ddp_abci/where/{}"
LEFT_KEY = "ddp_abci/left"              # add()ed by each rank's heartbeat as it stops at a good run's end


class Heartbeat:
    """One rank's heartbeat, every `interval` s; every rank's beats are read while a collective
    of this rank's has waited `read_after_s`. report(step) is called on this thread when the
    speaker asks every rank where it is: it writes this rank's stacks and returns its place."""

    def __init__(self, launch: Launch, interval: float, read_after_s: float, phases: PhaseStack,
                 step: Callable[[], int], report: Callable[[str], str]) -> None:
        self.launch, self.interval, self.read_after_s = launch, interval, read_after_s
        self.phases, self.step, self.report = phases, step, report
        self.store_timeout_s = max(2 * interval, 1.0)
        self.host = socket.gethostname()
        self.seen: dict[int, Seen] = {}
        self.store_error = ""                        # the store's last failure, in one line
        self.call_since: float | None = None         # a store call under way since then
        self.reported = False
        self.store: Any = None                       # the store client, once rank 0's store was reached
        self.errand: dict | None = None
        self.stopping, self.wake, self.errand_done = threading.Event(), threading.Event(), threading.Event()
        self.together = False                        # stopped at the end of a run every rank reached
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="ddp_abci-heartbeat", daemon=True)
        self.thread.start()

    def stop(self, together: bool, within: float) -> None:
        """Stop beating. together: the run ended on every rank, and rank 0 (whose process holds
        the store) waits, up to `within` s, until every rank's heartbeat has stopped: one that
        wrote after rank 0 had exited ended a good run's log with a C++ "Broken pipe" stack."""
        self.together = together
        self.stopping.set()
        self.wake.set()
        if self.thread is None:
            return
        self.thread.join(timeout=self.interval + 1)  # stuck in a store call (its server gone): left, a daemon
        if together and self.launch.rank == 0 and not self.thread.is_alive():
            until = time.monotonic() + within
            with contextlib.suppress(Exception):  # the store already closing: nothing to wait for
                while self.store is not None and self.store.add(LEFT_KEY, 0) < self.launch.world_size \
                        and time.monotonic() < until:
                    time.sleep(0.02)

    def held_s(self, now: float) -> float | None:
        """How long the store call under way has been (None: none is)."""
        since = self.call_since
        return None if since is None else now - since

    def stuck(self) -> bool:
        """A store call older than the store's own timeout will not come back: errands would wait in vain."""
        held = self.held_s(time.monotonic())
        return held is not None and held > self.store_timeout_s

    def ask(self) -> dict:
        """From a thread about to give the verdict: claim it, and collect every live rank's place,
        waited for a bounded time. {"first": whether this rank speaks, "where": rank -> place}; a
        store that does not answer gives no places, and leaves the claim to this rank."""
        errand = {"first": True, "where": {}, "within": min(12.0, 2 * self.interval + 2)}
        if self.store is None or self.store_error or self.stuck():
            return errand
        self.errand_done.clear()
        self.errand = errand
        self.wake.set()
        self.errand_done.wait(errand["within"] + 3 * self.interval + 2)
        return errand

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            import torch.distributed as dist  # noqa: PLC0415  (only this thread needs it)

            store = self._call(dist.TCPStore, self.launch.master_addr, self.launch.master_port,
                               self.launch.world_size, False, timedelta(seconds=self.store_timeout_s))
        except Exception as e:  # no store to reach: the watch thread still ends a hung job
            self.store_error = f"{type(e).__name__}: {e}".splitlines()[0]
            return
        seq, self.store = 0, store
        while not self.stopping.is_set():
            seq += 1
            try:
                self._beat(store, seq)
            except Exception as e:  # the store's host is gone: the watch thread will say so
                self.store_error = f"{type(e).__name__}: {e}".splitlines()[0]
                if self.stopping.is_set():
                    return
            self.wake.wait(self.interval)
            self.wake.clear()
        if self.together:  # this heartbeat writes no more: rank 0 may close the store
            with contextlib.suppress(Exception):
                self._call(store.add, LEFT_KEY, 1)

    def _beat(self, store: Any, seq: int) -> None:
        name, collective, since = self.phases.top
        beat = {"seq": seq, "step": self.step(), "phase": name, "collective": collective, "host": self.host,
                "phase_s": time.monotonic() - since, "wall": time.time()}
        self._call(store.set, KEY.format(self.launch.rank), json.dumps(beat))
        if collective and time.monotonic() - since > self.read_after_s:
            self._read_all(store)
        if self.errand is not None:
            self._run_errand(store)
        elif not self.reported and self._call(store.check, [REPORT_KEY]):
            self._answer(store, self._call(store.get, REPORT_KEY).decode())

    def _read_all(self, store: Any) -> None:
        """Every rank's last beat (get() waits for a key not there yet: only those that are)."""
        keys = [k for k in (KEY.format(r) for r in range(self.launch.world_size)) if self._call(store.check, [k])]
        now = time.monotonic()
        for key, raw in zip(keys, self._call(store.multi_get, keys), strict=True):
            rank, beat = int(key.rsplit("/", 1)[1]), json.loads(raw)
            previous = self.seen.get(rank)
            if previous is None or previous.beat["seq"] != beat["seq"]:
                self.seen[rank] = Seen(beat, now)

    def _answer(self, store: Any, step: str) -> None:
        """Asked by the speaker: this rank's stacks written, its place in the store."""
        self.reported = True
        self._call(store.set, WHERE_KEY.format(self.launch.rank), self.report(step))

    def _run_errand(self, store: Any) -> None:
        """Claim the verdict; if first, ask every rank where it is and collect what the live
        ones answer within a few beats."""
        errand, self.errand = self.errand, None
        errand["first"] = self._call(store.add, VERDICT_KEY, 1) == 1
        if errand["first"]:
            self._call(store.set, REPORT_KEY, str(self.step()))
            self._answer(store, str(self.step()))
            self._read_all(store)  # every rank's last beat, read now
            deadline = time.monotonic() + errand["within"]
            while time.monotonic() < deadline and len(errand["where"]) < self.launch.world_size:
                for rank in range(self.launch.world_size):
                    if rank not in errand["where"] and self._call(store.check, [WHERE_KEY.format(rank)]):
                        errand["where"][rank] = self._call(store.get, WHERE_KEY.format(rank)).decode()
                time.sleep(0.2)
        self.errand_done.set()

    def _call(self, call: Callable, *args: Any) -> Any:
        self.call_since = time.monotonic()
        try:
            return call(*args)
        finally:
            self.call_since = None
