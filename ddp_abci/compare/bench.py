"""Benchmark: the raw trainer against its peers on the same job: the Accelerate variant, the
Fabric variant and the textbook script (--sides), and where raw's lead comes from (--decompose).

    OMPI_ALLOW_RUN_AS_ROOT=1 ... python -m ddp_abci.bench --world-size 2 --bs 50 --epochs 10 --rounds 3

Each round starts every side in a fresh mpirun, sides alternating (A B A B ...) so that a
machine that warms up or gets busy hurts both alike. Reported per side: median and spread
of training throughput (samples/s over the timed loop, which excludes the first step),
time to first step (from mpirun's start), whole-process wall time, peak memory per rank
and the final loss; then the ratios raw / Accelerate, and each side's throughput as a
fraction of the compute floor (bench_probes.floor). A side that fails is reported as failed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from ..parallel.rendezvous import free_port
from . import decomposition


def mpirun_prefix(args: argparse.Namespace, ranks: int) -> list[str]:
    # --btl: Open MPI's byte transfer layers. With the pip wheel's default list, MPI_Init spends
    # about a second initialising libfabric (the ofi BTL) on a machine without it
    # (docs/benchmark.md, start-up); scripts/run_local.sh and the tests name them too.
    btl = ["--mca", "btl", args.btl] if args.btl else []
    return [args.mpirun, "-n", str(ranks), "--oversubscribe", *btl, *args.mpirun_args]


SIDES = ("raw", "accelerate", "raw1", "fabric", "textbook")
PEERS = {"accelerate": "ddp_abci.compare.accelerate_variant", "fabric": "ddp_abci.compare.fabric_variant",
         "textbook": "ddp_abci.compare.textbook"}


def side_command(side: str, args: argparse.Namespace, summary: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """One fresh mpirun per side and round. 'raw1' is the raw trainer on one rank; `extra`
    are flags of the side's own (the textbook script's switches, for the decomposition)."""
    mpirun = mpirun_prefix(args, 1 if side == "raw1" else args.world_size)
    common = ["--bs", str(args.bs), "--amp", args.amp, "--workers", str(args.workers),
              "--epochs", str(args.epochs), "--max-steps", str(args.max_steps), "--num-items", str(args.num_items),
              "--dim-in", str(args.dim_in), "--dim-hidden", str(args.dim_hidden), "--summary-json", str(summary)]
    if side.startswith("raw"):
        return [*mpirun, sys.executable, "-m", "ddp_abci.train", *common, *args.raw_args, *extra]
    common[common.index("--amp") + 1] = "no" if args.amp == "auto" else args.amp  # the peers compare fp32 here
    if side == "fabric":  # Fabric's MPIEnvironment reads mpi4py and picks its own rendezvous
        return [*mpirun, sys.executable, "-m", PEERS[side], *common, *extra]
    # Accelerate and the textbook read the rendezvous from the environment (env://), as the
    # seed's job script gives it, and torchrun's variables mapped from Open MPI's.
    # A port free here (a fresh network namespace, the link lab's hosts, has every port free).
    mpirun += ["-x", f"MASTER_ADDR={args.master_addr}", "-x", f"MASTER_PORT={free_port('127.0.0.1')}"]
    wrapper = [sys.executable, "-m", "ddp_abci.compare.accelerate_env"]
    return [*mpirun, *wrapper, sys.executable, "-m", PEERS[side], *common, *extra]


def run_side(side: str, args: argparse.Namespace, workdir: Path, round_: int, extra: tuple[str, ...] = ()) -> dict:
    summary = workdir / f"{side}{'-'.join(('',) + extra)}-{round_}.json"
    cmd = side_command(side, args, summary, extra)
    if getattr(args, "wrap", None):  # across the network lab's hosts: started as its first host
        cmd = args.wrap(cmd)
    started = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    wall = time.time() - started
    if proc.returncode != 0 or not summary.exists():
        tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
        return {"side": side, "failed": True, "rc": proc.returncode, "tail": tail}
    result = json.loads(summary.read_text())
    result.update(side=side, wall_s=wall, first_step_s=result["first_step_unix"] - started)
    if result.get("startup_unix"):
        result["startup"] = startup_phases(result["startup_unix"], started, result["first_step_unix"])
    return result


PHASES = (("to the interpreter", "process_unix"), ("imports", "imports_unix"), ("MPI_Init", "launch_unix"),
          ("rendezvous and group", "group_unix"), ("preflight, model, DDP", "ddp_unix"),
          ("first step", "first_step_unix"))


def startup_phases(marks: dict, started: float, first_step: float) -> dict:
    """Seconds of each start-up phase, from mpirun's start to the end of the first step:
    each phase ends at its mark and begins at the one before it that the side recorded (the
    Accelerate variant has no MPI_Init: its group phase begins at its imports' end)."""
    marks = dict(marks, first_step_unix=first_step)
    out, begin = {}, started
    for name, end in PHASES:
        if marks.get(end) is not None:
            out[name], begin = marks[end] - begin, marks[end]
    return out


def probe(cmd: list[str], timeout: float) -> dict:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else {"failed": True, "tail": proc.stdout[-500:]}


def summarise(runs: list[dict]) -> dict:
    ok = [r for r in runs if not r.get("failed")]
    if not ok:
        return {"failed": True, "rounds_failed": len(runs), "tail": runs[-1].get("tail", "")}
    rates = [r["samples_per_s"] for r in ok]
    return {
        "rounds": len(ok), "rounds_failed": len(runs) - len(ok),
        "samples_per_s": statistics.median(rates), "samples_per_s_min": min(rates), "samples_per_s_max": max(rates),
        "first_step_s": statistics.median(r["first_step_s"] for r in ok),
        "startup": {name: statistics.median(r["startup"][name] for r in ok if name in r.get("startup", {}))
                    for name in ok[0].get("startup", {})},
        "wall_s": statistics.median(r["wall_s"] for r in ok),
        "peak_mem_mib_per_rank": max(max(r["peak_mem_mib_per_rank"]) for r in ok),
        "final_loss": ok[-1]["final_loss"], "world_size": ok[-1]["world_size"],
        "global_batch": ok[-1]["global_batch"], "steps": ok[-1]["steps"],
    }


def environment(mpirun: str) -> dict:
    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    mpi = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            "cpu": _cpu_model(), "python": platform.python_version(), "torch": version("torch"),
            "accelerate": version("accelerate"), "lightning": version("lightning"),
            "mpi": mpi.stdout.splitlines()[0] if mpi.stdout else None,
            "mpi4py": version("mpi4py"), "date": time.strftime("%Y-%m-%d")}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def format_table(report: dict) -> str:
    rows = [("side", "ranks", "samples/s (min-max)", "of floor", "1st step s", "wall s", "peak MiB/rank", "loss")]
    floor = report["probes"].get("floor", {}).get("samples_per_s")
    for side, s in report["sides"].items():
        if s.get("failed"):
            rows.append((side, "-", f"FAILED ({s['rounds_failed']} rounds)", "", "", "", "", ""))
            continue
        rate = f"{s['samples_per_s']:,.0f} ({s['samples_per_s_min']:,.0f}-{s['samples_per_s_max']:,.0f})"
        rows.append((side, str(s["world_size"]), rate, f"{s['samples_per_s'] / floor:.0%}" if floor else "",
                     f"{s['first_step_s']:.2f}", f"{s['wall_s']:.2f}", f"{s['peak_mem_mib_per_rank']:.0f}",
                     f"{s['final_loss']:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    headline = report["ratios"].get("throughput raw / DDP floor reading the data")
    if headline is not None:  # the loop's own cost, first (issue 69): against the floor that reads the same data
        bare = report["ratios"].get("throughput raw / DDP floor")
        lines.append(f"the loop against DDP's floor reading the same data: {headline:.2f}"
                     + (f" (against the floor without data: {bare:.2f})" if bare is not None else ""))
    for name, value in report["ratios"].items():
        lines.append(f"{name}: {value:.2f}" if value is not None else f"{name}: n/a (a side failed)")
    for side, s in report["sides"].items():
        if s.get("startup"):
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in s["startup"].items())
            lines.append(f"start-up of {side} (medians): {phases}")
    probes = report["probes"]
    if "floor" in probes and not probes["floor"].get("failed"):
        lines.append(f"compute floor: {probes['floor']['samples_per_s']:,.0f} samples/s "
                     f"({probes['floor']['step_ms']:.2f} ms/step, 1 process, {probes['floor']['threads']} threads)")
    world = report["config"]["world_size"]  # bench always records it (args.world_size)
    alone, together = probes.get("floor_per_rank", {}), probes.get("floor_concurrent", {})
    if "step_ms" in alone and "step_ms" in together:
        lines.append(f"per-rank floor (batch {report['config']['bs'] // world}): {alone['step_ms']:.2f} ms/step alone, "
                     f"{together['step_ms']:.2f} ms/step with all {world} ranks computing at once "
                     f"(= {world * together['samples_per_s']:,.0f} samples/s for {world} ranks, no communication)")
    comm = probes.get("floor_ddp", {}).get("comm", "?")
    for key, label in (("floor_lockstep", "lockstep floor (the same, gradients all-reduced through MPI every step; "
                                          "the median of the rounds, each measured beside the sides)"),
                       ("floor_ddp", f"DDP floor (the same loop through DDP as the trainer wraps the model, gradients "
                                     f"via {comm}; the median of the rounds)"),
                       ("floor_ddp_data", "DDP floor reading the data (the same, each batch read from the seed's set "
                                          "as the trainer reads it)")):
        probe = probes.get(key, {})
        if "step_ms" in probe:
            lines.append(f"{label}: {probe['step_ms']:.2f} ms/step = {world * probe['samples_per_s']:,.0f} "
                         f"samples/s for {world} ranks")
    if "allreduce" in probes and not probes["allreduce"].get("failed"):
        a = probes["allreduce"]
        lines.append("all-reduce of the gradients alone: " + ", ".join(
            f"{k[:-3]} {v:.3f} ms" for k, v in a.items() if k.endswith("_ms")))
    return "\n".join(lines)


def ratios(sides: dict, probes: dict | None = None) -> dict:
    def ratio(a: str, b: str, key: str) -> float | None:
        sa, sb = sides.get(a, {}), sides.get(b, {})
        if not sa or not sb or sa.get("failed") or sb.get("failed"):
            return None
        return sa[key] / sb[key]

    out = {}
    for peer in PEERS:
        if peer == "accelerate" or peer in sides:  # Accelerate's keys always, as before the other peers
            out[f"throughput raw / {peer}"] = ratio("raw", peer, "samples_per_s")
            out[f"wall time raw / {peer}"] = ratio("raw", peer, "wall_s")
    if "raw1" in sides:
        ranks = sides.get("raw", {}).get("world_size", "")
        out[f"throughput raw {ranks} ranks / 1 rank"] = ratio("raw", "raw1", "samples_per_s")
    lockstep = (probes or {}).get("floor_lockstep", {}).get("samples_per_s")
    ddp = (probes or {}).get("floor_ddp", {}).get("samples_per_s")
    raw = sides.get("raw", {})
    if lockstep and "samples_per_s" in raw:  # the probe's rate is per rank
        out["throughput raw / lockstep floor"] = raw["samples_per_s"] / (raw["world_size"] * lockstep)
    if ddp and "samples_per_s" in raw:
        out["throughput raw / DDP floor"] = raw["samples_per_s"] / (raw["world_size"] * ddp)
    if ddp and lockstep:  # what keeping DDP costs, before the loader and the trainer
        out["DDP floor / lockstep floor"] = ddp / lockstep
    data = (probes or {}).get("floor_ddp_data", {}).get("samples_per_s")
    if data and "samples_per_s" in raw:  # the trainer's own cost, the data's aside
        out["throughput raw / DDP floor reading the data"] = raw["samples_per_s"] / (raw["world_size"] * data)
    if data and ddp:  # what reading the data costs the floor
        out["DDP floor reading the data / DDP floor"] = data / ddp
    return out


def save_chart(report: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sides = {k: v for k, v in report["sides"].items() if not v.get("failed")}
    fig, ax = plt.subplots(figsize=(6, 3))
    names = list(sides)
    ax.bar(names, [s["samples_per_s"] for s in sides.values()],
           yerr=[[s["samples_per_s"] - s["samples_per_s_min"] for s in sides.values()],
                 [s["samples_per_s_max"] - s["samples_per_s"] for s in sides.values()]], capsize=4)
    floor = report["probes"].get("floor", {}).get("samples_per_s")
    if floor:
        ax.axhline(floor, linestyle="--", color="gray", label="compute floor")
        ax.legend()
    ax.set_ylabel("samples/s (median, min-max)")
    ax.set_title(f"global batch {report['config']['bs']}, {report['config']['amp']}, {report['environment']['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--bs", type=int, default=50, help="global batch, the same on both sides")
    p.add_argument("--amp", default="auto")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=0)
    p.add_argument("--num-items", type=int, default=10000)
    p.add_argument("--dim-in", type=int, default=1000, help="the seed's autoencoder's width (every side)")
    p.add_argument("--dim-hidden", type=int, default=100, help="its hidden width (every side)")
    p.add_argument("--sizes", default="", metavar="IxH,...",
                   help="also run the sides at these model sizes, DIM_IN x DIM_HIDDEN (JSON key sizes, chart "
                        "*-sizes.png), e.g. 1000x100,2000x1000,4000x4000")
    p.add_argument("--link", default="", metavar="RATE[,DELAY]",
                   help="also run the sides across two network-namespace hosts whose link tc shapes, e.g. "
                        "1gbit,0.5ms (root; JSON key link)")
    p.add_argument("--compression", default="", metavar="KIND,...",
                   help="with --link: also run raw with --grad-compression KIND and Accelerate with the same "
                        "comm_hook, for each of powersgd, fp16, bf16 (JSON key link)")
    p.add_argument("--peer-compression", default=None, metavar="KIND,...",
                   help="of --compression, the kinds Accelerate is given too (default: all of them; Accelerate's "
                        "powersgd aborts or deadlocks on gloo for a model over 1 MiB: docs/accelerate.md)")
    p.add_argument("--powersgd-rank", type=int, default=1, help="PowerSGD's rank on both sides (default 1)")
    p.add_argument("--powersgd-warmup-steps", type=int, default=2,
                   help="steps all-reduced uncompressed before PowerSGD, on both sides (default 2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sides", default="raw,accelerate,raw1",
                   help="comma list of raw, accelerate, raw1 (raw on 1 rank), fabric (Lightning Fabric), textbook "
                        "(the DDP tutorial's script)")
    p.add_argument("--decompose", action="store_true",
                   help="also run the textbook script with the raw trainer's choices applied one after another "
                        "(JSON key decomposition)")
    p.add_argument("--no-probes", action="store_true", help="skip the compute floor and all-reduce probes")
    p.add_argument("--raw-args", default="", help="extra arguments for the raw trainer, e.g. '--comm gloo'")
    p.add_argument("--mpirun", default=shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun")
    p.add_argument("--mpirun-args", default="", help="extra mpirun arguments, e.g. '--hostfile nodes'")
    p.add_argument("--btl", default="self,sm,tcp",
                   help="Open MPI's transports for both sides (default: one host's; '' leaves Open MPI's choice)")
    p.add_argument("--master-addr", default="127.0.0.1", help="for the Accelerate side (env://)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--out", default="bench-results/bench.json")
    p.add_argument("--png", default=None, help="chart path (default: next to --out; needs matplotlib)")
    p.add_argument("--sweep", default="", metavar="B1,B2,...",
                   help="also run raw on 1 rank, raw and Accelerate on --world-size ranks at each global batch, "
                        "with the floors (JSON key sweep, chart *-sweep.png)")
    return p


def floor_command(args: argparse.Namespace, batch: int, *, ranks: int = 0, threads: int | None = None,
                  lockstep: bool = False, ddp: bool = False, data: bool = False) -> list[str]:
    """bench_probes floor with `batch` per process, alone (ranks 0) or on `ranks` ranks under
    mpirun, over as many steps as a side trains (at most 2000): a floor's rate and a side's
    are then the same statistic (the whole loop's) over about as long a run."""
    steps = min(2000, args.max_steps or args.epochs * -(-args.num_items // args.bs))
    cmd = [sys.executable, "-m", "ddp_abci.compare.probes", "floor", "--amp", args.amp, "--bs", str(batch),
           "--steps", str(max(5, steps)), *(["--threads", str(threads)] if threads else []),
           *(["--lockstep"] if lockstep else []), *(["--ddp"] if ddp else []), *(["--data"] if data else [])]
    return [*mpirun_prefix(args, ranks), *cmd] if ranks else cmd


def lockstep_floor(args: argparse.Namespace, *, ddp: bool = False, data: bool = False) -> dict:
    """W ranks in lockstep (compute and one MPI all-reduce a step) at global batch args.bs;
    with ddp, the same loop through DDP as the trainer wraps the model; with data too, each
    batch read from the seed's set as the trainer reads it."""
    return probe(floor_command(args, args.bs // args.world_size, ranks=args.world_size,
                               threads=max(1, (os.cpu_count() or 1) // args.world_size), lockstep=not ddp, ddp=ddp,
                               data=data), args.timeout)


def sweep_floors(args: argparse.Namespace) -> dict:
    """One round's floors for the sweep at args.bs, in samples/s for all ranks together."""
    one, lockstep = probe(floor_command(args, args.bs), args.timeout), lockstep_floor(args)
    return {"one_process": one.get("samples_per_s"),
            "lockstep": args.world_size * lockstep["samples_per_s"] if "samples_per_s" in lockstep else None}


def median_floor(rounds: list[dict]) -> dict:
    """The floor measured in every round, beside the sides, summarised as the sides are:
    the median of each figure over the rounds, each round's rate kept under
    `rounds_samples_per_s`."""
    ok = [r for r in rounds if "samples_per_s" in r]
    if not ok:
        return rounds[-1] if rounds else {"failed": True}
    medians = {k: statistics.median(r[k] for r in ok) for k, v in ok[0].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return dict(ok[0], **medians, rounds=len(ok), rounds_samples_per_s=[r.get("samples_per_s") for r in rounds])


def run_probes(args: argparse.Namespace, lockstep_rounds: list[dict], ddp_rounds: list[dict],
               ddp_data_rounds: list[dict]) -> dict:
    """What this machine allows (bench_probes): the compute floor of one process, of one rank
    alone and of all ranks computing at once, the same in lockstep with the gradient
    all-reduce, the same through DDP, and through DDP reading the data (these three measured
    in every round, beside the sides), and the all-reduce alone."""
    threads = max(1, (os.cpu_count() or 1) // args.world_size)
    per_rank = args.bs // args.world_size
    probes = {"floor": probe(floor_command(args, args.bs), args.timeout),
              "floor_per_rank": probe(floor_command(args, per_rank, threads=threads), args.timeout),
              # The same per-rank floor with every rank computing at once (no communication):
              # what W ranks can reach together when they share the machine's memory and caches.
              "floor_concurrent": probe(floor_command(args, per_rank, ranks=args.world_size, threads=threads),
                                        args.timeout)}
    if args.world_size > 1:
        probes["floor_lockstep"] = median_floor(lockstep_rounds)
        probes["floor_ddp"] = median_floor(ddp_rounds)
        probes["floor_ddp_data"] = median_floor(ddp_data_rounds)
    probes["allreduce"] = probe([*mpirun_prefix(args, args.world_size), sys.executable, "-m",
                                 "ddp_abci.compare.probes", "allreduce"], args.timeout)
    return probes


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.raw_args, args.mpirun_args = args.raw_args.split(), args.mpirun_args.split()
    args.compression = [k for k in args.compression.split(",") if k]
    args.peer_compression = args.compression if args.peer_compression is None else \
        [k for k in args.peer_compression.split(",") if k in args.compression]
    wrong = [k for k in args.compression if k not in ("powersgd", "fp16", "bf16")]
    if wrong or (args.compression and not args.link):
        print(f"error: --compression {','.join(args.compression)}: give powersgd, fp16 or bf16, with --link",
              file=sys.stderr)
        return 2
    sides = [s for s in args.sides.split(",") if s]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        print(f"error: unknown side {unknown[0]!r} in --sides; use {', '.join(SIDES)}", file=sys.stderr)
        return 2
    if args.decompose and "raw" not in sides:
        sides.append("raw")  # the decomposition's last entry is the raw trainer, measured as a side
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    lockstep_rounds: list[dict] = []
    ddp_rounds: list[dict] = []
    ddp_data_rounds: list[dict] = []
    decomposition_rounds: list[list[dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else reversed(sides):  # A B, B A: neither always goes first
                runs[side].append(run_side(side, args, Path(tmp), round_))
                r = runs[side][-1]
                print(f"round {round_ + 1}/{args.rounds} {side}: " + (f"FAILED rc={r['rc']}" if r.get("failed")
                      else f"{r['samples_per_s']:,.0f} samples/s, wall {r['wall_s']:.1f}s"), flush=True)
            if args.decompose:  # the textbook with raw's choices, in the same rounds as the sides
                plain = runs["textbook"][-1] if "textbook" in runs else None
                decomposition_rounds.append(decomposition.run_round(args, run_side, Path(tmp), round_, plain))
            if not args.no_probes and args.world_size > 1:  # the floor in the same minutes as the sides
                lockstep_rounds.append(lockstep_floor(args))
                ddp_rounds.append(lockstep_floor(args, ddp=True))
                ddp_data_rounds.append(lockstep_floor(args, ddp=True, data=True))
    probes = {} if args.no_probes else run_probes(args, lockstep_rounds, ddp_rounds, ddp_data_rounds)
    summary = {side: summarise(r) for side, r in runs.items()}
    report = {"config": {k: v for k, v in vars(args).items() if k not in ("out", "png")},
              "environment": environment(args.mpirun), "sides": summary, "ratios": ratios(summary, probes),
              "probes": probes, "runs": runs}
    if args.decompose:
        report["decomposition"] = decomposition.summarise(decomposition_rounds, summary.get("raw", {}))
    if args.sweep:
        from .sweep import crossover, run_sweep, save_sweep_chart

        report["sweep"] = run_sweep(args, sides, run_side, summarise, sweep_floors, runs)
        report["sweep_crossover_global_batch"] = crossover(report["sweep"])
        sweep_png = out.with_name(out.stem + "-sweep.png")
        if save_sweep_chart(report["sweep"], sweep_png, f"{args.world_size} ranks vs 1, {args.amp}, "
                                                        f"{report['environment']['date']}"):
            print(f"sweep chart: {sweep_png}; {args.world_size} ranks overtake 1 rank from global batch "
                  f"{report['sweep_crossover_global_batch']}")
    if args.sizes:
        from .sizes import run_sizes, save_sizes_chart

        report["sizes"] = run_sizes(args, sides, run_side, summarise, ratios)
        save_sizes_chart(report["sizes"], out.with_name(out.stem + "-sizes.png"))
    if args.link:
        from .link import run_link

        report["link"] = run_link(args, sides, run_side, summarise, ratios)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_table(report))
    if args.decompose:
        print("\n".join(decomposition.lines(report["decomposition"])))
    print(f"environment: {json.dumps(report['environment'])}")
    chart = Path(args.png) if args.png else out.with_suffix(".png")
    print(f"written: {out}" + (f", {chart}" if save_chart(report, chart) else " (no chart: matplotlib not installed)"))
    return 1 if any(s.get("failed") for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
