"""Command line: `mpirun -n 2 python -m ddp_abci.train [options]`.

It only builds the dataclasses (TrainConfig, the seed's AutoencoderJob, the LaunchOptions) from
the flags that their fields carry (cli.py) and hands them to fit(); every decision lives
in the module named for it.

Only the stop handlers are imported at the top: main() installs them before anything else
loads (argparse, dataclasses, torch), so a SIGTERM or SIGUSR1 from about 40 ms after the
interpreter starts (its own start-up) is recorded instead of killing the rank.
"""
from __future__ import annotations

import sys

from .parallel.signals import StopRequest


def build_parser():  # -> argparse.ArgumentParser
    from .autoencoder_job import AutoencoderJob
    from .cli import OneLineParser, add_options
    from .config import TrainConfig
    from .parallel.launch import LaunchOptions

    p = OneLineParser(prog="python -m ddp_abci.train",
                      description="Train the seed's autoencoder with DistributedDataParallel.")
    add_options(p, TrainConfig)
    add_options(p, AutoencoderJob, "the seed's job (its model, data and loss)")
    add_options(p, LaunchOptions, "rendezvous (default: MASTER_ADDR/MASTER_PORT, else chosen by rank 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    # Handlers first: a walltime SIGTERM during start-up is kept and acted on at the first
    # agreed step instead of killing the rank mid-import.
    with StopRequest() as stop:
        from .autoencoder_job import AutoencoderJob
        from .cli import build, report
        from .config import TrainConfig
        from .errors import UsageError
        from .fitting import fit
        from .parallel.launch import LaunchOptions

        args = build_parser().parse_args(argv)
        try:
            config, job, options = build(TrainConfig, args), build(AutoencoderJob, args), build(LaunchOptions, args)
        except UsageError as e:
            return report(e)
        return fit(config=config, seed_job=job, stop=stop, launch=options)


if __name__ == "__main__":
    status = main()
    # The run has closed all it opened (group, checkpoint writer, logs): what is left is memory.
    # CPython's last collections at exit would walk every object torch and torch._dynamo made
    # (docs/benchmark.md, start-up, says what that costs); frozen objects are skipped, and the
    # OS frees them. Atexit handlers (mpi4py's MPI_Finalize among them) still run.
    import gc

    gc.freeze()
    sys.exit(status)
