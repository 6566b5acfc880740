"""The hung-rank watchdog: a collective that has not completed within --timeout ends the
whole job, frozen ranks included, with one line naming who stopped answering (exit 69).

MPI collectives have no timeout, and gloo's raises on one rank while a frozen peer keeps
mpirun waiting: neither ends a job by itself. So each rank runs two small threads:

* the watch thread checks every second or so what the main thread is in (`waiting` marks a
  collective, `working` local work such as loss_fn or a checkpoint write). A collective
  older than --timeout is the end: it prints the diagnosis and ends the job
  (MPI_Abort under mpirun, which SIGKILLs every rank, stopped ones too). It never touches
  the network, so it cannot hang itself;
* the heartbeat thread writes this rank's step and phase to rank 0's rendezvous store every
  few seconds, and reads every rank's while a collective has waited a quarter of the timeout. A
  store call hangs for good when rank 0 is frozen (measured: torch 2.13's TCPStore client
  never returns once its server is stopped), so it runs apart, and a call that does not come
  back is itself the evidence against rank 0.

Reading the heartbeats: a rank whose heartbeat stopped changing stopped answering (frozen,
unreachable); ranks that are all alive yet never meet disagree about the collectives (the
deadlock of rank-dependent code); a rank alive but working names what it works on.

Where each waits: the rank that decides first claims the verdict in the store (one line per
job, whichever rank's timer fired first), then asks every rank through it to write its
threads' stacks (CKPT_DIR/hang-STEP/rank-R.txt) and say where its main thread is; the
heartbeat threads answer within a beat, and the line names each live rank's place
(hang_report.py). A collective that times out inside the user's code (gloo's own timeout)
is the same verdict.
"""
from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterator, NamedTuple

from ..errors import one_line
from .launch import Launch

EXIT_RANK_LOST = 69  # EX_UNAVAILABLE: a rank stopped answering; resubmit with --resume, check the named host
KEY = "ddp_abci/heartbeat/{}"
VERDICT_KEY = "ddp_abci/verdict"        # add()ed by each rank about to speak: the first (1) speaks
REPORT_KEY = "ddp_abci/hang"            # the speaker's step: every rank writes its stacks and where
WHERE_KEY = "ddp_abci/where/{}"
LEFT_KEY = "ddp_abci/left"              # add()ed by each rank's heartbeat as it stops at a good run's end


def collective(what: str) -> Callable:
    """Marks a method as a collective: the watchdog (its object's `watchdog`) times it
    against --timeout. The Trainer's collectives wear it."""
    def mark(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            with self.watchdog.waiting(what):
                return method(self, *args, **kwargs)
        call.collective = what  # type: ignore[attr-defined]
        return call
    return mark


class Seen(NamedTuple):
    beat: dict        # the rank's last heartbeat: seq, step, phase, collective, phase_s, host, wall
    changed_at: float  # this process's monotonic time when that beat was first read


def end_job(launch: Launch, status: int) -> None:
    """End every rank of the job now, with `status`, as the launch environment does it
    (MPI_Abort under mpirun; environments/), after flushing what this rank printed."""
    sys.stdout.flush()
    sys.stderr.flush()
    for child in multiprocessing.active_children():  # DataLoader workers: stuck in a dataset, they would outlive it
        child.kill()
    launch.end_job(status)


class _Phase:
    """`with watchdog.waiting(name):` / `working(name)`: one entry of the main thread's stack."""

    __slots__ = ("watchdog", "entry", "waits_from")

    def __init__(self, watchdog: "Watchdog", name: str, collective: bool,
                 waits_from: Callable[[], float] | None = None) -> None:
        self.watchdog, self.entry, self.waits_from = watchdog, (name, collective, 0.0), waits_from

    def __enter__(self) -> None:
        name, collective, _ = self.entry
        self.watchdog.stack.append((name, collective, time.monotonic()))

    def __exit__(self, kind, error, tb) -> None:
        if error is not None and self.entry[1] and peer_lost(error):
            # A peer's process ended (its launcher ends this rank in a moment) or the link to
            # it is gone: the collective is still, in effect, waiting. It stays on the stack,
            # timed, and the watch thread's verdict names who stopped answering (exit 69),
            # where this rank's traceback (exit 1) would only blame the network.
            self.watchdog.await_verdict(error)
        # gloo's own timeout (the process group's, the same --timeout) may fire before the
        # watch thread looks: the same diagnosis, not a traceback. The phase stays on the stack
        # meanwhile: popped first, this rank's heartbeats said it was back in the training, and
        # the speaker (a lower rank, waited for) named it "alive but never reached the
        # collective" instead of a disagreement (seen under load, where gloo's timeout came first).
        if error is not None and self.entry[1] and timed_out(error):
            self.watchdog.expire(self.watchdog.stack[-1])
        entry = self.watchdog.stack.pop()
        if entry[1]:  # the wait: the whole phase, or from when its own work ended (waits_from())
            began = max(entry[2], self.waits_from()) if self.waits_from is not None else entry[2]
            self.watchdog.waited_s += time.monotonic() - began


# gloo's words when the connection to a peer breaks: its process ended (aborted, killed) or
# the network between them went (a cut link gave "Read error [10.77.0.2]:675: Network is
# unreachable" here).
CONNECTION_LOST = ("closed by peer", "reset by peer", "Network is unreachable", "No route to host", "Broken pipe")


def peer_lost(error: BaseException) -> bool:
    """gloo's error when the connection to another rank broke."""
    text = str(error)
    return isinstance(error, RuntimeError) and any(words in text for words in CONNECTION_LOST)


def timed_out(error: BaseException) -> bool:
    """gloo's own collective timeout (the process group's), as it raises it."""
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("timed out" in text or "timeout" in text)


class Watchdog:
    """One per rank, started after the process group opens, stopped before it closes."""

    def __init__(self, launch: Launch, timeout_s: float, *, end: Callable[[int], None] | None = None,
                 record: Callable[[int, str], None] | None = None, report_dir: str | None = None,
                 step: Callable[[], int] | None = None) -> None:
        """end(status) ends the job (end_job by default); record(status, line) keeps the
        verdict where the job script finds it, before the job ends (the Trainer's DIR/status);
        report_dir: where the stacks go at a verdict (hang-STEP/ in it; stderr without);
        step(): the optimizer step the run is at, which the heartbeats and the verdict name."""
        self.launch, self.timeout_s, self.record, self.report_dir = launch, timeout_s, record, report_dir
        self.main_thread = threading.get_ident()  # made on the main thread, whose place is reported
        self.end = end or (lambda status: end_job(launch, status))
        self._step = step or (lambda: 0)
        self.waited_s = 0.0  # seconds spent in collectives so far (the straggler clock leaves them out)
        self.stack: list[tuple[str, bool, float]] = [("starting up", False, time.monotonic())]
        self.checkpoint = (f"no checkpoint written yet in {report_dir}" if report_dir else
                           "no checkpoint was written (no --ckpt-dir)")
        self.host = socket.gethostname()
        # Heartbeats every 1/8 of the timeout (at most 5 s): from a quarter of the timeout on,
        # a waiting rank reads everyone's at least 5 times before it decides.
        self.interval = min(5.0, max(0.2, timeout_s / 8))
        self.store_timeout_s = max(2 * self.interval, 1.0)
        self.seen: dict[int, Seen] = {}
        self.store_call_since: float | None = None  # a store call under way since then
        self.store_error = ""
        self.pause_gap = max(3 * min(1.0, timeout_s / 10), 2.0)
        self.last_watch = self.paused_at = time.monotonic() - 2 * self.pause_gap
        self._stop = threading.Event()
        self._ending = threading.Lock()
        self._threads: list[threading.Thread] = []
        # The verdict's errands for the heartbeat thread, which alone talks to the store.
        self._wake, self._errand = threading.Event(), None
        self._errand_done = threading.Event()
        self.reported = False
        self._store = None  # the heartbeat's store client, once it reached rank 0's store
        self._together = False  # stop() at the end of a run every rank reached: leave together
        self.own_place: str | None = None  # where this rank waits, when known better than its main thread's frame
        self.own_error: BaseException | None = None  # what its own collective raised (a timeout, a lost peer)
        self.data_since: float | None = None  # reading a batch since then (awaiting_data)

    @property
    def step(self) -> int:
        return self._step()

    # -- the main thread's side ------------------------------------------------------

    def waiting(self, name: str, waits_from: Callable[[], float] | None = None) -> _Phase:
        """Around a collective: timed against --timeout. waits_from() tells, at its end, when
        the phase's own work ended and the wait began (gloo's backward: its last bucket ready)."""
        return _Phase(self, name, True, waits_from)

    def working(self, name: str) -> _Phase:
        """Around local work (loss_fn, a checkpoint write): shown to the others, not timed."""
        return _Phase(self, name, False)

    @contextlib.contextmanager
    def awaiting_data(self) -> Iterator[None]:
        """Around reading the next batch: local work, timed against --timeout all the same. A
        stream (or a loader's workers) that yields nothing that long ends the job, naming this
        rank and that it waited on its data; were it untimed, ranks all stuck reading would
        wait for ever, none of them in a collective."""
        with self.working("reading its data"):
            self.data_since = time.monotonic()
            try:
                yield
            finally:
                self.data_since = None

    def note_checkpoint(self, step: int, path: object) -> None:
        """Rank 0 writes the checkpoints and knows each as soon as it is on disk; the others
        know the last one rank 0 confirmed, and a newer one may have been written since."""
        if self.launch.rank == 0:
            self.checkpoint = f"last checkpoint step {step} at {path} is intact"
        else:
            self.checkpoint = (f"the checkpoints in {os.path.dirname(str(path))} are intact "
                               f"(the last one confirmed: step {step})")

    # -- threads ---------------------------------------------------------------------

    def start(self) -> "Watchdog":
        """The watch thread (times collectives and data waits), and with several ranks the heartbeat."""
        threads = ((self._watch, "ddp_abci-watchdog"), (self._beat, "ddp_abci-heartbeat"))
        for target, name in threads if self.launch.world_size > 1 else threads[:1]:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, together: bool = False) -> None:
        """Before the process group closes. A heartbeat thread stuck in a store call (its
        server gone) is a daemon: it is left, and dies with the process.

        together: the run ended on every rank (done, or stopped with a checkpoint). Rank 0's
        process holds the rendezvous store the heartbeats write to, so it waits until every
        rank's heartbeat has stopped: one that wrote after rank 0 had exited ended a good run's
        log with torch's C++ stack of a "Broken pipe". At most two beats and 2 s (12 s at the
        default --timeout): a rank whose heartbeat never reached the store cannot say it left."""
        self._together = together
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=self.interval + 1)
        if together and self.launch.rank == 0 and self._threads and not self._threads[-1].is_alive():
            self._wait_for_all_to_leave()
        self._threads.clear()

    def _wait_for_all_to_leave(self) -> None:
        """Rank 0, on its own store (a call that cannot hang on another host)."""
        store, until = self._store, time.monotonic() + min(self.timeout_s, 2 * self.interval + 2)
        with contextlib.suppress(Exception):  # the store already closing: nothing to wait for
            while store is not None and store.add(LEFT_KEY, 0) < self.launch.world_size and time.monotonic() < until:
                time.sleep(0.02)

    def _watch(self) -> None:
        check = min(1.0, self.timeout_s / 10)
        self.last_watch = time.monotonic()
        while not self._stop.wait(check):
            now = time.monotonic()
            if now - self.last_watch > self.pause_gap:
                # This process was stopped itself (SIGSTOP; mpirun sends SIGCONT before its
                # SIGKILL): its clock ran on while it could see nothing, so it judges no one.
                self.paused_at = now
            self.last_watch = now
            if self._paused_recently():
                continue
            entry, data_since = self.stack[-1], self.data_since
            if entry[1] and now - entry[2] > self.timeout_s:
                self.expire(entry)
            elif data_since is not None and now - data_since > self.timeout_s:
                self.expire(entry, self._data_line(now - data_since))

    def _beat(self) -> None:
        try:
            import torch.distributed as dist  # noqa: PLC0415  (a thread of its own: see the module docstring)

            store = self._store_call(dist.TCPStore, self.launch.master_addr, self.launch.master_port,
                                     self.launch.world_size, False, timedelta(seconds=self.store_timeout_s))
        except Exception as e:  # no store to reach: the watch thread still ends a hung job
            self.store_error = f"{type(e).__name__}: {e}".splitlines()[0]
            return
        seq, keys, self._store = 0, [KEY.format(r) for r in range(self.launch.world_size)], store
        while not self._stop.is_set():
            seq += 1
            name, collective, since = self.stack[-1]
            beat = {"seq": seq, "step": self.step, "phase": name, "collective": collective, "host": self.host,
                    "phase_s": time.monotonic() - since, "wall": time.time()}
            try:
                self._store_call(store.set, KEY.format(self.launch.rank), json.dumps(beat))
                if collective and time.monotonic() - since > self.timeout_s / 4:
                    # get() waits for a key that does not exist yet: ask only for those that do.
                    there = [k for k in keys if self._store_call(store.check, [k])]
                    self._read(there, self._store_call(store.multi_get, there))
                if self._errand is not None:
                    self._run_errand(store)
                elif not self.reported and self._store_call(store.check, [REPORT_KEY]):
                    self._report(store, self._store_call(store.get, REPORT_KEY).decode())
            except Exception as e:  # the store's host is gone: the watch thread will say so
                self.store_error = f"{type(e).__name__}: {e}".splitlines()[0]
                if self._stop.is_set():
                    return
            self._wake.wait(self.interval)
            self._wake.clear()
        if self._together:  # this heartbeat writes no more: rank 0 may close the store
            with contextlib.suppress(Exception):
                self._store_call(store.add, LEFT_KEY, 1)

    def _report(self, store, step: str) -> None:
        """Every rank, asked by the speaker: its threads' stacks written, its place in the store."""
        from .hang_report import dump_stacks, main_frame, where  # noqa: PLC0415  (torch: see the docstring)

        self.reported = True
        folder = os.path.join(self.report_dir, f"hang-{step}") if self.report_dir else None
        dump_stacks(folder, self.launch.rank, self.own_error)
        place = self.own_place or where(main_frame(self.main_thread), self.stack[-1][0], self.step)
        self._store_call(store.set, WHERE_KEY.format(self.launch.rank), place)

    def _run_errand(self, store) -> None:
        """The speaker's errand: claim the verdict; if first, ask every rank where it is and
        collect what the live ones answer within a few beats."""
        errand, self._errand = self._errand, None
        errand["first"] = self._store_call(store.add, VERDICT_KEY, 1) == 1
        if errand["first"]:
            self._store_call(store.set, REPORT_KEY, str(self.step))
            self._report(store, str(self.step))
            there = [k for k in (KEY.format(r) for r in range(self.launch.world_size))
                     if self._store_call(store.check, [k])]
            self._read(there, self._store_call(store.multi_get, there))  # every rank's last beat, read now
            deadline, wanted = time.monotonic() + errand["within"], range(self.launch.world_size)
            while time.monotonic() < deadline and len(errand["where"]) < self.launch.world_size:
                for rank in wanted:
                    if rank not in errand["where"] and self._store_call(store.check, [WHERE_KEY.format(rank)]):
                        errand["where"][rank] = self._store_call(store.get, WHERE_KEY.format(rank)).decode()
                time.sleep(0.2)
        self._errand_done.set()

    def _ask(self) -> dict:
        """From a thread about to give the verdict: the heartbeat thread's errand, waited for
        a bounded time (a store that does not answer gives no places, and leaves the claim to us)."""
        errand = {"first": True, "where": {}, "within": min(12.0, 2 * self.interval + 2)}
        if self._store is None or self.store_error or self._store_stuck():
            return errand
        self._errand_done.clear()
        self._errand = errand
        self._wake.set()
        self._errand_done.wait(errand["within"] + 3 * self.interval + 2)
        return errand

    def _store_stuck(self) -> bool:
        """A store call older than the store's own timeout will not come back (torch 2.13's
        TCPStore client never returns once its server is stopped): the heartbeat thread it holds
        runs no errand, and waiting for one made a frozen rank 0's verdict come 6.5 s after
        --timeout 4 (29 s after the default 120) instead of at it."""
        since = self.store_call_since
        return since is not None and time.monotonic() - since > self.store_timeout_s

    def _store_call(self, call, *args):
        self.store_call_since = time.monotonic()
        try:
            return call(*args)
        finally:
            self.store_call_since = None

    def _read(self, keys: list[str], values: list[bytes]) -> None:
        now = time.monotonic()
        for key, raw in zip(keys, values, strict=True):
            rank, beat = int(key.rsplit("/", 1)[1]), json.loads(raw)
            previous = self.seen.get(rank)
            if previous is None or previous.beat["seq"] != beat["seq"]:
                self.seen[rank] = Seen(beat, now)

    # -- the end ---------------------------------------------------------------------

    def _paused_recently(self) -> bool:
        """This process was stopped a moment ago (the watch thread saw the gap, or has not run
        since): the others are ending the job, or will judge it themselves."""
        now = time.monotonic()
        return now - self.last_watch > self.pause_gap or now - self.paused_at < self.pause_gap

    def expire(self, entry: tuple[str, bool, float], line: str | None = None) -> None:
        """A collective (or a data wait: its `line`) outlived --timeout: one line, then the job
        ends. Once per process."""
        if not self._ending.acquire(blocking=False):
            self._stop.wait(3600)  # the other thread is ending the job: this one waits to be killed
            return
        # Each wait below ends early on stop(): a run that closed meanwhile gets no verdict.
        if self._paused_recently() and self._stop.wait(5 * self.pause_gap):
            return  # thawed to be killed: no verdict; still here after the wait, judge afresh
        lower_waits = any(r < self.launch.rank and self._fresh(r) and self.seen[r].beat["collective"]
                          for r in self.seen)
        if lower_waits and self._stop.wait(4 * self.interval):
            return  # a lower rank waits too and says the same: let it speak first
        errand = self._ask()
        if not errand["first"]:  # another rank claimed the verdict: it speaks and ends the job
            self._stop.wait(3600)
            return
        self._verdict(f"error: {line or self.diagnose(entry, errand['where'])}")

    def _data_line(self, waited_s: float) -> str:
        return (f"rank {self.launch.rank} (host {self.host}) waited {waited_s:.0f} s on its data at step "
                f"{self.step}: the dataset's __iter__ (or its DataLoader workers) yielded no batch; --timeout is "
                f"{self.timeout_s:g} s; the job ends (exit {EXIT_RANK_LOST}); {self.checkpoint}")

    def await_verdict(self, error: BaseException) -> None:
        """Inside a collective whose connection to a peer broke: wait for the end of the job,
        which the launcher (a peer that ended) or the watch thread (within --timeout) brings.
        Without a watch thread (one rank, or stopped) the error goes on up."""
        if self.launch.world_size == 1 or not self._threads or self._stop.is_set():
            return
        if self._stop.wait(self.timeout_s + 30):
            return
        self._verdict(f"error: rank {self.launch.rank} (host {self.host}) lost its connection to a peer at step "
                      f"{self.step} ({one_line(error)}) and no rank reached a verdict within --timeout "
                      f"{self.timeout_s:g} s; the job ends (exit {EXIT_RANK_LOST}); {self.checkpoint}")

    def _verdict(self, line: str) -> None:
        """The job ends with 69: the line said, recorded for the job scripts (CKPT_DIR/status)."""
        print(line, file=sys.stderr, flush=True)
        if self.record is not None:
            self.record(EXIT_RANK_LOST, line)
        self.end(EXIT_RANK_LOST)

    def user_collective_failed(self, error: BaseException) -> None:
        """A collective inside the user's code (loss_fn calling torch.distributed, or DDP's own
        in forward) hit the process group's timeout: the watchdog's verdict, named where it was
        called. Or it lost its peer: when the other rank's collective timed out first, gloo closed
        the connection under this one; that rank gives the verdict and asks this one where it is,
        so this one waits for the end with its heartbeat answering (it had stopped its watchdog
        and slept, and the verdict said it "stopped answering", without its stacks: seen under load)."""
        from .hang_report import where_raised  # noqa: PLC0415

        self.own_place, self.own_error = where_raised(error) or "in a collective of the user's code", error
        if timed_out(error):
            self.expire((self.own_place, True, time.monotonic() - self.timeout_s))
        else:
            self.await_verdict(error)

    def _fresh(self, rank: int) -> bool:
        """Its heartbeat changed within the last 3 intervals: as this rank saw it change, and
        by the beat's own clock (hosts' clocks agree to milliseconds where NTP runs)."""
        seen = self.seen.get(rank)
        return seen is not None and self._age(seen) <= 3 * self.interval

    @staticmethod
    def _age(seen: Seen) -> float:
        return max(time.monotonic() - seen.changed_at, time.time() - seen.beat["wall"])

    def diagnose(self, entry: tuple[str, bool, float], places: dict[int, str] | None = None) -> str:
        name, _, since = entry
        now, me = time.monotonic(), self.launch.rank
        place = name if name.startswith("in ") else f"in the {name}"  # the user's code's place reads "in X at F:L"
        waited = f"rank {me} (host {self.host}) waited {now - since:.0f} s {place} at step {self.step}"
        store_stuck = self.store_call_since is not None and now - self.store_call_since > 3 * self.interval
        lost, busy, waiting = [], [], []
        for rank in range(self.launch.world_size):
            if rank == me:
                continue
            if not self._fresh(rank):
                lost.append(rank)
            elif self.seen[rank].beat["collective"]:
                waiting.append(rank)
            else:
                busy.append(rank)
        if store_stuck and me != 0:
            held = now - self.store_call_since
            line = (f"{self._describe(0, 'stopped answering')}: the rendezvous store on its host has not answered "
                    f"for {held:.0f} s ({waited})")
        elif lost:
            line = "; ".join(self._describe(r, "stopped answering") for r in lost) + f" ({waited})"
        elif busy:
            line = ("; ".join(self._describe(r, "is alive but never reached the collective") for r in busy)
                    + f" ({waited})")
        else:
            others = ", ".join(f"rank {r} in the {self.seen[r].beat['phase']} at step {self.seen[r].beat['step']}"
                               for r in waiting)
            line = (f"the ranks are alive but disagree about the collectives (rank-dependent code around a "
                    f"collective?): rank {me} {place} at step {self.step}, {others}")
        if places:
            line += "; where each live rank is: " + "; ".join(f"rank {r} {places[r]}" for r in sorted(places))
            folder = os.path.join(self.report_dir, f"hang-{self.step}") if self.report_dir else None
            line += f" (their stacks: {folder or 'on stderr'})"
        return f"{line}; --timeout is {self.timeout_s:g} s; the job ends (exit {EXIT_RANK_LOST}); {self.checkpoint}"

    def _describe(self, rank: int, what: str) -> str:
        seen = self.seen.get(rank)
        if seen is None:
            where = f" (at {self.launch.master_addr}, which holds the rendezvous store)" if rank == 0 else ""
            return f"rank {rank}{where} {what} (no heartbeat read from it{self._store_note()})"
        beat, age = seen.beat, self._age(seen)
        return (f"rank {rank} (host {beat['host']}) {what} at step {beat['step']} (last seen {age:.0f} s ago, in "
                f"the {beat['phase']} for {beat['phase_s']:.0f} s)")

    def _store_note(self) -> str:
        return f"; the store said {self.store_error}" if self.store_error else ""
