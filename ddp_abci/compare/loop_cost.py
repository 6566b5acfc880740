"""The Trainer's loop against DDP's floor, paired in one pair of processes:

    mpirun -n 2 python -m ddp_abci.compare.loop_cost [--rounds 40] [--epochs 3] [--bs 50] [--out FILE.json]

The benchmark (compare/bench.py) runs each side and each floor in a fresh mpirun, seconds to
minutes apart; on a shared 2-core VM the machine's pace moves by tens of percent within
seconds, and its raw / DDP floor ratio moved between 0.91 and 1.10 over four runs of one tree
(docs/benchmark.md). Here the ranks open one process group and alternate, round after round:

    floor          DDP's step (model.wrap_model, the trainer's gradient path) on one batch in memory
    floor + data   the same, each batch read from the seed's set as the trainer reads it
    trainer        the Trainer on the seed's job (TrainConfig's defaults, --epochs, --bs)

each over the same steps (the floors: --epochs epochs' worth), and report, for each ratio, the
median over the rounds of that round's ratio: the machine's drift is paired out. Each rate is
the whole timed loop's, as the benchmark's (the floors after 20 warm-up steps, the trainer from
the end of its first step, epoch ends and agreements included).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import statistics
import sys
from pathlib import Path

RATIOS = {"trainer / floor": ("trainer", "floor"), "trainer / floor + data": ("trainer", "floor + data"),
          "floor + data / floor": ("floor + data", "floor")}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.compare.loop_cost")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--epochs", type=int, default=3, help="the trainer's epochs a round (the seed's set: 200 steps each "
                                                       "at --bs 50 on 2 ranks)")
    p.add_argument("--bs", type=int, default=50, help="global batch")
    p.add_argument("--num-items", type=int, default=10000)
    p.add_argument("--out", default=None, help="the report as JSON (rank 0)")
    return p


def floor_rate(launch, device, comm: str, per_rank: int, steps: int, num_items: int, data: bool) -> float:
    """One run of the DDP floor: samples/s over all ranks."""
    from .probes import _floor_loop, _seed_batches

    batches = _seed_batches(launch, per_rank, num_items) if data else None
    result = _floor_loop(launch, per_rank, steps, "auto", device, lockstep=False, comm=comm, batches=batches)
    gc.collect()  # DDP's reducer sits in reference cycles: free it while the group is open
    return result["samples_per_s"] * launch.world_size


def trainer_rate(launch, device, comm: str, args: argparse.Namespace) -> float:
    """One run of the Trainer on the seed's job, its lines kept off the output: samples/s."""
    from ..autoencoder_job import AutoencoderJob
    from ..config import TrainConfig
    from ..trainer import Trainer

    config = TrainConfig(epochs=args.epochs, global_batch=args.bs, comm=comm)
    job = AutoencoderJob(num_items=args.num_items)
    with contextlib.redirect_stdout(io.StringIO()), Trainer(config, launch, device, seed_job=job) as trainer:
        trainer.run()
    return trainer.clock.samples_per_s()


def gradient_path_name(launch, device) -> str:
    """The path --comm auto takes (measured once, as the trainer measures it), for all three loops."""
    from ..autoencoder import build_model
    from ..parallel.comm_choice import measure_and_choose
    from ..plan import resolve_comm

    comm = resolve_comm("auto", launch, device)
    if comm == "measure":
        comm = measure_and_choose(4 * sum(p.numel() for p in build_model(0).parameters()))[0].name
    return comm


def report(rounds: list[dict], comm: str, args: argparse.Namespace) -> dict:
    ratios = {name: statistics.median(r[a] / r[b] for r in rounds) for name, (a, b) in RATIOS.items()}
    return {"config": vars(args), "comm": comm, "rounds": rounds, "median_ratios": ratios,
            "median_samples_per_s": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..parallel.launch import discover_launch
    from ..parallel.process_group import distributed

    launch = discover_launch()
    per_rank, rounds = args.bs // launch.world_size, []
    steps = args.epochs * -(-args.num_items // args.bs)
    with distributed(launch) as device:
        comm = gradient_path_name(launch, device)
        for round_ in range(args.rounds):
            rates = {"floor": floor_rate(launch, device, comm, per_rank, steps, args.num_items, data=False),
                     "floor + data": floor_rate(launch, device, comm, per_rank, steps, args.num_items, data=True),
                     "trainer": trainer_rate(launch, device, comm, args)}
            rounds.append(rates)
            if launch.is_main:
                print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items())
                      + " samples/s", flush=True)
    if launch.is_main:
        out = report(rounds, comm, args)
        print(f"median over {len(rounds)} rounds of each round's ratio (gradients via {comm}): "
              + ", ".join(f"{name} {value:.3f}" for name, value in out["median_ratios"].items()), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
