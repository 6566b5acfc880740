"""The run folder, CKPT_DIR: every file the project keeps there, named here once, and the
status record, read and written here alone. Standard library only, and nothing newer than
Python 3.9: the job scripts and login nodes use it without torch.

    last.pt, prev.pt, prev2.pt, ...  the checkpoints, newest first (checkpointing/checkpoint.py)
    status                           how the last run or job ended: key=value lines (FIELDS)
    chain.json                       the jobs submit.sh submitted for this run (cluster/submission.py)
    progress.json                    where the running job stands (tracking.py, rank 0)
    metrics.jsonl                    (where --metrics-jsonl points, when the user puts it here)
    slow_hosts.json                  hosts the run found straggling (stragglers.py)
    bad_hosts.json                   hosts an in-job restart left out, and why (cluster/restarts.py)
    tries.jsonl                      each try of each job: its start, first step, end (cluster/restarts.py)
    trackers.json                    the trackers' run ids, so a chain logs one run (trackers.py)
    hang-STEP/                       every rank's stacks at a hang verdict (parallel/watchdog.py)
    nccl-flight-recorder/            NCCL's last collectives at its own timeout (cluster/job.py)

The job scripts' bash names none of these: their Python half (cluster/) does.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

from .atomic_text import replace_text

CHECKPOINT = "last.pt"
PREVIOUS = "prev.pt"
STATUS = "status"
CHAIN = "chain.json"
PROGRESS = "progress.json"
SLOW_HOSTS = "slow_hosts.json"
BAD_HOSTS = "bad_hosts.json"
TRIES = "tries.jsonl"
TRACKERS = "trackers.json"
FLIGHT_RECORDER = "nccl-flight-recorder"
FILES = (CHECKPOINT, PREVIOUS, STATUS, CHAIN, PROGRESS, SLOW_HOSTS, BAD_HOSTS, TRIES, TRACKERS)
# A write's temporary names (a file renamed over its target once whole), left behind by a crash.
STALE_PATTERNS = (f".{CHECKPOINT}.*.tmp", ".prev*.pt.*.tmp", f".{STATUS}.*.tmp")

FIELDS = ("status", "finished", "step", "rank", "host", "unix", "line", "failures", "chain")


def path(ckpt_dir: str | os.PathLike, name: str) -> Path:
    """DIR/name, for one of the names above."""
    return Path(ckpt_dir) / name


def previous_names(keep: int) -> list[str]:
    """The names the checkpoints before last.pt are kept under, newest first: prev.pt,
    prev2.pt, ... (keep - 1 of them)."""
    return [PREVIOUS] + [f"prev{i}.pt" for i in range(2, keep)] if keep > 1 else []


def kept_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """last.pt, then the kept ones that exist, newest first."""
    folder = Path(ckpt_dir)
    kept = {int(p.stem[4:] or 1): p for p in folder.glob("prev*.pt") if p.stem[4:] in ("", *map(str, range(2, 1000)))}
    return [folder / CHECKPOINT] + [kept[n] for n in sorted(kept) if kept[n].is_file()]


def hang_folder(ckpt_dir: str | os.PathLike, step: int) -> Path:
    """Where each rank's stacks go at a hang verdict at `step`."""
    return Path(ckpt_dir) / f"hang-{step}"


# -- the status record ----------------------------------------------------------------------

def write_status(ckpt_dir: str | os.PathLike, status: int, *, finished: bool, step: int | str, line: str,
                 rank: int | str, host: str, failures: int = 0, chain: str = "") -> None:
    """DIR/status, atomically (a temporary file renamed over it). Best effort: a folder that
    cannot take it (exit 74's) is left as it was."""
    values = {"status": status, "finished": int(finished), "step": step, "rank": rank, "host": host,
              "unix": int(time.time()), "line": line, "failures": failures, "chain": chain}
    text = "".join(f"{key}={' '.join(str(values[key]).split())}\n" for key in FIELDS)
    with contextlib.suppress(OSError):
        replace_text(path(ckpt_dir, STATUS), text)


def read_status(ckpt_dir: str | os.PathLike) -> dict[str, str]:
    """DIR/status's fields ({} when there is none)."""
    try:
        text = path(ckpt_dir, STATUS).read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def fingerprint(ckpt_dir: str | os.PathLike) -> str:
    """The status file's digest: a record is a job's own when it changed since. Its time cannot
    tell: a job that fails at once ends within the second the one before it recorded in."""
    try:
        return hashlib.sha1(path(ckpt_dir, STATUS).read_bytes()).hexdigest()
    except OSError:
        return "none"

