"""Command line: `mpirun -n 2 python -m ddp_abci.train [options]`.

It only builds the two dataclasses (the discovered Launch and the TrainConfig) and
hands them to the Trainer; every decision lives in the module named for it.

Only `signals` is imported at the top: main() installs the stop handlers before anything
else loads (argparse, dataclasses, torch), so a SIGTERM or SIGUSR1 from about 40 ms after
the interpreter starts (its own start-up) is recorded instead of killing the rank.
"""
from __future__ import annotations

import sys

from .signals import StopRequest


def build_parser():  # -> argparse.ArgumentParser
    import argparse
    import os

    from .cli import OneLineParser
    from .config import MAX_STOP_CHECK_EVERY, SPLIT_CHOICES, TrainConfig

    d = TrainConfig()
    p = OneLineParser(prog="python -m ddp_abci.train",
                       description="Train the seed's autoencoder with DistributedDataParallel.")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--bs", type=int, default=d.global_batch, help="global batch, split over the ranks")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate; on --resume this run's value wins")
    p.add_argument("--betas", type=float, nargs=2, default=d.betas, metavar=("B1", "B2"),
                   help="Adam's betas (the seed's 0 0.99); on --resume this run's values win")
    p.add_argument("--amp", default=d.amp, help="auto (fp16 on CUDA, no on the CPU), no, fp16 or bf16")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--workers", type=int, default=d.workers, help="DataLoader workers per rank")
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction, default=None,
                   help="default: on with CUDA only")
    p.add_argument("--persistent-workers", action=argparse.BooleanOptionalAction, default=d.persistent_workers)
    p.add_argument("--max-steps", type=int, default=d.max_steps,
                   help="stop after N optimizer steps in all; 0: no limit")
    p.add_argument("--ckpt-dir", default=d.ckpt_dir, help="write DIR/last.pt after every epoch and at the end")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt-dir's last.pt")
    p.add_argument("--timeout", type=float, default=d.timeout_s, dest="timeout_s",
                   help="seconds before a hung rendezvous or collective fails")
    p.add_argument("--stop-check-every", type=int, default=d.stop_check_every,
                   help=f"steps between the ranks' agreement on SIGTERM/SIGUSR1 and divergence (at most "
                        f"{MAX_STOP_CHECK_EVERY}: a stop is acted on within that many steps, and at every epoch's end)")
    p.add_argument("--stop-after", type=float, default=d.stop_after_s, dest="stop_after_s", metavar="SECONDS",
                   help="stop, save and exit 75 early enough that the save ends within SECONDS of the start "
                        "(the job scripts derive it from the scheduler's walltime); 0: never")
    p.add_argument("--max-skipped-steps", type=int, default=d.max_skipped_steps,
                   help="fp16: this many GradScaler-skipped steps in a row end the run as diverged (exit 65); 0: never")
    p.add_argument("--log-every", type=float, default=d.log_every_s, dest="log_every_s",
                   help="seconds between progress lines inside an epoch")
    p.add_argument("--summary-json", default=None, help="rank 0 writes the run's figures here")
    p.add_argument("--fused-adam", action=argparse.BooleanOptionalAction, default=d.fused_adam,
                   help="Adam's fused kernel (faster); --no-fused-adam: torch's default loop, as the seed and "
                        "Accelerate")
    p.add_argument("--save-model", default=None, help="rank 0 writes the trained model's state_dict here at the end")
    p.add_argument("--comm", default=d.comm,
                   help="gradient all-reduce: auto (NCCL on GPUs, MPI on the CPU under mpirun, else gloo), mpi, gloo")
    p.add_argument("--dim-in", type=int, default=d.dim_in)
    p.add_argument("--dim-hidden", type=int, default=d.dim_hidden)
    p.add_argument("--num-items", type=int, default=d.num_items)
    extra = p.add_argument_group("Accelerate's everyday features, in raw form (all off by default)")
    extra.add_argument("--accum", type=int, default=d.accum,
                       help="micro-batches per optimizer step (no_sync on all but the last)")
    extra.add_argument("--loss", default=d.loss, help="rmse (the seed's) or mse")
    extra.add_argument("--clip-norm", type=float, default=d.clip_norm,
                       help="clip the gradient norm (unscaled first under fp16)")
    extra.add_argument("--eval-every", type=int, default=d.eval_every,
                       help="evaluate the last 10%% of the items (then held out of training) every E epochs")
    extra.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    extra.add_argument("--schedule", default=d.schedule, help="constant or cosine, after the warm-up")
    extra.add_argument("--metrics-jsonl", default=None, help="rank 0 appends one JSON line per optimizer step")
    extra.add_argument("--tensorboard", default=None, metavar="DIR",
                       help="rank 0 writes TensorBoard events to DIR (pip install 'ddp_abci[tensorboard]')")
    extra.add_argument("--compile", action="store_true", help="torch.compile the model before DDP")
    extra.add_argument("--split", default=d.split, choices=SPLIT_CHOICES,
                       help="how each global batch is shared out: strided (DistributedSampler's every W-th "
                            "item) or contiguous (a slice each, as Accelerate's split_batches)")
    net = p.add_argument_group("rendezvous (default: MASTER_ADDR/MASTER_PORT, else chosen by rank 0)")
    net.add_argument("--master-addr", default=None, help="rank 0's address for the rendezvous")
    net.add_argument("--master-port", type=int, default=None)
    net.add_argument("--interface", default=os.environ.get("DDP_ABCI_IFNAME"),
                     help="take rank 0's address from this interface, e.g. bond0 or ib0 (env DDP_ABCI_IFNAME)")
    return p


def config_from_args(args):  # (argparse.Namespace) -> TrainConfig
    from .config import TrainConfig

    return TrainConfig(
        epochs=args.epochs, global_batch=args.bs, lr=args.lr, betas=tuple(args.betas), amp=args.amp, seed=args.seed,
        workers=args.workers, pin_memory=args.pin_memory, persistent_workers=args.persistent_workers,
        max_steps=args.max_steps, ckpt_dir=args.ckpt_dir, resume=args.resume, timeout_s=args.timeout_s,
        dim_in=args.dim_in, dim_hidden=args.dim_hidden, num_items=args.num_items,
        log_every_s=args.log_every_s, stop_check_every=args.stop_check_every, summary_json=args.summary_json,
        comm=args.comm, accum=args.accum, loss=args.loss, clip_norm=args.clip_norm, eval_every=args.eval_every,
        warmup_steps=args.warmup_steps, schedule=args.schedule, metrics_jsonl=args.metrics_jsonl, compile=args.compile,
        split=args.split, save_model=args.save_model, fused_adam=args.fused_adam,
        max_skipped_steps=args.max_skipped_steps, stop_after_s=args.stop_after_s, tensorboard=args.tensorboard,
    )


def main(argv: list[str] | None = None) -> int:
    # Handlers first: a walltime SIGTERM during start-up is kept and acted on at the first
    # agreed step instead of killing the rank mid-import.
    with StopRequest() as stop:
        from .cli import report
        from .errors import UsageError

        args = build_parser().parse_args(argv)
        try:
            config = config_from_args(args)
        except UsageError as e:
            return report(e)
        from .job import fit

        return fit(config=config, stop=stop, master_addr=args.master_addr, master_port=args.master_port,
                   interface=args.interface)


if __name__ == "__main__":
    sys.exit(main())
