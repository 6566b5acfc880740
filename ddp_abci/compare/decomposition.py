"""Where the raw trainer's lead comes from: `python -m ddp_abci.bench --decompose`.

From the textbook script (PyTorch's DDP tutorial), the raw trainer's choices are applied one
after another, each one flag of the textbook script (textbook.SWITCHES), each measured in the
same rounds as the sides; the last entry is the raw trainer itself. Each entry's gain over
the one before, as a share of raw's whole lead over the textbook, is what the benchmark docs
read: "of raw's lead over the textbook script, x% is the MPI hook". A share depends on the
order the choices are applied in (each is measured with the ones before it in place).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable

from .textbook import SWITCHES


def steps() -> list[tuple[str, tuple[str, ...]]]:
    """(change, the textbook's flags) for each entry but the last, the switches accumulating."""
    out = [("the textbook script", ())]
    for i, (_, help) in enumerate(SWITCHES):
        out.append((f"+ {help}", tuple(flag for flag, _ in SWITCHES[:i + 1])))
    return out


def run_round(args, run_side: Callable, workdir: Path, round_: int, plain: dict | None = None) -> list[dict]:
    """One round of every entry but the raw trainer, in fresh mpiruns, the order reversed on
    odd rounds (as the sides are). `plain`: this round's run of the textbook side when --sides
    has it, the same command as the first entry, so it is not run twice."""
    order = steps() if round_ % 2 == 0 else list(reversed(steps()))
    results = {flags: plain if plain is not None and not flags else run_side("textbook", args, workdir, round_, flags)
               for _, flags in order}
    return [results[flags] for _, flags in steps()]


def summarise(rounds: list[list[dict]], raw: dict) -> list[dict]:
    """The JSON key `decomposition`: one entry per change, the median over the rounds; the raw
    trainer's entry from its own side, measured in the same rounds."""
    entries = []
    for i, (change, flags) in enumerate(steps()):
        rates = [r[i]["samples_per_s"] for r in rounds if not r[i].get("failed")]
        entries.append({"change": change, "flags": list(flags), "samples_per_s": statistics.median(rates) if rates
                        else None, "rounds_samples_per_s": rates})
    entries.append({"change": "= the raw trainer (its loop adds the stop agreement, the watchdog and the logs)",
                    "flags": [], "command": "python -m ddp_abci.train", "samples_per_s": raw.get("samples_per_s"),
                    "rounds_samples_per_s": None})
    first, last = entries[0]["samples_per_s"], entries[-1]["samples_per_s"]
    for before, entry in zip(entries, entries[1:], strict=False):
        if entry["samples_per_s"] and before["samples_per_s"]:
            entry["gain_samples_per_s"] = entry["samples_per_s"] - before["samples_per_s"]
            if first and last and last != first:
                entry["share_of_raw_lead"] = entry["gain_samples_per_s"] / (last - first)
    return entries


def lines(entries: list[dict]) -> list[str]:
    out = ["where raw's lead over the textbook script comes from (each change applied after the ones above):"]
    for e in entries:
        rate = f"{e['samples_per_s']:,.0f}" if e.get("samples_per_s") else "FAILED"
        share = f"  ({e['share_of_raw_lead']:+.0%} of raw's lead)" if "share_of_raw_lead" in e else ""
        out.append(f"  {rate:>9} samples/s  {e['change']}{share}")
    return out
