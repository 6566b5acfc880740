"""Across a slow link: `python -m ddp_abci.bench --link 1gbit,0.5ms` (root).

Two hosts on this machine (network namespaces, netlab.py), one rank each, the second host's
link shaped by tc (a rate, and a delay each way). Every side of --sides runs across them (fresh
mpiruns, alternating, as the main benchmark); `raw` with its default --comm auto, which measures
both gradient paths at its start and takes the faster, and the raw trainer twice more, forced
through each path: `raw mpi` (the MPI hook) and `raw gloo`. JSON key `link`.

How much of the all-reduce backward hides, per raw run: overlap = 1 - exposed / alone, where
`exposed` is the part of a step that is not this rank's compute (the step's time less the
straggler clock's compute median, which leaves out the waits) and `alone` the all-reduce of
the gradients by itself across the same link (probes.py allreduce). 0: all of it waited for.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
from pathlib import Path

from .bench import mpirun_prefix, probe
from .netlab import NetLab


def run_link(args: argparse.Namespace, sides: list[str], run_side, summarise, ratios) -> dict:
    rate, _, delay = args.link.partition(",")
    with tempfile.TemporaryDirectory() as tmp, NetLab(["hosta", "hostb"], Path(tmp)) as lab:
        lab.shape("hostb", rate, delay or None)
        at = copy.copy(args)
        at.world_size, at.master_addr = 2, lab.addr["hosta"]
        # One thread a rank: both "hosts" share this machine's cores.
        at.mpirun_args = [*args.mpirun_args, *lab.mpi_args(), "--hostfile", str(lab.hostfile()), "--map-by",
                          "ppr:1:node", "--bind-to", "none", "-x", "PATH", "-x", "OMP_NUM_THREADS=1"]
        at.wrap = lambda cmd: lab.as_host("hosta", cmd)
        named = [s for s in sides if s != "raw1"]
        forced = {"raw mpi": ("raw", ("--comm", "mpi")), "raw gloo": ("raw", ("--comm", "gloo")),
                  **compressed_sides(args)}
        everyone = [*named, *forced]
        runs: dict[str, list[dict]] = {s: [] for s in everyone}
        for round_ in range(args.rounds):
            for side in everyone if round_ % 2 == 0 else reversed(everyone):
                base, extra = forced.get(side, (side, ()))
                runs[side].append(run_side(base, at, Path(tmp), round_, extra))
        alone = probe(at.wrap([*mpirun_prefix(at, 2), sys.executable, "-m", "ddp_abci.compare.probes", "allreduce",
                               "--iters", "10", "--dim-in", str(args.dim_in), "--dim-hidden", str(args.dim_hidden)]),
                      args.timeout)
    results = {side: summarise(r) for side, r in runs.items()}
    shown = {k: v for k, v in ratios(results).items() if k.startswith("throughput")}
    gloo, mpi = results.get("raw gloo", {}), results.get("raw mpi", {})
    if "samples_per_s" in gloo and "samples_per_s" in mpi:
        shown["throughput raw (MPI hook) / raw through gloo"] = mpi["samples_per_s"] / gloo["samples_per_s"]
    shown.update(compression_ratios(results, args.compression))
    chosen = [r.get("gradients") for r in runs.get("raw", []) if not r.get("failed")]
    measured = [r.get("gradients_measured_ms") for r in runs.get("raw", []) if not r.get("failed")]
    overlap = {side: _overlap(runs[side], alone.get(f"{path}_ms"))
               for side, path in (("raw", chosen[0] if chosen else None), ("raw mpi", "mpi"), ("raw gloo", "gloo"))}
    print(f"link {args.link}: " + ", ".join(f"{k} {v:.2f}" for k, v in shown.items() if v is not None)
          + f"; overlap {overlap}", flush=True)
    return {"rate": rate, "delay": delay or None, "sides": results, "ratios": shown, "allreduce_alone": alone,
            "overlap": overlap, "raw_chose": chosen,
            "raw_measured_ms": measured}


def _overlap(runs: list[dict], alone_ms: float | None) -> dict | None:
    """The raw runs' median step, compute and exposed communication, and the overlap fraction."""
    ok = [r for r in runs if not r.get("failed") and r.get("stragglers")
          and r["stragglers"][0]["median_step_compute_ms"] is not None]
    if not ok or not alone_ms:
        return None
    step_ms = statistics.median(1e3 * r["global_batch"] / r["samples_per_s"] for r in ok)
    compute_ms = statistics.median(r["stragglers"][0]["median_step_compute_ms"] for r in ok)
    exposed = max(0.0, step_ms - compute_ms)
    return {"step_ms": round(step_ms, 3), "compute_ms": round(compute_ms, 3), "exposed_ms": round(exposed, 3),
            "allreduce_alone_ms": round(alone_ms, 3), "overlap": round(max(0.0, 1 - exposed / alone_ms), 3)}


PEER_HOOKS = {"powersgd": "power_sgd", "fp16": "fp16", "bf16": "bf16"}  # Accelerate's DDPCommunicationHookType


def compressed_sides(args: argparse.Namespace) -> dict[str, tuple[str, tuple[str, ...]]]:
    """--compression's sides: the raw trainer with each (`raw powersgd`, ...), and Accelerate
    given the same hook with the same PowerSGD settings (`accelerate powersgd`, ...) for those
    of --peer-compression."""
    sides: dict[str, tuple[str, tuple[str, ...]]] = {}
    powersgd = ("--powersgd-rank", str(args.powersgd_rank), "--powersgd-warmup-steps", str(args.powersgd_warmup_steps))
    option = json.dumps({"matrix_approximation_rank": args.powersgd_rank,
                         "start_powerSGD_iter": args.powersgd_warmup_steps})
    for kind in args.compression:
        sides[f"raw {kind}"] = ("raw", ("--grad-compression", kind, *(powersgd if kind == "powersgd" else ())))
        if kind in args.peer_compression:
            sides[f"accelerate {kind}"] = ("accelerate", ("--comm-hook", PEER_HOOKS[kind], *(
                ("--comm-state-option", option) if kind == "powersgd" else ())))
    return sides


def compression_ratios(results: dict, kinds: list[str]) -> dict[str, float]:
    """Each compressed raw side against the best peer as it runs by default, against Accelerate
    given the same hook, and its final loss against uncompressed raw's after the same steps."""
    def rate(side: str) -> float | None:
        return results.get(side, {}).get("samples_per_s")

    peers = [rate(p) for p in ("accelerate", "fabric", "textbook") if rate(p)]
    out: dict[str, float] = {}
    for kind in kinds:
        raw = rate(f"raw {kind}")
        if raw and peers:
            out[f"throughput raw {kind} / best default peer"] = raw / max(peers)
        if raw and rate(f"accelerate {kind}"):
            out[f"throughput raw {kind} / accelerate {kind}"] = raw / rate(f"accelerate {kind}")
        plain, lossy = results.get("raw", {}).get("final_loss"), results.get(f"raw {kind}", {}).get("final_loss")
        if plain and lossy is not None:
            out[f"final loss raw {kind} / raw"] = lossy / plain
    return out
