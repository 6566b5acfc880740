"""What saving costs, and what a hard failure loses: `python -m ddp_abci.compare.checkpoint_bench` (root).

On a slow file system (slowdisk.py: ext4 on a loop device, writes throttled to --mb-per-s for
the job's processes), 2 ranks train the seed's autoencoder at --dim x --dim (4000: a 384 MB
checkpoint, the weights and Adam's two moments) for about --minutes each run:

    stall       no saves; saves every --every minutes written before training goes on
                (--no-async-save); the same in the background (the default): the loop's stall
                per save, each write's time, and samples/s against no saves
    lost work   saves every 0.25, 0.5 and 1 minute in the background; one rank killed
                (SIGKILL) at a random moment; the run resumed: the steps between the last
                progress before the kill and the resume's step, as seconds of training

JSON: --out (keys stall, lost_work, config; --parts runs one of the two). The figures are in
docs/reliability.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .slowdisk import SlowDisk


def trainer(args: argparse.Namespace, ckpt: Path | None, *flags: str) -> list[str]:
    mpirun = [args.mpirun, "-n", "2", "--oversubscribe", "--mca", "btl", "self,sm,tcp"]
    saves = ["--ckpt-dir", str(ckpt)] if ckpt else []
    return [*mpirun, sys.executable, "-m", "ddp_abci.train", "--dim-in", str(args.dim), "--dim-hidden", str(args.dim),
            "--epochs", "100000", "--log-every", "1", *saves, *flags]


def run(disk: SlowDisk, cmd: list[str], timeout: float) -> str:
    proc = subprocess.run(disk.throttled(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stdout[-2000:]}")
    return proc.stdout


def stall(args: argparse.Namespace, disk: SlowDisk, steps: int, work: Path) -> dict:
    out = {}
    for name, flags in (("no saves", ()), ("synchronous", ("--no-async-save",)), ("background", ())):
        ckpt = None if name == "no saves" else work / name.replace(" ", "-")
        summary = work / f"{name}.json"
        every = () if ckpt is None else ("--save-every-minutes", str(args.every))
        log = run(disk, trainer(args, ckpt, "--max-steps", str(steps), "--summary-json", str(summary), *every,
                                *flags), args.timeout)
        figures = json.loads(summary.read_text())
        writes = [float(w) for w in re.findall(r"written in ([\d.]+) s", log)]
        saved = figures["checkpoints_saved"]
        out[name] = {"samples_per_s": figures["samples_per_s"], "checkpoints_saved": saved,
                     "stall_per_save_s": figures["checkpoint_stall_s"] / saved if saved else 0.0,
                     "write_s": statistics.median(writes) if writes else None}
        print(f"stall, {name}: {out[name]}", flush=True)
    base = out["no saves"]["samples_per_s"]
    for name in ("synchronous", "background"):
        out[name]["throughput_vs_no_saves"] = out[name]["samples_per_s"] / base
    out["stall_synchronous_over_background"] = (out["synchronous"]["stall_per_save_s"]
                                                / max(out["background"]["stall_per_save_s"], 1e-9))
    return out


def lost_work(args: argparse.Namespace, disk: SlowDisk, steps_per_s: float, work: Path) -> list[dict]:
    rows = []
    for minutes in args.intervals:
        ckpt = work / f"lost-{minutes}"
        interval_s = 60 * minutes
        proc = subprocess.Popen(disk.throttled(trainer(args, ckpt, "--save-every-minutes", str(minutes),
                                                       "--timeout", "20")),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        began, last_step, last_seen = time.monotonic(), 0, time.monotonic()
        kill_at = began + random.uniform(2 * interval_s, 3 * interval_s)
        while time.monotonic() < kill_at:
            line = proc.stdout.readline()
            match = re.search(r"\[(\d+)/\d+\]", line) if line.startswith("  epoch") else None
            if match:  # the progress line: epoch and batch (steps: one epoch's batches add up)
                last_step, last_seen = int(match[1]) + _done_epochs(line) * _epoch_steps(line), time.monotonic()
        ranks = subprocess.run(["pgrep", "-f", "ddp_abci.train"], stdout=subprocess.PIPE, text=True).stdout.split()
        os.kill(int(random.choice(ranks)), signal.SIGKILL)
        at_kill = last_step + int((time.monotonic() - last_seen) * steps_per_s)
        proc.communicate(timeout=120)
        resumed = run(disk, trainer(args, ckpt, "--resume", "--max-steps", "1"), args.timeout)
        step = int(re.search(r"resume: \S+ at epoch \d+, batch \d+, step (\d+)", resumed)[1])
        rows.append({"interval_s": interval_s, "killed_at_step": at_kill, "resumed_at_step": step,
                     "lost_steps": at_kill - step, "lost_s": (at_kill - step) / steps_per_s})
        print(f"lost work, a save every {interval_s:g} s: {rows[-1]}", flush=True)
    return rows


def _done_epochs(line: str) -> int:
    return int(re.search(r"epoch (\d+)/", line)[1]) - 1


def _epoch_steps(line: str) -> int:
    return int(re.search(r"\[\d+/(\d+)\]", line)[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.compare.checkpoint_bench", description=__doc__.split("\n")[0])
    p.add_argument("--dim", type=int, default=4000, help="the autoencoder's widths (4000: a 384 MB checkpoint)")
    p.add_argument("--mb-per-s", type=float, default=50, help="the slow disk's write rate")
    p.add_argument("--minutes", type=float, default=3, help="each stall run's length")
    p.add_argument("--every", type=float, default=1, help="minutes between saves in the stall runs")
    p.add_argument("--intervals", default="0.25,0.5,1", help="the lost-work runs' save intervals, minutes")
    p.add_argument("--mpirun", default=str(Path(sys.executable).with_name("mpirun")))
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--parts", default="stall,lost_work", help="which parts to run: stall, lost_work or both")
    p.add_argument("--out", default="bench-results/checkpoints.json")
    args = p.parse_args(argv)
    args.intervals = [float(x) for x in args.intervals.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp, SlowDisk(Path(tmp), args.mb_per_s) as disk:
        work = disk.mount
        probe = work / "probe.json"
        run(disk, trainer(args, None, "--max-steps", "30", "--summary-json", str(probe)), args.timeout)
        steps_per_s = json.loads(probe.read_text())["samples_per_s"] / 50
        steps = int(steps_per_s * 60 * args.minutes)
        report = {"config": {**vars(args), "steps_per_s": steps_per_s, "stall_run_steps": steps}}
        if "stall" in args.parts:
            report["stall"] = stall(args, disk, steps, work)
        if "lost_work" in args.parts:
            report["lost_work"] = lost_work(args, disk, steps_per_s, work)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
