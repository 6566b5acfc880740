"""The checkpoint manager: saves and restores a set of stateful parts, rank 0 writing,
in the background by default.

    manager.add("optimizer", OptimizerState(optimizer))          # one line a part
    manager.add("rng", RNGState(), per_rank=True)                 # every rank's, saved as rng_per_rank
    manager.add("state/ema", ema, per_rank="auto")                # rank 0's, or every rank's where they differ

A save point is one collective (save()): every rank's per-rank parts are gathered to rank
0, together with rank 0's verdict on the write before; rank 0 serialises the checkpoint
into memory, which is the whole stall, and a thread writes it (temporary file, fsync,
rename, the kept checkpoints rotated: checkpoint.py) while training goes on. At most one
write is in flight: the next save point waits for it, and a write that failed ends the run
there, on every rank, with exit 74 and the kept checkpoints intact. finish() waits for the
last write at the end of the run, or at a stop.

A thread, not a process, writes: what needs the GIL (torch.save's pickling, and on GPUs the
copy to host memory) is done before the thread starts, and the thread's work, write(2) and
fsync(2) of one buffer, releases the GIL for its whole length. So the loop runs on at full
speed (measured: docs/reliability.md) without a second process that would hold a second
copy of the state, be forked from a process with MPI and NCCL threads, or be started and
fed through shared memory (torchtitan and NVIDIA's resiliency extension do that because
their writers pickle in the background).
"""
from __future__ import annotations

import hashlib
import threading
import time
from typing import Any, Callable, Literal, Protocol

import torch

from ..errors import SaveFailed
from ..parallel.collectives import all_ranks, gather_to_main, print_main
from ..parallel.launch import Launch
from . import checkpoint as ckpt


class Stateful(Protocol):
    def state_dict(self) -> Any: ...
    def load_state_dict(self, state: Any) -> None: ...


PerRank = Literal[False, True, "auto"]
PER_RANK = "_per_rank"  # the key suffix of a part saved for every rank: rng_per_rank, data_per_rank


class Writer:
    """One background write at a time. wait() returns its failure, or None; `seconds` is
    how long the last one took."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def start(self, write: Callable[[], None], done: Callable[[], None]) -> None:
        """Run write() in the background; done() after it succeeded (rank 0 knows at once)."""
        def run() -> None:
            began = time.monotonic()
            try:
                write()
                done()
            except Exception as e:  # disk full, quota, folder gone or read-only: the next save point says so
                e.__traceback__ = None  # its frames hold the serialised checkpoint
                self.error = e
            self.seconds = time.monotonic() - began
        self.error = None
        self.thread = threading.Thread(target=run, name="ddp_abci-checkpoint-writer", daemon=True)
        self.thread.start()

    def wait(self) -> BaseException | None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return self.error

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class CheckpointManager:
    def __init__(self, ckpt_dir: str | None, launch: Launch, watchdog: Any, *, keep: int = 2,
                 background: bool = True, header: dict | None = None,
                 on_written: Callable[[float], None] | None = None) -> None:
        """`header`: the keys that describe the run (format, world size, config, ...), saved beside the parts;
        `on_written(seconds)` hears how long each save cost the loop and the disk together
        (the --stop-after reserve)."""
        self.file = ckpt.checkpoint_path(ckpt_dir) if ckpt_dir else None
        self.launch, self.watchdog, self.keep, self.background = launch, watchdog, keep, background
        self.header, self.on_written = dict(header or {}), on_written
        self.parts: dict[str, tuple[Stateful, PerRank, bool]] = {}
        self.writer = Writer()
        self.rotate = True       # False after a resume from a kept checkpoint: never keep a bad last.pt
        self.saved = 0           # checkpoints written (and confirmed) by this run
        self.stall_s = 0.0       # seconds the loop was blocked by saves, all of them
        self.last_stall_s = 0.0  # the last save's
        self.last_line = ""
        self._pending: tuple[int, float, int] | None = None  # the write in flight: step, its stall, bytes

    @property
    def enabled(self) -> bool:
        return self.file is not None

    def add(self, key: str, part: Stateful, *, per_rank: PerRank = False, spread: bool = False) -> None:
        """Save `part` under `key`: rank 0's (per_rank=False), every rank's (True: `key` holds
        rank 0's, `key_per_rank` all), or "auto": rank 0's alone where every rank's is
        the same, bit for bit, else every rank's too. `spread`: the part's own keys go at
        the checkpoint's top level (the position's epoch, batch_in_epoch and step)."""
        self.parts[key] = (part, per_rank, spread)

    # -- saving ----------------------------------------------------------------------------

    def save(self, step: int) -> None:
        """Collective: one checkpoint at this step (a no-op without --ckpt-dir)."""
        if not self.enabled:
            return
        began = time.monotonic()
        gathered = all_ranks((self._previous_verdict(), self._per_rank_states()))
        if gathered[0][0]:
            raise SaveFailed(gathered[0][0])
        self._confirm()
        ranks = [states for _, states in gathered]
        self._gather_differing(ranks)
        for part, _, _ in self.parts.values():
            if hasattr(part, "consolidate"):  # a sharded optimizer's state, gathered to rank 0 (--zero)
                part.consolidate()
        size = 0
        if self.launch.is_main:
            with self.watchdog.working("serialising the checkpoint"):
                data = ckpt.serialize(self._snapshot(ranks))
            size = len(data)
            self.writer.start(lambda: self._write(data), lambda: self.watchdog.note_checkpoint(step, self.file))
        stall = time.monotonic() - began
        self._pending = (step, stall, size)
        self.stall_s, self.last_stall_s = self.stall_s + stall, stall
        if not self.background:
            self.finish(stalls=True)

    def finish(self, *, stalls: bool = False) -> None:
        """Collective: wait for the write in flight and share its verdict. `stalls`: the loop
        waits for it (--no-async-save); at the end of a run or a stop only the exit does, and
        that is no stall of training."""
        if not self.enabled:
            return
        began = time.monotonic()
        error = all_ranks(self._previous_verdict())[0]
        if stalls:
            self.stall_s += time.monotonic() - began
        if error:
            raise SaveFailed(error)
        self._confirm()

    def _previous_verdict(self) -> str | None:
        """Rank 0: the write in flight finished (waited for), as an error line or None."""
        if not self.launch.is_main or self._pending is None:
            return None
        with self.watchdog.working("waiting for the checkpoint write in flight"):
            error = self.writer.wait()
        return f"{ckpt.save_failure(error, self.file)} (step {self._pending[0]})" if error else None

    def _confirm(self) -> None:
        """The write in flight is on disk: count it, say so, note it for the watchdog."""
        if self._pending is None:
            return
        step, stall, size = self._pending
        self._pending = None
        self.saved += 1
        self.rotate = True
        self.watchdog.note_checkpoint(step, self.file)
        if self.launch.is_main:
            written = self.writer.seconds
            if self.on_written is not None:
                self.on_written(stall + written)
            how = "in the background" if self.background else "before training went on"
            self.last_line = (f"checkpoint: step {step} in {self.file} ({size / 1e6:.1f} MB): the loop stalled "
                              f"{stall:.2f} s, written in {written:.2f} s {how}")
            print_main(self.launch, self.last_line)

    def _write(self, data: memoryview) -> None:
        """The background thread's whole work: rotate the kept checkpoints, write, fsync, rename."""
        if self.rotate:
            ckpt.rotate(self.file, self.keep)
        ckpt.save_atomic(data, self.file)

    def _per_rank_states(self) -> dict[str, Any]:
        """This rank's per-rank parts, and a fingerprint of each "auto" one."""
        out: dict[str, Any] = {}
        for key, (part, per_rank, _) in self.parts.items():
            if per_rank is True:
                out[key] = part.state_dict()
            elif per_rank == "auto":
                out[key] = fingerprint(part.state_dict())
        return out

    def _gather_differing(self, ranks: list[dict[str, Any]]) -> None:
        """Collective where an "auto" part differs between ranks (every rank sees the same
        fingerprints, so all take this branch together): its states, gathered to rank 0."""
        for key, (part, per_rank, _) in self.parts.items():
            if per_rank == "auto" and any(r[key] != ranks[0][key] for r in ranks):
                states = gather_to_main(part.state_dict())
                for r, state in zip(ranks, states or [None] * len(ranks), strict=True):
                    r[key] = state

    def _snapshot(self, ranks: list[dict[str, Any]]) -> dict[str, Any]:
        """Rank 0: the checkpoint's dict, from its own parts and every rank's per-rank ones."""
        snapshot = dict(self.header)
        for key, (part, per_rank, spread) in self.parts.items():
            if per_rank is True:
                snapshot[key], snapshot[key + PER_RANK] = ranks[0][key], [r[key] for r in ranks]
                continue
            state = part.state_dict()
            if spread:
                snapshot.update(state)
                continue
            snapshot[key] = state
            if per_rank == "auto" and not isinstance(ranks[0][key], str):  # the states, not fingerprints
                snapshot[key + PER_RANK] = [r[key] for r in ranks]
        return snapshot

    # -- restoring -------------------------------------------------------------------------

    def restore(self, snapshot: dict[str, Any], *, skip: tuple[str, ...] = ()) -> list[str]:
        """Each part from the checkpoint (this rank's own where every rank's was saved and the
        world size is the same); returns the keys that had nothing saved (older checkpoints)."""
        same_world = snapshot.get("world_size") == self.launch.world_size
        missing = []
        for key, (part, per_rank, spread) in self.parts.items():
            own = snapshot.get(key + PER_RANK) if per_rank else None
            if key in skip:
                continue
            if spread:
                part.load_state_dict(snapshot)
            elif own is not None and same_world:
                part.load_state_dict(own[self.launch.rank])
            elif key in snapshot:
                part.load_state_dict(snapshot[key])
            else:
                missing.append(key)
        return missing


def fingerprint(state: Any) -> str:
    """A digest of a state_dict's values, bit for bit (tensors by their bytes, anything else
    by its repr): equal on two ranks exactly when their states are."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{t.dtype}{tuple(value.shape)}".encode())
            digest.update(t.view(torch.uint8).numpy() if t.numel() else b"")
        elif isinstance(value, dict):
            for k in sorted(value, key=repr):
                digest.update(repr(k).encode())
                feed(value[k])
        elif isinstance(value, (list, tuple)):
            for v in value:
                feed(v)
        else:
            digest.update(repr(value).encode())
    feed(state)
    return digest.hexdigest()
