"""Where a hang is: each live rank's threads' stacks, written out, and the one place a rank
waits named in the watchdog's line: the innermost frame of the user's code (with the call it
made there: "in all_reduce at my_train.py:54 in loss_fn"), or else the Trainer's collective
it is in ("in the stop agreement at step 3").

The user's code is a frame whose file is not ddp_abci's, torch's, Python's own library or an
installed package's, called from ddp_abci (a loss_fn, a metric, a dataset): the script that
called fit() is not where a rank waits.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from types import FrameType

import torch

_OURS = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # ddp_abci
_LIBRARIES = tuple(os.path.realpath(p) + os.sep for p in {
    _OURS,
    os.path.dirname(os.path.abspath(torch.__file__)),              # torch
    *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
})


def _users(filename: str) -> bool:
    return not os.path.realpath(filename).startswith(_LIBRARIES) and not filename.startswith("<")


def where(frame: FrameType | None, phase: str, step: int) -> str:
    """The innermost frame of the user's code in this stack (and the call it made), or the phase."""
    return _place(traceback.extract_stack(frame) if frame is not None else []) or f"in the {phase} at step {step}"


def where_raised(error: BaseException) -> str | None:
    """The same, from where an exception was raised (its traceback), or None."""
    return _place(traceback.extract_tb(error.__traceback__))


def _place(stack: traceback.StackSummary) -> str | None:
    ours = [os.path.realpath(f.filename).startswith(_OURS) for f in stack]
    for i in range(len(stack) - 1, -1, -1):
        if _users(stack[i].filename) and any(ours[:i]):
            callee = next((f.name for f in stack[i + 1:] if f.name not in ("wrapper", "inner", "<lambda>")
                           and not f.name.startswith("_")), None)
            called = f"in {callee} " if callee else ""
            return f"{called}at {os.path.basename(stack[i].filename)}:{stack[i].lineno} in {stack[i].name}"
    return None


def main_frame(thread_id: int) -> FrameType | None:
    return sys._current_frames().get(thread_id)


def dump_stacks(folder: str | None, rank: int, raised: BaseException | None = None) -> str:
    """Every thread's stack of this process, in folder/rank-R.txt (faulthandler's format, which
    needs no lock that a hung thread may hold), or on stderr without a folder; and the traceback
    of `raised`, the error this rank's own collective raised (its frames have unwound); says where."""
    if folder is not None:
        path = Path(folder) / f"rank-{rank}.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w") as f:
                _dump(f, raised)
            return str(path.parent)
        except OSError:
            pass
    _dump(sys.stderr, raised)
    return "stderr"


def _dump(f, raised: BaseException | None) -> None:
    if raised is not None:
        f.write("The collective that failed (timed out, or lost its peer), where it was called:\n")
        f.write("".join(traceback.format_exception(raised)))
        f.write("\n")
        f.flush()
    faulthandler.dump_traceback(f, all_threads=True)
