"""Accelerate variant: the seed's training code with HuggingFace Accelerate, for comparison.

    mpirun -n 2 python -m ddp_abci.accelerate_variant --epochs 1

Same model, data, loss and optimizer as the raw trainer, written the way the seed document
does it: Accelerator(mixed_precision=..., split_batches=True), prepare(model, loader,
optimizer), accelerator.backward(loss). Two facts of Accelerate 1.x are dealt with here:

* Accelerator(split_batches=True) is accepted and silently ignored; only
  DataLoaderConfiguration(split_batches=True) splits each batch over the ranks. The seed's
  code as written therefore trains with a global batch of bs x world. Default here: the
  seed's intent (split through DataLoaderConfiguration); --as-written: the seed's code.
* Under mpirun on a CPU-only machine Accelerate finds no distributed setup unless
  ACCELERATE_USE_CPU (or cpu=True) is set, and every rank trains alone. This variant passes
  cpu=True on the CPU and refuses to run when Accelerate sees fewer ranks than mpirun started.

accelerate is imported only when this module runs: the package does not depend on it.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

from ..autoencoder_job import AutoencoderJob
from ..cli import OneLineParser, add_options, report
from ..config import TrainConfig
from ..environments import launched_world_size
from ..errors import UsageError
from .side_clock import SideClock, peak_rss_mib, write


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ddp_abci.accelerate_variant",
                      description="The seed's Accelerate training loop, for comparison with ddp_abci.train.")
    # The raw trainer's own flags (one home each: config.py, autoencoder_job.py); --bs is the global
    # batch, the per-rank batch x world with --as-written. fp32 by default, as the seed runs on the CPU.
    add_options(p, TrainConfig, only=SHARED_FLAGS, defaults={"amp": "no"})
    add_options(p, AutoencoderJob, only=("num_items", "dim_in", "dim_hidden"))
    p.add_argument("--as-written", action="store_true",
                   help="Accelerator(split_batches=True) exactly as the seed wrote it (ignored by Accelerate 1.x)")
    p.add_argument("--comm-hook", choices=COMM_HOOKS, default="no",
                   help="DistributedDataParallelKwargs(comm_hook=...): torch's compression hook (default no)")
    p.add_argument("--comm-state-option", type=json.loads, default={}, metavar="JSON",
                   help="its comm_state_option: PowerSGDState's keywords, e.g. "
                        "'{\"matrix_approximation_rank\": 1, \"start_powerSGD_iter\": 2}'")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="InitProcessGroupKwargs(timeout=...): how long a collective waits before it fails "
                        "(default Accelerate's: 1,800 s on gloo, 600 s on NCCL)")
    return p


# DDPCommunicationHookType's values, as --comm-hook takes them.
COMM_HOOKS = ("no", "fp16", "bf16", "power_sgd", "batched_power_sgd")


# The flags every peer of the raw trainer takes (the benchmark passes them to each side).
SHARED_FLAGS = ("epochs", "global_batch", "lr", "amp", "seed", "workers", "max_steps", "summary_json", "save_model")


def make_accelerator(amp: str, as_written: bool, seed: int = 0, comm_hook: str = "no",
                     comm_state_option: dict | None = None, timeout_s: float | None = None):
    """The seed's Accelerator(...), with the two Accelerate 1.x facts made explicit, and the
    DDP communication hook and the collectives' timeout asked for as Accelerate's users ask."""
    import datetime

    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, InitProcessGroupKwargs

    launched = launched_world_size()
    if launched > 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        # Accelerate initialises with env://; it would stop with a traceback, or take port 29500.
        raise UsageError("Accelerate needs MASTER_ADDR and MASTER_PORT from the launcher: mpirun -x "
                         "MASTER_ADDR=<rank 0's host> -x MASTER_PORT=<free port>, as the seed's job script does")
    # cpu=True is what makes Accelerate read Open MPI's variables on a CPU-only machine.
    cpu = not torch.cuda.is_available()
    handlers = [DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType(comm_hook),
                                              comm_state_option=comm_state_option or {})]
    if timeout_s is not None:
        handlers.append(InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=timeout_s)))
    if as_written:
        accelerator = Accelerator(mixed_precision=amp, split_batches=True, cpu=cpu, kwargs_handlers=handlers)
    else:
        # use_seedable_sampler: the shuffle is a randperm seeded with data_seed + epoch, as
        # DistributedSampler's is, so the raw trainer sees the same global batches (issue 13).
        accelerator = Accelerator(mixed_precision=amp, cpu=cpu, kwargs_handlers=handlers,
                                  dataloader_config=DataLoaderConfiguration(split_batches=True,
                                                                            use_seedable_sampler=True, data_seed=seed))
    if accelerator.num_processes != launched:
        raise UsageError(
            f"the launcher started {launched} ranks but Accelerate sees {accelerator.num_processes}: each rank "
            "would train alone; start each rank through python -m ddp_abci.compare.accelerate_env (it sets RANK, "
            "WORLD_SIZE, LOCAL_RANK from Open MPI's)")
    return accelerator


def main(argv: list[str] | None = None) -> int:
    process_started = time.time()  # the benchmark's start-up phases, as the raw trainer records them
    args = build_parser().parse_args(argv)
    try:
        return run(args, process_started)
    except UsageError as e:
        return report(e)


def run(args: argparse.Namespace, process_started: float | None = None) -> int:
    import accelerate  # noqa: F401  here, so that the start-up's imports phase holds it
    import torch
    import torch.distributed.nn.functional  # noqa: F401  before the group: see parallel/process_group.py
    from torch.utils.data import DataLoader

    from ..autoencoder import LinspaceDataset, build_model, rmse_loss

    clock = SideClock(process_started or time.time())
    accelerator = make_accelerator(args.amp, args.as_written, args.seed, args.comm_hook,
                                   args.comm_state_option, args.timeout)  # opens the process group
    clock.mark("group")
    world = accelerator.num_processes
    split = accelerator.split_batches  # what Accelerate will really do, not what was asked
    if split and args.global_batch % world:
        raise UsageError(f"global batch {args.global_batch} does not divide by world size {world}; "
                         f"use a multiple of {world}")
    global_batch = args.global_batch if split else args.global_batch * world
    reading = ("seed as written: Accelerator(split_batches=True) ignored" if args.as_written
               else "seed intent: DataLoaderConfiguration(split_batches=True)")
    accelerator.print(f"accelerate variant: world size {world}, device {accelerator.device}, precision {args.amp}, "
                      f"{reading} -> split_batches={split}, global batch {global_batch}")

    model = build_model(args.seed, args.dim_in, args.dim_hidden)
    dataset = LinspaceDataset(args.dim_in, num_items=args.num_items)
    loader = DataLoader(dataset, batch_size=args.global_batch, shuffle=True, num_workers=args.workers,
                        pin_memory=torch.cuda.is_available(), persistent_workers=args.workers > 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.0, 0.99))
    model, loader, optimizer = accelerator.prepare(model, loader, optimizer)
    clock.mark("ddp")

    steps, loss_mean = 0, float("nan")
    for epoch in range(args.epochs):
        loss_epoch, batches = torch.zeros((), device=accelerator.device), 0
        for x in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = rmse_loss(x, model(x))
            accelerator.backward(loss)
            optimizer.step()
            loss_epoch += loss.detach()
            steps, batches = steps + 1, batches + 1
            clock.step_done(x.shape[0] * world)
            if args.max_steps and steps >= args.max_steps:
                break
        # The seed prints rank 0's own loss; the mean over ranks is what the raw trainer logs.
        loss_mean = accelerator.reduce(loss_epoch / max(batches, 1), reduction="mean").item()
        accelerator.print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_mean:.4f} (mean over ranks), "
                          f"global step {steps}")
        if args.max_steps and steps >= args.max_steps:
            break
    peak = torch.tensor([peak_rss_mib()], device=accelerator.device)
    peaks = accelerator.gather(peak).tolist()
    if accelerator.is_main_process:
        import accelerate

        write(args.summary_json, clock.summary("accelerate", world, global_batch, args.amp, steps, loss_mean, peaks,
                                               split_batches=split, device=str(accelerator.device),
                                               comm_hook=args.comm_hook,
                                               torch=torch.__version__, accelerate=accelerate.__version__))
    if args.save_model:
        accelerator.save(accelerator.unwrap_model(model).state_dict(), args.save_model)  # main process only
    # Free what holds the process group (DDP, and Accelerate's references to it) before the
    # group is destroyed: gloo joins its threads only when the last reference goes, and one
    # alive at interpreter shutdown can abort the exit (see process_group.close_process_group).
    accelerator.free_memory()
    del model, optimizer, loader
    gc.collect()
    accelerator.end_training()  # destroys the process group before exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
