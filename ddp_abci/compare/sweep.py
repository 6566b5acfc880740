"""Where data parallelism pays: `python -m ddp_abci.bench --sweep 50,200,800`.

At each global batch: raw on 1 rank, raw on W ranks and Accelerate on W ranks, and Fabric and
the textbook script on W ranks when --sides names them (fresh mpiruns, alternating, as the main
benchmark), and the floors measured at that batch in every round,
beside the sides (the medians are reported): one process computing the whole batch, and W
ranks in lockstep (compute plus one MPI all-reduce a step).
Written under the JSON key `sweep` (one entry per batch, `global_batch` and `sides` shaped
like the top-level `sides`), and drawn as samples/s against the global batch. At --bs, the
sides the main rounds ran are theirs (named under `reused`): the same configuration, not run
twice.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
from pathlib import Path

SWEEP_SIDES = ("raw1", "raw", "accelerate")  # and the other peers that --sides names


def run_sweep(args: argparse.Namespace, named: list[str], run_side, summarise, floors,
              measured: dict[str, list[dict]] | None = None) -> list[dict]:
    """One entry per global batch, for SWEEP_SIDES and the other sides `named` (--sides); the
    callables are bench.py's, shared with the main benchmark (`floors(args)`: one round's
    floors at args.bs, in samples/s for all ranks). `measured`: the main rounds' runs, at
    --bs: the entry at that batch takes theirs instead of running those sides again."""
    sides = SWEEP_SIDES + tuple(s for s in named if s not in SWEEP_SIDES)
    entries = []
    for batch in (int(b) for b in args.sweep.split(",") if b):
        at = copy.copy(args)
        at.bs = batch
        at_bs = batch == args.bs
        reused = {s: r for s, r in (measured or {}).items() if at_bs and s in sides and len(r) == args.rounds}
        runs: dict[str, list[dict]] = {s: list(reused.get(s, [])) for s in sides}
        floor_rounds: list[dict] = []
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                for side in sides if round_ % 2 == 0 else reversed(sides):
                    if side not in reused:
                        runs[side].append(run_side(side, at, Path(tmp), round_))
                floor_rounds.append(floors(at))  # beside the sides, in every round
        results = {side: summarise(r) for side, r in runs.items()}
        entry_floors = {name: _median([r[name] for r in floor_rounds if r.get(name)]) for name in FLOORS}
        entries.append({"global_batch": batch, "sides": results, "floors": entry_floors, "reused": sorted(reused)})
        shown = ", ".join(f"{s} {v['samples_per_s']:,.0f}" for s, v in results.items() if not v.get("failed"))
        print(f"sweep global batch {batch}: {shown} samples/s; floors {entry_floors}"
              + (f" ({', '.join(sorted(reused))} from the main rounds)" if reused else ""), flush=True)
    return entries


FLOORS = ("one_process", "lockstep")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def crossover(entries: list[dict]) -> int | None:
    """The smallest global batch at which W ranks beat 1 rank, or None."""
    for entry in entries:
        raw, one = entry["sides"].get("raw", {}), entry["sides"].get("raw1", {})
        if raw.get("samples_per_s") and one.get("samples_per_s") and raw["samples_per_s"] > one["samples_per_s"]:
            return entry["global_batch"]
    return None


def save_sweep_chart(entries: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib  # noqa: PLC0415  (the bench extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    batches = [e["global_batch"] for e in entries]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = {"raw1": "raw, 1 rank", "raw": "raw DDP, 2 ranks", "accelerate": "Accelerate, 2 ranks",
              "fabric": "Fabric, 2 ranks", "textbook": "textbook script, 2 ranks"}
    for side, label in labels.items():
        if not any(side in e["sides"] for e in entries):
            continue
        values = [e["sides"].get(side, {}).get("samples_per_s") for e in entries]
        ax.plot(batches, values, "o-", label=label)
    for key, label in (("one_process", "floor: 1 process"), ("lockstep", "floor: 2 ranks in lockstep")):
        ax.plot(batches, [e["floors"].get(key) for e in entries], "--", alpha=0.7, label=label)
    ax.set_xscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()  # else the log axis labels 3x10^2, 4x10^2, ... between the batches
    ax.set_xlabel("global batch")
    ax.set_ylabel("samples/s (median)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
