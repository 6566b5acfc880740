"""The watchdog's verdict, a pure function of the heartbeats a rank has read: who is to blame
when a collective outlived --timeout, and the one line that says so. No threads, no store, no
clock of its own: the watchdog (watchdog.py) passes everything in, and the tests pass made-up
heartbeats.

The verdicts, in the order they are tried:

    store     rank 0's rendezvous store has held this rank's call past 3 heartbeat intervals:
              rank 0 stopped answering (a frozen rank 0 freezes its store)
    lost      a rank whose heartbeat has not changed for 3 intervals stopped answering
    busy      every other rank is alive, some in local work: alive but never reached the collective
    disagree  every rank is alive and in a collective: they disagree about the collectives
"""
from __future__ import annotations

from typing import Mapping, NamedTuple


class Seen(NamedTuple):
    beat: dict        # the rank's last heartbeat: seq, step, phase, collective, phase_s, host, wall
    changed_at: float  # the reader's monotonic time when that beat was first read


class Verdict(NamedTuple):
    kind: str               # store, lost, busy or disagree
    ranks: tuple[int, ...]  # the ranks it names (for disagree: the others waiting)


class Clock(NamedTuple):
    monotonic: float  # the reader's time.monotonic()
    wall: float       # its time.time(), against the beats' own clocks


def age(seen: Seen, now: Clock) -> float:
    """Seconds since the rank's heartbeat last changed: as the reader saw it change, and by the
    beat's own clock (hosts' clocks agree to milliseconds where NTP runs), the later of the two."""
    return max(now.monotonic - seen.changed_at, now.wall - seen.beat["wall"])


def fresh(seen: Seen | None, now: Clock, interval: float) -> bool:
    """The rank's heartbeat changed within the last 3 intervals."""
    return seen is not None and age(seen, now) <= 3 * interval


def diagnose(seen: Mapping[int, Seen], me: int, world_size: int, now: Clock, interval: float,
             store_held_s: float | None = None) -> Verdict:
    """Who is to blame, from rank `me`'s point of view.

    Args:
        seen: each other rank's last heartbeat read (a rank never read is missing).
        me: the rank judging; world_size: the job's ranks.
        now: the judging rank's clocks; interval: the heartbeat interval in seconds.
        store_held_s: how long a store call of this rank's has been under way (None: none is).
    Returns: the Verdict; its ranks are sorted.
    """
    if store_held_s is not None and store_held_s > 3 * interval and me != 0:
        return Verdict("store", (0,))
    others = [r for r in range(world_size) if r != me]
    lost = tuple(r for r in others if not fresh(seen.get(r), now, interval))
    if lost:
        return Verdict("lost", lost)
    busy = tuple(r for r in others if not seen[r].beat["collective"])
    if busy:
        return Verdict("busy", busy)
    return Verdict("disagree", tuple(others))


def describe(rank: int, what: str, seen: Seen | None, now: Clock, *, master_addr: str, store_error: str = "") -> str:
    """`rank R (host H) WHAT at step S (last seen A s ago, in the PHASE for P s)`, or, never read,
    that no heartbeat was read from it (rank 0: at the store's address)."""
    if seen is None:
        where = f" (at {master_addr}, which holds the rendezvous store)" if rank == 0 else ""
        note = f"; the store said {store_error}" if store_error else ""
        return f"rank {rank}{where} {what} (no heartbeat read from it{note})"
    beat = seen.beat
    return (f"rank {rank} (host {beat['host']}) {what} at step {beat['step']} (last seen {age(seen, now):.0f} s ago, "
            f"in the {beat['phase']} for {beat['phase_s']:.0f} s)")


def verdict_line(verdict: Verdict, seen: Mapping[int, Seen], now: Clock, *, waited: str, place: str, me: int,
                 step: int, store_held_s: float | None = None, master_addr: str, store_error: str = "") -> str:
    """The verdict in words: whom it names, then `waited` (this rank's own wait) where it helps."""
    def named(rank: int, what: str) -> str:
        return describe(rank, what, seen.get(rank), now, master_addr=master_addr, store_error=store_error)

    if verdict.kind == "store":
        return (f"{named(0, 'stopped answering')}: the rendezvous store on its host has not answered for "
                f"{store_held_s or 0:.0f} s ({waited})")
    if verdict.kind == "lost":
        return "; ".join(named(r, "stopped answering") for r in verdict.ranks) + f" ({waited})"
    if verdict.kind == "busy":
        return "; ".join(named(r, "is alive but never reached the collective") for r in verdict.ranks) + f" ({waited})"
    others = ", ".join(f"rank {r} in the {seen[r].beat['phase']} at step {seen[r].beat['step']}" for r in verdict.ranks)
    return (f"the ranks are alive but disagree about the collectives (rank-dependent code around a collective?): "
            f"rank {me} {place} at step {step}, {others}")
