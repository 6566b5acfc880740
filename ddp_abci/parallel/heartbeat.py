"""The heartbeat thread: this rank's step and phase written to rank 0's rendezvous store every
interval; every rank's read by the watching ranks (the lowest READERS) while one of their
collectives has waited a quarter of --timeout; and the verdict's errands (claim it; ask every rank
where it is).

It alone talks to the store. A store call hangs for good once rank 0 is frozen (torch 2.13's
TCPStore client never returns once its server is stopped), so the heartbeat runs apart from the
watch thread that decides, and a call that does not come back is itself the evidence against
rank 0 (`held_s`). Every value it writes is signed, and every value it reads checked, with the
job's secret (signing.py): a value that fails is not a heartbeat, a request or a claim.

The store's load grows with the ranks, not their square: each rank writes one key and reads one
(the hang report's request) a beat; only READERS ranks read every heartbeat (one multi_get a
beat, while they wait), and a rank about to give a verdict reads them once, in its errand.
"""
from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from datetime import timedelta
from typing import Any, Callable

from .diagnosis import Seen
from .launch import Launch
from .phases import PhaseStack
from .signing import Signer, job_secret

KEY = "ddp_abci/heartbeat/{}"
VERDICT_KEY = "ddp_abci/verdict"        # the first rank about to speak claims it (compare_set of a signed claim)
REPORT_KEY = "ddp_abci/hang"            # the speaker's request: every rank writes its stacks and where it is
WHERE_KEY = "ddp_abci/where/{}"
WHERE_COUNT = "ddp_abci/where-count"    # added to by each rank that answered (a hint: each answer is checked)
LEFT_KEY = "ddp_abci/left/{}"           # each rank's heartbeat as it stops at a good run's end
READERS = 3                              # the ranks that read every heartbeat while they wait


class Heartbeat:
    """One rank's heartbeat, every `interval` s; every rank's beats are read (by the lowest
    READERS ranks) while a collective of this rank's has waited `read_after_s`. report(step) is
    called on this thread when the speaker asks every rank where it is: it writes this rank's
    stacks and returns its place. `secret_wait_s`: how long a rank started without MPI waits for
    rank 0's secret file (signing.job_secret)."""

    def __init__(self, launch: Launch, interval: float, read_after_s: float, phases: PhaseStack,
                 step: Callable[[], int], report: Callable[[str], str], secret_wait_s: float = 120.0) -> None:
        self.launch, self.interval, self.read_after_s = launch, interval, read_after_s
        self.phases, self.step, self.report, self.secret_wait_s = phases, step, report, secret_wait_s
        self.store_timeout_s = max(2 * interval, 1.0)
        self.host = socket.gethostname()
        self.seen: dict[int, Seen] = {}
        self.store_error = ""                        # the store's last failure, in one line
        self.call_since: float | None = None         # a store call under way since then
        self.answered: set[str] = set()              # the requests (their nonces) this rank answered
        self.store: Any = None                       # the store client, once rank 0's store was reached
        self.signer: Signer | None = None
        self.present: set[str] = set()               # heartbeat keys known to exist (read with multi_get)
        self.seq = 0                                 # this rank's last beat's number
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
        if together and self.launch.rank == 0 and not self.thread.is_alive() and self.signer is not None:
            keys, until = [LEFT_KEY.format(r) for r in range(self.launch.world_size)], time.monotonic() + within
            with contextlib.suppress(Exception):  # the store already closing: nothing to wait for
                while self.store is not None and not self._all_left(keys) and time.monotonic() < until:
                    time.sleep(0.02)
        if self.signer is not None and self.signer.summary():
            print(self.signer.summary(), flush=True)

    def _all_left(self, keys: list[str]) -> bool:
        if not self.store.check(keys):
            return False
        return all(self.signer.verify(key, raw, replay=False) is not None
                   for key, raw in zip(keys, self.store.multi_get(keys), strict=True))

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
        self.errand_done.wait(self.errand_s())
        return errand

    def errand_s(self) -> float:
        """The longest a verdict's errand takes: its wait for the places, and a few beats."""
        return min(12.0, 2 * self.interval + 2) + 3 * self.interval + 2

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            import torch.distributed as dist  # noqa: PLC0415  (only this thread needs it)

            self.signer = Signer(job_secret(self.launch, self.secret_wait_s),
                                 f"{self.launch.master_addr}:{self.launch.master_port}", f"rank {self.launch.rank}")
            # Connecting waits as long as a rendezvous may (thousands of ranks connect at once);
            # each call after it no longer than a few beats.
            store = self._call(dist.TCPStore, self.launch.master_addr, self.launch.master_port,
                               self.launch.world_size, False,
                               timedelta(seconds=max(self.store_timeout_s, self.secret_wait_s)))
            store.set_timeout(timedelta(seconds=self.store_timeout_s))
        except Exception as e:  # no store to reach (or no secret): the watch thread still ends a hung job
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
                key = LEFT_KEY.format(self.launch.rank)
                self._call(store.set, key, self.signer.sign(key, "left", seq))

    def _now(self, seq: int) -> dict:
        """This rank's heartbeat: where its main thread is, now."""
        name, collective, since = self.phases.top
        return {"seq": seq, "step": self.step(), "phase": name, "collective": collective, "host": self.host,
                "phase_s": time.monotonic() - since, "wall": time.time()}

    def _beat(self, store: Any, seq: int) -> None:
        self.seq = seq
        key = KEY.format(self.launch.rank)
        self._call(store.set, key, self.signer.sign(key, self._now(seq), seq))
        _, collective, since = self.phases.top
        if collective and self.launch.rank < READERS and time.monotonic() - since > self.read_after_s:
            self._read_all(store)
        if self.errand is not None:
            self._run_errand(store)
        elif self._call(store.check, [REPORT_KEY]):
            request = self.signer.verify(REPORT_KEY, self._call(store.get, REPORT_KEY), replay=False)
            if request is not None and request["nonce"] not in self.answered:
                self._answer(store, request)

    def _read_all(self, store: Any) -> None:
        """Every rank's last beat that checks out: the keys known to exist in one multi_get (get()
        waits for a key not there yet, so each new one is checked for first)."""
        keys = [KEY.format(r) for r in range(self.launch.world_size)]
        self.present |= set(self._existing(store, [k for k in keys if k not in self.present]))
        known = [k for k in keys if k in self.present]
        now = time.monotonic()
        for key, raw in zip(known, self._call(store.multi_get, known) if known else [], strict=True):
            beat = self.signer.verify(key, raw)
            if beat is None:
                continue
            rank = int(key.rsplit("/", 1)[1])
            previous = self.seen.get(rank)
            if previous is None or previous.beat["seq"] != beat["seq"]:
                self.seen[rank] = Seen(beat, now)

    def _existing(self, store: Any, keys: list[str]) -> list[str]:
        """Those of `keys` the store holds: all of them in one call when all are there, else by
        halves (a few calls for each missing key, not one call for each key: at 4,096 ranks one
        check a key took the verdict's rank past its errand's time)."""
        if not keys or self._call(store.check, keys):
            return keys
        if len(keys) == 1:
            return []
        half = len(keys) // 2
        return self._existing(store, keys[:half]) + self._existing(store, keys[half:])

    def _answer(self, store: Any, request: dict) -> None:
        """Asked by the speaker: this rank's stacks written, its place in the store."""
        self.answered.add(request["nonce"])
        key, answer = WHERE_KEY.format(self.launch.rank), {"place": self.report(str(request["step"])),
                                                           "beat": self._now(self.seq)}
        self._call(store.set, key, self.signer.sign(key, answer, 0))
        self._call(store.add, WHERE_COUNT, 1)

    def _claim(self, store: Any) -> bool:
        """Whether this rank is the first to claim the verdict: a signed claim put where none that
        checks out is (one that does not, written by anyone, is no claim: replaced)."""
        mine = self.signer.sign(VERDICT_KEY, {"rank": self.launch.rank, "nonce": secrets.token_hex(8)}, 0)
        expected = ""
        for _ in range(3):
            now = self._call(store.compare_set, VERDICT_KEY, expected, mine)
            now = now.decode() if isinstance(now, bytes) else now
            if now == mine:
                return True
            if self.signer.verify(VERDICT_KEY, now, replay=False) is not None:
                return False  # another rank of this job claimed it
            expected = now
        return False

    def _run_errand(self, store: Any) -> None:
        """Claim the verdict; if first, ask every rank where it is and collect what the live
        ones answer within a few beats."""
        errand, self.errand = self.errand, None
        errand["first"] = self._claim(store)
        if errand["first"]:
            request = {"step": self.step(), "nonce": secrets.token_hex(8)}
            self._call(store.set, REPORT_KEY, self.signer.sign(REPORT_KEY, request, 0))
            self._answer(store, request)
            deadline, world = time.monotonic() + errand["within"], self.launch.world_size
            while time.monotonic() < deadline and self._call(store.add, WHERE_COUNT, 0) < world:
                time.sleep(0.2)
            # Every rank's last beat, read after that wait (the live ones beat during it): read
            # before, they were the wait's age when the verdict judged them, and live ranks stale.
            self._read_all(store)
            there = self._existing(store, [WHERE_KEY.format(r) for r in range(world)])
            now = time.monotonic()
            for key, raw in zip(there, self._call(store.multi_get, there) if there else [], strict=True):
                answer = self.signer.verify(key, raw, replay=False)
                if answer is not None:  # a signed answer to this request: that rank is alive now,
                    rank = int(key.rsplit("/", 1)[1])  # whatever its heartbeat's key holds
                    errand["where"][rank], self.seen[rank] = answer["place"], Seen(answer["beat"], now)
        self.errand_done.set()

    def _call(self, call: Callable, *args: Any) -> Any:
        self.call_since = time.monotonic()
        try:
            return call(*args)
        finally:
            self.call_since = None
