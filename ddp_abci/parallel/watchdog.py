"""The hung-rank watchdog: a collective that has not completed within --timeout ends the
whole job, frozen ranks included, with one line naming who stopped answering (exit 69).

MPI collectives have no timeout, and gloo's raises on one rank while a frozen peer keeps
mpirun waiting: neither ends a job by itself. So each rank has three parts:

* the phase stack (phases.py): what the main thread is in, a collective or local work;
* the heartbeat (heartbeat.py), a thread of its own: this rank's step and phase in rank 0's
  rendezvous store, every rank's read while a collective waits;
* the watch thread, here: a collective (or a data wait) older than --timeout is the end. It asks
  the heartbeat to claim the verdict and collect every live rank's place, gives the verdict
  (diagnosis.py, a pure function of the heartbeats read) in one line, records it, and ends the
  job (MPI_Abort under mpirun, which SIGKILLs every rank, stopped ones too). It never touches
  the network itself, so it cannot hang.

One line per job: the first rank to decide claims the verdict in the store; it asks every rank
through it to write its threads' stacks (CKPT_DIR/hang-STEP/rank-R.txt) and say where its main
thread is (hang_report.py). A collective that times out inside the user's code (gloo's own
timeout) is the same verdict.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import threading
import time
from typing import Any, Callable

from .. import run_folder
from ..errors import one_line
from ..exits import EXIT_RANK_LOST
from .diagnosis import Clock, Seen, diagnose, fresh, verdict_line
from .heartbeat import Heartbeat
from .launch import Launch
from .phases import Entry, PhaseStack, peer_lost, timed_out

__all__ = ["EXIT_RANK_LOST", "Seen", "Watchdog", "collective", "end_job", "peer_lost", "timed_out"]


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


def end_job(launch: Launch, status: int) -> None:
    """End every rank of the job now, with `status`, as the launch environment does it
    (MPI_Abort under mpirun; environments/), after flushing what this rank printed."""
    sys.stdout.flush()
    sys.stderr.flush()
    for child in multiprocessing.active_children():  # DataLoader workers: stuck in a dataset, they would outlive it
        child.kill()
    launch.end_job(status)


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
        self.phases = PhaseStack(on_lost=lambda error: self.await_verdict(error),
                                 on_timed_out=lambda entry: self.expire(entry))
        self.checkpoint = (f"no checkpoint written yet in {report_dir}" if report_dir else
                           "no checkpoint was written (no --ckpt-dir)")
        # Heartbeats every 1/8 of the timeout (at most 5 s): from a quarter of the timeout on,
        # a waiting rank reads everyone's at least 5 times before it decides.
        self.interval = min(5.0, max(0.2, timeout_s / 8))
        self.heartbeat = Heartbeat(launch, self.interval, timeout_s / 4, self.phases, lambda: self.step, self._report,
                                   secret_wait_s=timeout_s)
        self.pause_gap = max(3 * min(1.0, timeout_s / 10), 2.0)
        self.last_watch = self.paused_at = time.monotonic() - 2 * self.pause_gap
        self._stop = threading.Event()
        self._ending = threading.Lock()
        self._watcher: threading.Thread | None = None
        self.own_place: str | None = None  # where this rank waits, when known better than its main thread's frame
        self.own_error: BaseException | None = None  # what its own collective raised (a timeout, a lost peer)

    @property
    def step(self) -> int:
        return self._step()

    # -- the main thread's side: the phase stack ----------------------------------------

    def waiting(self, name: str, waits_from: Callable[[], float] | None = None):
        """Around a collective: timed against --timeout (PhaseStack.waiting)."""
        return self.phases.waiting(name, waits_from)

    def working(self, name: str):
        """Around local work (loss_fn, a checkpoint write): shown to the others, not timed."""
        return self.phases.working(name)

    def awaiting_data(self):
        """Around reading the next batch: timed against --timeout (PhaseStack.awaiting_data)."""
        return self.phases.awaiting_data()

    @property
    def waited_s(self) -> float:
        """Seconds spent in collectives so far (the straggler clock leaves them out)."""
        return self.phases.waited_s

    @property
    def stack(self) -> list[Entry]:
        return self.phases.entries

    @property
    def seen(self) -> dict[int, Seen]:
        return self.heartbeat.seen

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
        self._watcher = threading.Thread(target=self._watch, name="ddp_abci-watchdog", daemon=True)
        self._watcher.start()
        if self.launch.world_size > 1:
            self.heartbeat.start()
        return self

    def stop(self, together: bool = False) -> None:
        """Before the process group closes. together: the run ended on every rank (done, or
        stopped with a checkpoint); rank 0 then waits until every heartbeat has stopped, at most
        two beats and 2 s (Heartbeat.stop)."""
        self._stop.set()
        self.heartbeat.stop(together, within=min(self.timeout_s, 2 * self.interval + 2))
        if self._watcher is not None:
            self._watcher.join(timeout=self.interval + 1)
            self._watcher = None

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
            entry, data_since = self.phases.top, self.phases.data_since
            if entry[1] and now - entry[2] > self.timeout_s:
                self.expire(entry)
            elif data_since is not None and now - data_since > self.timeout_s:
                self.expire(entry, self._data_line(now - data_since))

    def _report(self, step: str) -> str:
        """On the heartbeat's thread, asked by the speaker: this rank's stacks written, its place."""
        from .hang_report import dump_stacks, main_frame, where  # noqa: PLC0415  (torch: see hang_report)

        folder = str(run_folder.hang_folder(self.report_dir, step)) if self.report_dir else None
        dump_stacks(folder, self.launch.rank, self.own_error)
        return self.own_place or where(main_frame(self.main_thread), self.phases.top[0], self.step)

    # -- the end ---------------------------------------------------------------------

    def _paused_recently(self) -> bool:
        """This process was stopped a moment ago (the watch thread saw the gap, or has not run
        since): the others are ending the job, or will judge it themselves."""
        now = time.monotonic()
        return now - self.last_watch > self.pause_gap or now - self.paused_at < self.pause_gap

    def expire(self, entry: Entry, line: str | None = None) -> None:
        """A collective (or a data wait: its `line`) outlived --timeout: one line, then the job
        ends. Once per process."""
        if not self._ending.acquire(blocking=False):
            self._stop.wait(3600)  # the other thread is ending the job: this one waits to be killed
            return
        # Each wait below ends early on stop(): a run that closed meanwhile gets no verdict.
        if self._paused_recently() and self._stop.wait(5 * self.pause_gap):
            return  # thawed to be killed: no verdict; still here after the wait, judge afresh
        now = self._clock()
        lower_waits = any(r < self.launch.rank and seen.beat["collective"] and self._fresh(r, now)
                          for r, seen in self.seen.items())
        if lower_waits and self._stop.wait(4 * self.interval):
            return  # a lower rank waits too and says the same: let it speak first
        if self.heartbeat.store_error and not self.seen and self._stop.wait(self.heartbeat.errand_s()):
            return  # it cannot read the others: a rank that can gives the verdict, unless none has by now
        errand = self.heartbeat.ask()
        if not errand["first"]:  # another rank claimed the verdict: it speaks and ends the job
            self._stop.wait(3600)
            return
        self._verdict(f"error: {line or self.diagnose(entry, errand['where'])}")

    def _data_line(self, waited_s: float) -> str:
        return (f"rank {self.launch.rank} (host {self.heartbeat.host}) waited {waited_s:.0f} s on its data at step "
                f"{self.step}: the dataset's __iter__ (or its DataLoader workers) yielded no batch; --timeout is "
                f"{self.timeout_s:g} s; the job ends (exit {EXIT_RANK_LOST}); {self.checkpoint}")

    def await_verdict(self, error: BaseException) -> None:
        """Inside a collective whose connection to a peer broke: wait for the end of the job,
        which the launcher (a peer that ended) or the watch thread (within --timeout) brings.
        Without a watch thread (one rank, or stopped) the error goes on up."""
        if self.launch.world_size == 1 or self._watcher is None or self._stop.is_set():
            return
        if self._stop.wait(self.timeout_s + 30):
            return
        self._verdict(f"error: rank {self.launch.rank} (host {self.heartbeat.host}) lost its connection to a peer "
                      f"at step {self.step} ({one_line(error)}) and no rank reached a verdict within --timeout "
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
        so this one waits for the end with its heartbeat answering."""
        from .hang_report import where_raised  # noqa: PLC0415

        self.own_place, self.own_error = where_raised(error) or "in a collective of the user's code", error
        if timed_out(error):
            self.expire((self.own_place, True, time.monotonic() - self.timeout_s))
        else:
            self.await_verdict(error)

    @staticmethod
    def _clock() -> Clock:
        return Clock(time.monotonic(), time.time())

    def _fresh(self, rank: int, now: Clock) -> bool:
        return fresh(self.seen.get(rank), now, self.interval)

    def diagnose(self, entry: Entry, places: dict[int, str] | None = None) -> str:
        """The verdict's line for this rank's `entry` (diagnosis.py), with each live rank's place."""
        name, _, since = entry
        now, me = self._clock(), self.launch.rank
        place = name if name.startswith("in ") else f"in the {name}"  # the user's code's place reads "in X at F:L"
        waited = (f"rank {me} (host {self.heartbeat.host}) waited {now.monotonic - since:.0f} s {place} "
                  f"at step {self.step}")
        held = self.heartbeat.held_s(now.monotonic)
        store_frozen = held is not None and held > 3 * self.interval  # diagnose's "store" verdict: rank 0 named
        if not self.seen and not store_frozen and self.launch.world_size > 2:  # it read no one: it names no one
            why = self.heartbeat.store_error or "none could be read in time"
            return (f"{waited}, and read no rank's heartbeat from rank 0's store at {self.launch.master_addr} "
                    f"({why}): no rank can be named from here; --timeout is {self.timeout_s:g} s; the job ends (exit "
                    f"{EXIT_RANK_LOST}); {self.checkpoint}")
        verdict = diagnose(self.seen, me, self.launch.world_size, now, self.interval, held)
        line = verdict_line(verdict, self.seen, now, waited=waited, place=place, me=me, step=self.step,
                            store_held_s=held, master_addr=self.launch.master_addr,
                            store_error=self.heartbeat.store_error)
        if places:
            line += "; where each live rank is: " + places_line(places)
            folder = str(run_folder.hang_folder(self.report_dir, self.step)) if self.report_dir else None
            line += f" (their stacks: {folder or 'on stderr'})"
        return f"{line}; --timeout is {self.timeout_s:g} s; the job ends (exit {EXIT_RANK_LOST}); {self.checkpoint}"


def places_line(places: dict[int, str]) -> str:
    """Each place once, with the ranks there as ranges ("ranks 0-1022, 1024-4095 in the ..."): one
    line that stays readable at thousands of ranks."""
    by_place: dict[str, list[int]] = {}
    for rank in sorted(places):
        by_place.setdefault(places[rank], []).append(rank)
    return "; ".join(f"{'ranks' if len(ranks) > 1 else 'rank'} {_ranges(ranks)} {place}"
                     for place, ranks in sorted(by_place.items(), key=lambda item: item[1][0]))


def _ranges(ranks: list[int]) -> str:
    spans, start = [], ranks[0]
    for before, rank in zip(ranks, ranks[1:] + [None], strict=True):
        if rank != before + 1:
            spans.append(f"{start}" if start == before else f"{start}-{before}")
            start = rank
    return ", ".join(spans)
