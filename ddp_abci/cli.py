"""Command-line pieces that both command lines share (ddp_abci.train and ddp_abci.accelerate_variant)."""
from __future__ import annotations

import argparse
import sys

from .errors import RunError
from .launch import launched_rank


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (its default prints the whole usage first)."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def report(error: RunError) -> int:
    """Print a run's failure as one line, once: by rank 0 when every rank hit the same one,
    else by the rank it happened on. Returns its exit status (2 for bad input)."""
    if launched_rank() == 0 or not error.same_on_every_rank:
        print(f"error: {error}", file=sys.stderr, flush=True)
    return error.exit_status
