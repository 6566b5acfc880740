"""Walltimes in the forms people type and schedulers print, and the time kept free before one."""
from __future__ import annotations

import re

FORMS = "use HH:MM:SS, D-HH:MM:SS, or a number with d, h, m or s (12h, 90m)"
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def to_seconds(text: str) -> int:
    """A walltime in seconds: 12:00:00, 1-00:00:00, 12h, 90m, 45s, 2d (what users type), or from
    the schedulers themselves MM:SS (squeue's %L) and plain seconds (qstat -j).
    Raises: ValueError naming the forms."""
    text = text.strip()
    unit = re.fullmatch(r"(\d+)([dhms])", text)
    if unit:
        return int(unit[1]) * UNITS[unit[2]]
    clock = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?(?:\.\d+)?", text)
    if not clock:
        raise ValueError(f"walltime {text}: {FORMS}")
    days, parts = int(clock[1] or 0), [int(p) for p in clock.groups()[1:] if p is not None]
    h, m, s = ([0] * (3 - len(parts)) + parts)
    return days * 86400 + h * 3600 + m * 60 + s


def typed(text: str) -> int:
    """A walltime as a user gives one to submit.sh: the unambiguous forms only (a bare number is
    minutes to Slurm and seconds to PBS), at least a minute. Raises: ValueError, one line."""
    if not re.fullmatch(r"(\d+-)?\d+:\d{2}:\d{2}|\d+[dhms]", text):
        raise ValueError(f"walltime {text}: {FORMS}")
    seconds = to_seconds(text)
    if seconds < 60:
        raise ValueError(f"-t {text} is too short: give at least 1m")
    return seconds


def hms(seconds: int) -> str:
    """HH:MM:SS, hours past 24 kept (PBS's and Grid Engine's walltime form)."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def slurm_time(seconds: int) -> str:
    """Slurm's -t: D-HH:MM:SS past a day, else HH:MM:SS."""
    return f"{seconds // 86400}-{hms(seconds % 86400)}" if seconds >= 86400 else hms(seconds)


def margin_s(walltime_s: int) -> int:
    """The time kept free before a walltime: 2 minutes, or a quarter of a short one."""
    return min(walltime_s // 4, 120)
