"""Reading launchers' variables: an integer that is set wrongly is named, not guessed."""
from __future__ import annotations

from typing import Mapping

from .base import LaunchError


def integer(environ: Mapping[str, str], var: str, default: int | None = None) -> int:
    """environ[var] as an int; `default` when it is absent; a LaunchError naming it otherwise."""
    if var not in environ and default is not None:
        return default
    value = integer_or_none(environ.get(var), var)
    if value is None:
        raise LaunchError(f"{var} is not set but the launcher's other variables are; set it or unset them")
    return value


def integer_or_none(value: str | None, var: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{var}={value!r} is not an integer; fix or unset it") from None
