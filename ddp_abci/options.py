"""One home for each option: a dataclass field that carries its command-line flag, its help
and its valid range or choices. The command line (cli.py), the range checks below and the
fuzzed command-line test are all derived from these fields, so a new option is one edit.

    epochs: int = option(200, "passes over the training set", low=1)

Imports nothing heavy: the command line answers --help and bad flags before torch loads.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, Field, field, fields
from typing import Any

from .errors import UsageError

INF = float("inf")


def option(default: Any, help: str, *, flag: str | None = None, low: float | None = None,
           high: float | None = None, choices: tuple[str, ...] | None = None, path: bool = False,
           negatable: bool = False, metavar: str | tuple[str, ...] | None = None, kind: Any = None,
           words: tuple[str, ...] = ()) -> Any:
    """A field with its flag (default: --the-field-name), help, and what values are valid.
    path: a file or folder name (the fuzz test tries hostile paths on it); negatable: a
    switch that also has --no-FLAG; kind: the value's type where the default (None) does
    not tell it; words: names a number option also takes (--save-every-minutes auto)."""
    return field(default=default, metadata={"flag": flag, "help": help, "low": low, "high": high, "choices": choices,
                                            "path": path, "negatable": negatable, "metavar": metavar, "kind": kind,
                                            "words": words})


def number_or_word(kind: type, words: tuple[str, ...]):
    """The command line's converter for a number option that also takes some words."""
    def convert(text: str) -> Any:
        return text if text in words else kind(text)
    convert.__name__ = f"{kind.__name__} or {' or '.join(words)}"  # argparse names it in its error
    return convert


def not_a_flag(default: Any, why: str) -> Any:
    """A field the command line cannot set (a callable, say), with the reason."""
    return field(default=default, metadata={"not_a_flag": why})


def flag_of(f: Field) -> str | None:
    """The field's command-line flag, or None for a field marked not_a_flag."""
    if "not_a_flag" in f.metadata:
        return None
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def setting(cls: type, name: str) -> str:
    """How a message names a setting for both audiences: 'global_batch (--bs)'."""
    flag = flag_of(next(f for f in fields(cls) if f.name == name))
    return f"{name} ({flag})" if flag else name


def default_of(f: Field) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def check_fields(obj: Any) -> None:
    """Every number finite and in its range, every choice one of its choices: a UsageError
    naming the field and its flag otherwise."""
    for f in fields(obj):
        value, meta = getattr(obj, f.name), f.metadata
        if meta.get("choices") and value is not None:
            check_choice(setting(type(obj), f.name), value, meta["choices"])
        if value in meta.get("words", ()):
            continue
        if meta.get("low") is not None or meta.get("high") is not None:
            low = meta["low"] if meta.get("low") is not None else -INF
            high = meta["high"] if meta.get("high") is not None else INF
            for item in value if isinstance(value, (tuple, list)) else (value,):
                check_range(setting(type(obj), f.name), item, low, high)
        if meta.get("path") and value is not None and not str(value).strip():
            raise UsageError(f"{setting(type(obj), f.name)} is an empty path; name a file or folder, or leave it out")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """The one check of every named choice: a UsageError listing them."""
    if value not in choices:
        raise UsageError(f"unknown {name} {value!r}; use one of {', '.join(choices)}")


def check_range(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name} must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or not low <= value <= high:
        bounds = f"at least {low:g}" if high == INF else f"between {low:g} and {high:g}"
        raise UsageError(f"{name} must be finite and {bounds}, got {value!r}")
