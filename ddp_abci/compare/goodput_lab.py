"""The effective training time ratio measured under injected faults, and the model's prediction
for the same job beside it: `python -m ddp_abci.compare.goodput_lab [--job-s 600] [--every 60 120
300] [--out FILE]` (the mpi extra; as root, Open MPI's two permission variables set).

A job is scripts/abci/train_abci3.sh outside a scheduler (2 ranks on this host, CONTAINER=none),
training a paced step (a sleep: its speed does not depend on what else the machine runs) until a
wall-clock deadline --job-s away, in-job restarts on (the job scripts' defaults); a killer SIGKILLs
one rank every --every seconds. First a job without faults gives the steps a second; each faulty
job's ETTR is its final step's worth of that speed over its wall time. The model
(cluster/goodput.py) is given what the job measured: its start-up, its restarts' cost, its save
interval and stall, the kill rate, no queue and no margin.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..cluster import goodput, restarts

REPO = Path(__file__).resolve().parents[2]
PACED = """import sys, time, torch
from ddp_abci import fit, parse_command_line
config, launch, _ = parse_command_line(epochs=10**6, global_batch=8, lr=0.01)
g = torch.Generator().manual_seed(7)
x = torch.randn(2048, 8, generator=g)
def loss_fn(model, batch):
    time.sleep(0.05)
    return torch.nn.functional.mse_loss(model(batch[0]), batch[0][:, :2])
torch.manual_seed(0)
sys.exit(fit(torch.nn.Linear(8, 2), torch.utils.data.TensorDataset(x), loss_fn, config, launch=launch))
"""
SAVE_EVERY = 50


def job(folder: Path, seconds: float, every: float | None) -> dict:
    """One job of `seconds`, a rank SIGKILLed every `every` seconds (None: none). Its tries, its
    final step, its wall time and its save stalls."""
    (folder / "nodes").write_text("localhost\n")
    (folder / "paced.py").write_text(PACED)
    python = sys.executable
    env = dict(os.environ, NODEFILE=str(folder / "nodes"), CONTAINER="none", NPROC_PER_NODE="2", PYTHON=python,
               MPIRUN=str(Path(python).parent / "mpirun"), CKPT_DIR=str(folder / "ck"),
               TRAIN_SCRIPT=str(folder / "paced.py"), OMP_NUM_THREADS="1", OMPI_MCA_btl="self,sm,tcp")
    began = time.time()
    proc = subprocess.Popen(["bash", str(REPO / "scripts" / "abci" / "train_abci3.sh"), "--stop-at",
                             f"{began + seconds:.0f}", "--save-every-steps", str(SAVE_EVERY), "--comm", "mpi"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kills: list[float] = []
    killer = threading.Thread(target=_kill_every, args=(proc, every, kills), daemon=True) if every else None
    if killer:
        killer.start()
    out, _ = proc.communicate()
    ended = time.time()
    tries = restarts.read_jsonl(folder / "ck" / "tries.jsonl")
    stalls = [float(s) for s in re.findall(r"the loop stalled ([\d.]+) s", out)]
    return {"wall_s": round(ended - began, 1), "step": max([t.get("step_reached") or 0 for t in tries] + [0]),
            "tries": tries, "kills": len(kills), "status": proc.returncode,
            "save_stall_s": sum(stalls) / len(stalls) if stalls else 0.0}


def _kill_every(proc: subprocess.Popen, every: float, kills: list[float]) -> None:
    while proc.poll() is None:
        time.sleep(every)
        ranks = _ranks()
        if ranks and proc.poll() is None:
            os.kill(random.choice(ranks), signal.SIGKILL)
            kills.append(time.time())


def _ranks() -> list[int]:
    """The training ranks: Python processes running paced.py (not mpirun, whose line names it too)."""
    found = []
    for pid in subprocess.run(["pgrep", "-f", "paced.py"], stdout=subprocess.PIPE, text=True).stdout.split():
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if Path(argv0.decode()).name.startswith("python"):
            found.append(int(pid))
    return found


def measure(seconds: float, rates: list[float]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "clean").mkdir()
        clean = job(Path(tmp) / "clean", 120, None)
        first = clean["tries"][0]
        speed = clean["step"] / (first["ended_unix"] - first["first_step_unix"])
        rows = []
        for every in rates:
            folder = Path(tmp) / f"every-{every:g}"
            folder.mkdir()
            faulty = job(folder, seconds, every)
            summary = restarts.goodput(faulty["tries"], speed)
            measured = faulty["step"] / speed / faulty["wall_s"]
            backs = [r["back_after_s"] for r in summary["restarts"] if r["back_after_s"] is not None]
            start_s = faulty["tries"][0]["first_step_unix"] - faulty["tries"][0]["started_unix"]
            predicted = goodput.predict(1, 3600.0 / every, seconds / 3600, faulty["save_stall_s"],
                                        SAVE_EVERY / speed, start_s, sum(backs) / max(len(backs), 1), 0.0, 0.0)
            rows.append({"kill_every_s": every, "kills": faulty["kills"], "restarts": len(summary["restarts"]),
                         "step": faulty["step"], "wall_s": faulty["wall_s"], "ettr_measured": round(measured, 4),
                         "ettr_predicted": predicted["in_job"]["ettr"], "start_s": round(start_s, 1),
                         "restart_s_mean": round(sum(backs) / max(len(backs), 1), 1), "status": faulty["status"]})
            print(json.dumps(rows[-1]), flush=True)
    return {"steps_per_s_clean": round(speed, 3), "job_s": seconds, "save_every_steps": SAVE_EVERY,
            "date": time.strftime("%Y-%m-%d"), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job-s", type=float, default=600.0)
    parser.add_argument("--every", type=float, nargs="+", default=[60.0, 120.0, 300.0])
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    report = measure(args.job_s, args.every)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
