"""Does --comm auto choose the same gradient path launch after launch? `python -m
ddp_abci.compare.comm_choice --launches 20 [--world-size 2] [--dim-in 1000 --dim-hidden 100]
[--out FILE.json]` (under mpirun's rules: root needs OMPI_ALLOW_RUN_AS_ROOT, as scripts/bench.sh sets).

Each launch is a fresh `mpirun` of the trainer for one step; its summary JSON says what it
measured and chose (`gradients`, `gradients_measured_ms`). The report: the choices counted,
each launch's milliseconds through MPI and gloo, and what the measuring cost at start-up.
Exit status 0 when every launch chose alike, 1 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_launch(args: argparse.Namespace) -> dict:
    """One fresh mpirun of one step: what its start-up measured and chose."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [args.mpirun, "-n", str(args.world_size), "--oversubscribe", "--mca", "btl", "self,sm,tcp",
               sys.executable, "-m", "ddp_abci.train", "--max-steps", "1", "--epochs", "1", "--num-items", "100",
               "--dim-in", str(args.dim_in), "--dim-hidden", str(args.dim_hidden), "--summary-json", str(summary)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300).stdout
        result = json.loads(summary.read_text()) if summary.exists() else {}
    measured = result.get("gradients_measured_ms")
    if not measured:
        return {"failed": out.strip().splitlines()[-3:]}
    return {"mpi_ms": round(measured["mpi"], 2), "gloo_ms": round(measured["gloo"], 2), "chose": result["gradients"],
            "measuring_ms": round(measured["took"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.compare.comm_choice", description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=20)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--dim-in", type=int, default=1000)
    p.add_argument("--dim-hidden", type=int, default=100)
    p.add_argument("--mpirun", default=shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun")
    p.add_argument("--out", help="write the report here as JSON")
    args = p.parse_args(argv)
    launches = []
    for n in range(args.launches):
        launches.append(one_launch(args))
        print(f"launch {n + 1}/{args.launches}: {launches[-1]}", flush=True)
    chosen = collections.Counter(r.get("chose", "failed") for r in launches)
    ok = [r for r in launches if "chose" in r]
    report = {"launches": launches, "chosen": dict(chosen), "world_size": args.world_size,
              "dim_in": args.dim_in, "dim_hidden": args.dim_hidden,
              "measuring_ms_median": statistics.median(r["measuring_ms"] for r in ok) if ok else None}
    print(f"chosen: {dict(chosen)}; measuring took {report['measuring_ms_median']} ms (median)")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if len(chosen) == 1 and "failed" not in chosen else 1


if __name__ == "__main__":
    raise SystemExit(main())
