"""What --zero saves and costs, measured: `python -m ddp_abci.compare.zero_memory`.

For each model (the seed's autoencoder at 4000 x 4000, 32 M parameters, and the language-model
example at a comparable size) and each world size of --ranks, the same run trains with and
without --zero in fresh mpiruns on this host. Each run's --summary-json gives every rank's
optimizer state in bytes, its peak memory (CUDA's allocator on GPUs, the resident set on the CPU)
and samples/s; the table shows them with the state's share of the whole (the aim: within 5% of
1/world) and the bytes a step moves per rank: DDP's all-reduce sends and receives about
2 (W-1)/W x 4 bytes a parameter (a ring), and ZeRO-1's broadcast of the updated parameters
receives (W-1)/W x 4 more. --json keeps the figures.

    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (as root) \\
    python -m ddp_abci.compare.zero_memory --ranks 2,4 --json docs/zero-memory.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = {
    "autoencoder 4000x4000": ["-m", "ddp_abci.train", "--dim-in", "4000", "--dim-hidden", "4000",
                              "--num-items", "100000", "--bs", "64"],
    "GPT 4 layers x 640": ["-m", "ddp_abci.examples.language_model", "--synthetic", "--n-layer", "4", "--n-head", "8",
                           "--n-embd", "640", "--vocab", "16384", "--block-size", "128", "--bs", "16",
                           "--eval-windows", "8"],
}


def one_run(args: argparse.Namespace, model: str, ranks: int, zero: bool, folder: Path) -> dict:
    """One mpirun of `model` at `ranks`, with or without --zero; its summary's figures.
    Raises: SystemExit with the run's last lines where it fails."""
    summary = folder / f"{model.split()[0]}-{ranks}-{zero}.json"
    program = MODELS[model] + (["--data", str(folder / "corpus")] if "language_model" in MODELS[model][1] else [])
    cmd = [args.mpirun, "-n", str(ranks), *shlex.split(args.mpi_args), sys.executable, *program,
           "--max-steps", str(args.steps), "--epochs", "1000", "--summary-json", str(summary),
           *(["--zero"] if zero else [])]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"error: {model} at {ranks} ranks{' with --zero' if zero else ''} exited "
                         f"{proc.returncode}:\n{proc.stdout[-2000:]}")
    figures = json.loads(summary.read_text())
    return {"state_bytes": figures["optimizer_state_bytes_per_rank"], "peak_mib": figures["peak_mem_mib_per_rank"],
            "samples_per_s": figures["samples_per_s"], "global_batch": figures["global_batch"]}


def parameters_of(model: str) -> int:
    """The model's parameter count, built here as the run builds it."""
    if model.startswith("autoencoder"):
        return 2 * 4000 * 4000 + 4000 + 4000
    from ddp_abci.examples.language_model import GPT  # noqa: PLC0415  (torch only where it is measured)

    return sum(p.numel() for p in GPT(16384, 128, 4, 8, 640).parameters())


def measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            for ranks in args.ranks:
                plain, zero = (one_run(args, model, ranks, z, Path(tmp)) for z in (False, True))
                whole, params = plain["state_bytes"][0], parameters_of(model)
                rows.append({
                    "model": model, "ranks": ranks, "parameters": params, "state_bytes_whole": whole,
                    "state_bytes_a_parameter": whole / params,
                    "state_bytes_per_rank_zero": zero["state_bytes"],
                    "share_of_whole_vs_1_over_world": [round(b * ranks / whole, 4) for b in zero["state_bytes"]],
                    "peak_mib_plain": plain["peak_mib"], "peak_mib_zero": zero["peak_mib"],
                    "step_s_plain": plain["global_batch"] / plain["samples_per_s"],
                    "step_s_zero": zero["global_batch"] / zero["samples_per_s"],
                    "bytes_moved_per_rank_plain": 2 * (ranks - 1) / ranks * 4 * params,
                    "bytes_moved_per_rank_zero": 3 * (ranks - 1) / ranks * 4 * params})
                print(line(rows[-1]), flush=True)
    return rows


def line(row: dict) -> str:
    """One markdown row: model, ranks, state per rank (whole; with --zero, its share), peak memory,
    step time, bytes a step moves per rank."""
    zero_mb = max(row["state_bytes_per_rank_zero"]) / 1e6
    share = max(abs(s - 1) for s in row["share_of_whole_vs_1_over_world"])
    return (f"| {row['model']} ({row['parameters'] / 1e6:.1f} M) | {row['ranks']} "
            f"| {row['state_bytes_whole'] / 1e6:.0f} | {zero_mb:.0f} (within {100 * share:.1f}% of 1/{row['ranks']}) "
            f"| {statistics.mean(row['peak_mib_plain']):.0f} | {statistics.mean(row['peak_mib_zero']):.0f} "
            f"| {row['step_s_plain']:.3f} | {row['step_s_zero']:.3f} "
            f"| {row['bytes_moved_per_rank_plain'] / 1e6:.0f} | {row['bytes_moved_per_rank_zero'] / 1e6:.0f} |")


HEADER = ("| model | ranks | Adam's state a rank, MB | with --zero, MB | peak memory a rank, MiB | with --zero | "
          "step, s | with --zero | MB a step moves a rank | with --zero |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_abci.compare.zero_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=lambda t: [int(x) for x in t.split(",")], default=[2, 4])
    parser.add_argument("--steps", type=int, default=12, help="steps a run trains (the first is not timed)")
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--mpi-args", default="--oversubscribe --bind-to none",
                        help="more mpirun arguments (default: more ranks than cores, unbound)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    print(HEADER, flush=True)
    rows = measure(args)
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
