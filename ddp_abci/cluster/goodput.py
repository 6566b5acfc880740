"""How much of a long run's time goes to steps that count, predicted: the effective training time
ratio (ETTR) of a chain of jobs, with in-job restarts (restarts.py) and without them (each fault
ends its job, and the chain's next job waits in the queue and resumes), from the run's size, its
failure rate, its checkpoints and what a restart costs.

    python -m ddp_abci.goodput [--gpus 8 64 512 4096] [--rate 1.97e-5] [--walltime-h 12]
        [--save-stall-s 10] [--save-interval-s auto] [--start-s 120] [--restart-s 120]
        [--queue-s 3600] [--margin-s 120] [--detect-s 0] [--json]

The model, first order, faults a Poisson process of rate lam = GPUs x rate per hour of wall time:

    a job of walltime T trains in a window L = T - start - margin, saving every tau seconds at a
    stall c each (a fraction c / tau of training), and a fault loses the half interval since the
    last save on average (tau / 2) and the time to notice it (detect)
    in-job:   each fault costs restart + detect + tau / 2 of the window, and the job goes on:
              useful = (L - lam L (restart + detect + tau / 2)) (1 - c / tau),  elapsed = T + queue
    chain:    a fault ends the job; the window reached is E[min(X, L)] = (1 - e^-lam L) / lam:
              useful = ((1 - e^-lam L) / lam - (1 - e^-lam L) tau / 2) (1 - c / tau),
              elapsed = queue + start + (1 - e^-lam L) (1 / lam + detect) + e^-lam L margin
    ETTR = useful / elapsed, the elapsed time the user waits (queue waits included)

tau defaults to Young's interval, sqrt(2 c / lam) (checkpointing/save_points.py uses the same), at
most the window (a job saves at its deadline's stop anyway).
The default rate is Llama 3's: 419 unexpected interruptions in 54 days of training on 16,384
H100 GPUs (Meta, "The Llama 3 Herd of Models", 2024, section 3.3.4), 1.97e-5 a GPU-hour.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Sequence

LLAMA3_RATE = 419 / (54 * 24 * 16384)  # faults a GPU-hour


def young_interval_s(save_stall_s: float, faults_per_s: float) -> float:
    """The save interval that loses least to faults and saves, sqrt(2 c / lam) (Young 1974)."""
    return math.sqrt(2 * save_stall_s / faults_per_s) if faults_per_s > 0 else math.inf


def predict(gpus: int, rate: float = LLAMA3_RATE, walltime_h: float = 12.0, save_stall_s: float = 10.0,
            save_interval_s: float | None = None, start_s: float = 120.0, restart_s: float = 120.0,
            queue_s: float = 3600.0, margin_s: float = 120.0, detect_s: float = 0.0) -> dict:
    """Each strategy's ETTR and its parts (seconds) for one job of the chain, as the model above.
    Returns: {"in_job": {...}, "chain": {...}, "faults_per_job", "save_interval_s"}."""
    lam = gpus * rate / 3600.0  # faults a second
    window = walltime_h * 3600.0 - start_s - margin_s
    tau = save_interval_s if save_interval_s else min(young_interval_s(save_stall_s, lam), window)
    kept = 1.0 - save_stall_s / tau if math.isfinite(tau) else 1.0
    faults = lam * window
    in_job_useful = max(0.0, window - faults * (restart_s + detect_s + _half(tau))) * kept
    reached = (1 - math.exp(-lam * window)) / lam if lam > 0 else window
    failed = 1 - math.exp(-lam * window)
    chain_useful = max(0.0, reached - failed * _half(tau)) * kept
    chain_elapsed = queue_s + start_s + reached + failed * detect_s + (1 - failed) * margin_s
    in_job_elapsed = walltime_h * 3600.0 + queue_s
    return {"gpus": gpus, "faults_per_job": round(faults, 4), "save_interval_s": round(tau, 1),
            "in_job": {"useful_s": round(in_job_useful, 1), "elapsed_s": round(in_job_elapsed, 1),
                       "ettr": round(in_job_useful / in_job_elapsed, 4)},
            "chain": {"useful_s": round(chain_useful, 1), "elapsed_s": round(chain_elapsed, 1),
                      "ettr": round(chain_useful / chain_elapsed, 4)}}


def _half(tau: float) -> float:
    return tau / 2 if math.isfinite(tau) else 0.0


def table(rows: Sequence[dict]) -> str:
    """The predictions as the Markdown table docs/reliability.md shows."""
    lines = ["| GPUs | faults a job | save interval | ETTR, in-job restarts | ETTR, the chain alone |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['gpus']:,} | {row['faults_per_job']:.3g} | {row['save_interval_s'] / 60:.1f} min | "
                     f"{row['in_job']['ettr']:.3f} | {row['chain']['ettr']:.3f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_abci.goodput", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 512, 4096])
    parser.add_argument("--rate", type=float, default=LLAMA3_RATE, help="faults a GPU-hour (default: Llama 3's)")
    parser.add_argument("--walltime-h", type=float, default=12.0)
    parser.add_argument("--save-stall-s", type=float, default=10.0, help="the loop's stall at each save")
    parser.add_argument("--save-interval-s", type=float, default=None, help="default: Young's, sqrt(2 c / lam)")
    parser.add_argument("--start-s", type=float, default=120.0, help="a job's start to its first step")
    parser.add_argument("--restart-s", type=float, default=120.0, help="a fault to the first step after resume")
    parser.add_argument("--queue-s", type=float, default=3600.0, help="the queue wait before each job")
    parser.add_argument("--margin-s", type=float, default=120.0, help="kept free before the walltime")
    parser.add_argument("--detect-s", type=float, default=0.0, help="a fault to its notice (a hang: --timeout)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [predict(g, args.rate, args.walltime_h, args.save_stall_s, args.save_interval_s, args.start_s,
                    args.restart_s, args.queue_s, args.margin_s, args.detect_s) for g in args.gpus]
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
