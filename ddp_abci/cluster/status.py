"""Where a chain of jobs stands, from the files its jobs write as they run; on a login node too
(no torch, Python 3.9 and newer with the checkout on PYTHONPATH):

    python -m ddp_abci.status CKPT_DIR            the chain, its jobs' states, the run's step and speed,
                                                  the time left at that speed, the last checkpoint's age,
                                                  slow hosts, the last exit status and what it means
    python -m ddp_abci.status CKPT_DIR --json     the same as one JSON object (KEYS), for scripts

What it reads, all in CKPT_DIR: chain.json (submit.sh: the jobs it submitted, the site, the
walltime, the node-hours), progress.json (the running job's rank 0, at each progress line and
epoch: step, speed, the run's length), last.pt's time, status (how the last job ended),
slow_hosts.json; and the scheduler's own view of the chain's jobs (qstat, squeue or sacct),
where its command answers. Exit status: 0, or 2 when CKPT_DIR holds none of these.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .. import run_folder
from ..exits import EXIT_USAGE
from . import restarts
from .chain import explain
from .schedulers import SITES

KEYS = ("ckpt_dir", "site", "jobs", "step", "total_steps", "samples_per_s", "run_left_s", "progress_age_s",
        "running_job", "last_checkpoint_age_s", "slow_hosts", "last_exit", "finished", "node_hours",
        "hosts_left_out", "goodput", "loss", "eval", "best_eval", "tokens_per_s", "mfu")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def job_states(site: str, ids: Sequence[str]) -> dict[str, str]:
    """Each job's state as the site's scheduler says it (queued, held, running, finished, or unknown)."""
    if not ids:
        return {}
    return SITES[site].scheduler.job_states(ids) if site in SITES else {job: "unknown" for job in ids}


def chain_status(ckpt_dir: str, now: float | None = None, states: dict[str, str] | None = None) -> dict[str, Any]:
    """The chain's state as one dict of KEYS (values None where nothing tells them). `states`:
    the jobs' states when known (asked of the scheduler otherwise)."""
    folder, now = Path(ckpt_dir), time.time() if now is None else now
    chain, progress = _json(folder / run_folder.CHAIN), _json(folder / run_folder.PROGRESS)
    tries = restarts.read_jsonl(folder / run_folder.TRIES)
    record = run_folder.read_status(folder)
    ids = [str(job) for job in chain.get("jobs", [])]
    states = job_states(chain.get("site", ""), ids) if states is None else states
    step, total, rate = progress.get("step"), progress.get("total_steps"), progress.get("steps_per_s")
    checkpoint = folder / run_folder.CHECKPOINT
    slow = _json(folder / run_folder.SLOW_HOSTS).get("hosts", [])
    status = int(record["status"]) if record.get("status", "").lstrip("-").isdigit() else None
    return {
        "ckpt_dir": str(folder), "site": chain.get("site"),
        "jobs": [{"id": job, "state": states.get(job, "unknown")} for job in ids],
        "step": step, "total_steps": total, "samples_per_s": progress.get("samples_per_s"),
        "run_left_s": (total - step) / rate if total and rate and step is not None else None,
        "progress_age_s": now - progress["unix"] if "unix" in progress else None,
        "running_job": progress.get("job"),
        "last_checkpoint_age_s": now - checkpoint.stat().st_mtime if checkpoint.exists() else None,
        "slow_hosts": slow,
        "last_exit": None if status is None else {"status": status, "line": record.get("line", ""),
                                                  "meaning": _meaning(status, str(folder))},
        "finished": record.get("finished") == "1", "node_hours": chain.get("node_hours"),
        "hosts_left_out": restarts.bad_hosts(str(folder)),
        "goodput": restarts.goodput(tries, progress.get("steps_per_s")) if tries else None,
        "loss": progress.get("loss"), "eval": progress.get("eval"), "best_eval": progress.get("best_eval"),
        "tokens_per_s": progress.get("tokens_per_s"), "mfu": progress.get("mfu"),
    }


def _meaning(status: int, ckpt_dir: str) -> str:
    """What the status means for the next step, as the job's log says it (jobs.explain)."""
    if status == 0:
        return "done"
    return explain(status, "-", ckpt_dir).split(": ", 1)[-1]


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(max(seconds, 0))
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days} d {clock}" if days else clock


def lines(state: dict[str, Any]) -> list[str]:
    """The state as the lines a person reads."""
    out = [f"chain in {state['ckpt_dir']}" + (f" ({state['site']}, {state['node_hours']} node-hours asked for)"
                                              if state["site"] else "")]
    for job in state["jobs"]:
        out.append(f"  job {job['id']}: {job['state']}")
    if state["finished"]:
        out.append("the run is finished")
    elif state["step"] is not None:
        total = f" of {state['total_steps']:,}" if state["total_steps"] else ""
        rate = f", {state['samples_per_s']:,.0f} samples/s" if state["samples_per_s"] else ""
        out.append(f"step {state['step']:,}{total}{rate} (as of {_duration(state['progress_age_s'])} ago, job "
                   f"{state['running_job'] or '?'}); the whole run needs {_duration(state['run_left_s'])} more at "
                   "this speed")
    out += _figure_lines(state)
    if state["last_checkpoint_age_s"] is not None:
        out.append(f"last checkpoint written {_duration(state['last_checkpoint_age_s'])} ago")
    if state["slow_hosts"]:
        out.append(f"slow hosts: {', '.join(state['slow_hosts'])}")
    for left in state["hosts_left_out"]:
        out.append(f"host {left['host']} left out by job {left['job']}: {left['why']}")
    out += _goodput_lines(state["goodput"])
    if state["last_exit"]:
        end = state["last_exit"]
        out.append(f"last job ended with {end['status']} ({end['line']}): {end['meaning']}")
    return out


def _figure_lines(state: dict[str, Any]) -> list[str]:
    """The training loss, the held-out figures (the last and the best) and the tokens a second."""
    out = []
    if state["loss"] is not None:
        out.append(f"training loss {state['loss']:.4f} (the last progress line's)")
    for key, what in (("eval", "last evaluation"), ("best_eval", "best evaluation")):
        entry = state[key]
        if entry:
            figures = ", ".join(f"{name} {value:.4f}" for name, value in entry["values"].items())
            out.append(f"{what}: {figures} at step {entry['step']:,}")
    if state["tokens_per_s"]:
        mfu = f", MFU {100 * state['mfu']:.1f}%" if state["mfu"] is not None else ""
        out.append(f"{state['tokens_per_s']:,.0f} tokens/s{mfu}")
    return out


def _goodput_lines(goodput: dict | None) -> list[str]:
    """The in-job restarts, what each cost, and the share of the allocation spent training."""
    if not goodput:
        return []
    out = [f"in-job restarts: {len(goodput['restarts'])}"] if goodput["restarts"] else []
    for each in goodput["restarts"]:
        back = f"training again {each['back_after_s']:.0f} s later" if each["back_after_s"] is not None else \
            "not training again in that job"
        out.append(f"  job {each['job']}, try {each['try']}: ended with {each['status']} at step {each['step']:,} "
                   f"({each['line'][:120]}); {back}, {each['steps_redone']} steps redone")
    if goodput["ettr"] is not None:
        out.append(f"effective training time ratio {goodput['ettr']:.2f}: {_duration(goodput['useful_s'])} of "
                   f"training that counts in {_duration(goodput['allocation_s'])} of allocation")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_abci.status", description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt_dir")
    parser.add_argument("--json", action="store_true", help="one JSON object (its keys: ddp_abci.status.KEYS)")
    args = parser.parse_args(argv)
    folder = Path(args.ckpt_dir)
    names = (run_folder.CHAIN, run_folder.PROGRESS, run_folder.STATUS, run_folder.CHECKPOINT)
    if not any((folder / name).exists() for name in names):
        print(f"error: {folder} holds no chain's files ({', '.join(names)}): give the CKPT_DIR the jobs were submitted "
              "with", file=sys.stderr)
        return EXIT_USAGE
    state = chain_status(args.ckpt_dir)
    print(json.dumps(state, indent=1) if args.json else "\n".join(lines(state)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
