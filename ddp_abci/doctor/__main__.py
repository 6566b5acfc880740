"""`python -m ddp_abci.doctor` under mpirun (or any launcher discover_launch knows)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddp_abci.doctor", description="Check the allocation before training.")
    p.add_argument("--json", metavar="PATH", help="write the report here (keys: ranks, network, storage, clocks, "
                                                  "problems)")
    p.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR"), help="the checkpoint folder (default: CKPT_DIR)")
    p.add_argument("--data-dir", help="a folder of training data, read from each host")
    p.add_argument("--megabytes", type=int, default=64, help="how much each host writes and reads (default 64)")
    p.add_argument("--largest-mb", type=int, default=64, help="the sweep's largest all-reduce in MiB (default 64; "
                   "the pairs' largest is 16 MiB or this): less for a quicker look across slow links")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a collective that does not complete "
                                                              "ends the check (default 60)")
    args = p.parse_args(argv)
    if args.largest_mb < 1:
        p.error(f"--largest-mb {args.largest_mb}: give 1 or more (MiB)")
    # Imported here: --help answers without loading torch.
    from ..parallel.collectives import broadcast_object  # noqa: PLC0415
    from ..parallel.launch import discover_launch  # noqa: PLC0415
    from ..parallel.process_group import distributed  # noqa: PLC0415
    from ..parallel.watchdog import Watchdog  # noqa: PLC0415
    from . import facts, network, storage, verdict  # noqa: PLC0415

    began = time.monotonic()
    launch = discover_launch(timeout_s=args.timeout)
    with distributed(launch, timeout_s=args.timeout) as device:
        watchdog = Watchdog(launch, args.timeout).start()
        try:
            with watchdog.waiting("the doctor's gathering"):
                ranks = facts.gather_facts(launch, device)
            report = {"ranks": ranks,
                      "network": network.measure_network(launch, device, [r["host"] for r in ranks], watchdog,
                                                            largest=args.largest_mb << 20)}
            with watchdog.waiting("the doctor's storage check"):
                report["storage"] = storage.check_storage(launch, args.ckpt_dir, args.data_dir, args.megabytes)
                report["clocks"] = facts.clock_offsets(launch)
            report["problems"] = verdict.problems(report)
            report["seconds"] = round(time.monotonic() - began, 1)
            if launch.is_main:
                print(verdict.table(report), flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(report, f, indent=1)
            with watchdog.waiting("the doctor's verdict"):
                status = broadcast_object(launch, 1 if report["problems"] else 0)
        finally:
            watchdog.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
