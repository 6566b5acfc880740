"""How raw's lead changes as the model grows: `python -m ddp_abci.bench --sizes 1000x100,2000x1000,4000x4000`.

At each size (the seed's autoencoder, DIM_IN x DIM_HIDDEN) every side of --sides trains the
same number of steps, fewer as the model grows (about the same arithmetic in each run), in
fresh mpiruns, alternating, as the main benchmark; JSON key `sizes`, one entry per size with
dim_in, dim_hidden, parameters, steps, sides (shaped like the top-level `sides`) and ratios;
the chart draws the ratios against the parameters.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

SEED_PARAMETERS = 2 * 1000 * 100 + 1000 + 100


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in (x for x in text.split(",") if x):
        dim_in, _, dim_hidden = item.partition("x")
        if not (dim_in.isdigit() and dim_hidden.isdigit()):
            raise SystemExit(f"error: --sizes {item!r}: give DIM_INxDIM_HIDDEN, e.g. 4000x4000")
        sizes.append((int(dim_in), int(dim_hidden)))
    return sizes


def parameters(dim_in: int, dim_hidden: int) -> int:
    return 2 * dim_in * dim_hidden + dim_in + dim_hidden


def steps_at(args: argparse.Namespace, params: int) -> int:
    """The steps each run trains at this size: the main run's, scaled down with the model
    (at least 30, so that the timed loop, which leaves out the first step, is long enough)."""
    base = args.max_steps or args.epochs * -(-args.num_items // args.bs)
    return max(30, int(base * SEED_PARAMETERS / params))


def run_sizes(args: argparse.Namespace, sides: list[str], run_side, summarise, ratios) -> list[dict]:
    entries = []
    for dim_in, dim_hidden in parse_sizes(args.sizes):
        at = copy.copy(args)
        params = parameters(dim_in, dim_hidden)
        at.dim_in, at.dim_hidden, at.max_steps, at.epochs = dim_in, dim_hidden, steps_at(args, params), 100000
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                for side in sides if round_ % 2 == 0 else reversed(sides):
                    runs[side].append(run_side(side, at, Path(tmp), round_))
        results = {side: summarise(r) for side, r in runs.items()}
        entry = {"dim_in": dim_in, "dim_hidden": dim_hidden, "parameters": params, "steps": at.max_steps,
                 "sides": results, "ratios": {k: v for k, v in ratios(results).items() if k.startswith("throughput")}}
        entries.append(entry)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in entry["ratios"].items() if v is not None)
        print(f"size {dim_in}x{dim_hidden} ({params:,} parameters): {shown}", flush=True)
    return entries


def save_sizes_chart(entries: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = sorted({k for e in entries for k, v in e["ratios"].items() if v is not None})
    for name in names:
        points = [(e["parameters"], e["ratios"][name]) for e in entries if e["ratios"].get(name) is not None]
        ax.plot(*zip(*points, strict=True), marker="o", label=name.replace("throughput ", ""))
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("throughput ratio")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
