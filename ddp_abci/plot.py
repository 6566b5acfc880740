"""A picture of a run: `python -m ddp_abci.plot RUN.jsonl [--out run.png]`.

One PNG from the --metrics-jsonl log: the loss per step and per epoch with the held-out loss
beside it, the learning rate and samples/s against the step, with each resume marked.
matplotlib comes with the `bench` extra.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from .cli import OneLineParser
from .errors import UsageError
from .exits import EXIT_USAGE


def read_run(path: Path) -> list[dict]:
    """The log's step lines, in order; a line a killed run left half-written is skipped."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"{path} cannot be read ({e.strerror}); pass the file --metrics-jsonl wrote") from None
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "step" in row and "loss" in row:
            rows.append(row)
    if not rows:
        raise UsageError(f"{path} holds no step lines; pass the file --metrics-jsonl wrote")
    return rows


def read_evaluations(path: Path) -> list[dict]:
    """The log's evaluation lines ({"step", "epoch", "eval": {metric: value}}), in order."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("eval"), dict):
            rows.append(row)
    return rows


def epoch_means(rows: list[dict]) -> tuple[list[int], list[float]]:
    """Each epoch's mean step loss (rank 0's), placed at the epoch's last step."""
    ends: dict[int, list[float]] = {}
    last_step: dict[int, int] = {}
    for row in rows:
        ends.setdefault(row["epoch"], []).append(row["loss"])
        last_step[row["epoch"]] = row["step"]
    epochs = sorted(ends)
    return [last_step[e] for e in epochs], [sum(ends[e]) / len(ends[e]) for e in epochs]


def plot(rows: list[dict], out: Path, title: str, evaluations: list[dict] | None = None) -> None:
    import matplotlib  # noqa: PLC0415  (the bench extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    steps = [r["step"] for r in rows]
    resumes = [r["step"] for r in rows if r.get("samples_per_s") is None and r["step"] > 1]  # a run's first step
    fig, (ax_loss, ax_lr, ax_rate) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    losses = [r["loss"] for r in rows]
    ax_loss.plot(steps, losses, lw=0.6, alpha=0.6, label="step loss (rank 0)")
    ax_loss.plot(*epoch_means(rows), "o-", ms=3, label="epoch mean")
    held_out = [(e["step"], e["eval"]["loss"]) for e in evaluations or [] if "loss" in e["eval"]]
    if held_out:
        ax_loss.plot(*zip(*held_out, strict=True), "s-", ms=4, color="tab:green", label="held-out loss")
    finite = [v for v in losses if v is not None and math.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) > 100:
        ax_loss.set_yscale("log")  # the loss spans decades
    ax_loss.set_ylabel("loss")
    ax_lr.plot(steps, [r["lr"] for r in rows], lw=1)
    ax_lr.set_ylabel("learning rate")
    rated = [(r["step"], r["samples_per_s"]) for r in rows if r.get("samples_per_s")]
    if rated:
        ax_rate.plot(*zip(*rated, strict=True), lw=0.4, alpha=0.5)
    ax_rate.set_ylabel("samples/s")
    ax_rate.set_xlabel("optimizer step")
    for ax in (ax_loss, ax_lr, ax_rate):
        for i, step in enumerate(resumes):
            ax.axvline(step, color="tab:red", ls="--", lw=1, label="resumed" if ax is ax_loss and i == 0 else None)
        ax.grid(alpha=0.3)
    ax_loss.legend(loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m ddp_abci.plot", description="One PNG of a run from its --metrics-jsonl log.")
    p.add_argument("run", type=Path, help="the JSON-lines file --metrics-jsonl wrote")
    p.add_argument("--out", type=Path, default=None, help="the PNG to write (default: RUN with .png)")
    args = p.parse_args(argv)
    out = args.out or args.run.with_suffix(".png")
    try:
        rows = read_run(args.run)
        runs = sum(r.get("samples_per_s") is None for r in rows)
        plot(rows, out, f"{args.run.name}: {len(rows)} steps, {runs} run(s)", read_evaluations(args.run))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError:
        print("error: the plot needs matplotlib; install it with pip install 'ddp_abci[bench]'", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
