"""The command line, made from the dataclasses' fields: each field carries its flag, help and
range (options.option), so a flag lives in one place. Shared by every program here
(ddp_abci.train, the Accelerate and Fabric variants, the textbook script).

Imports nothing heavy: --help and bad flags answer before torch loads.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from dataclasses import fields
from typing import Any, Iterable, Mapping, NamedTuple, TypeVar

from .environments import launched_rank
from .errors import RunError
from .options import default_of, flag_of, number_or_word

T = TypeVar("T")


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (its default prints the whole usage first)."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def add_options(parser: argparse.ArgumentParser, cls: type, title: str | None = None, *,
                only: Iterable[str] | None = None, defaults: Mapping[str, Any] | None = None) -> None:
    """One argument per field of `cls` that has a flag (all, or those named in `only`), its
    destination the field's name. `defaults` overrides a field's default for this program."""
    target = parser.add_argument_group(title) if title else parser
    wanted = set(only) if only is not None else None
    for f in fields(cls):
        flag = flag_of(f)
        if flag is None or (wanted is not None and f.name not in wanted):
            continue
        meta, default = f.metadata, (defaults or {}).get(f.name, default_of(f))
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": meta["help"]}
        if meta.get("negatable"):
            kwargs["action"] = argparse.BooleanOptionalAction
        elif isinstance(default, bool):
            kwargs["action"] = "store_true"
        elif isinstance(default, tuple):
            kwargs.update(nargs=len(default), type=type(default[0]))
        elif meta.get("kind") or isinstance(default, (int, float)):
            kwargs["type"] = meta.get("kind") or type(default)
            if meta.get("words"):
                kwargs["type"] = number_or_word(kwargs["type"], meta["words"])
        if "action" not in kwargs:
            kwargs["metavar"] = meta.get("metavar") or flag.lstrip("-").upper().replace("-", "_")
        target.add_argument(flag, **kwargs)


def build(cls: type[T], args: argparse.Namespace) -> T:
    """The dataclass from the parsed flags (fields without a flag keep their defaults);
    its own checks raise a UsageError naming the field and its flag."""
    values = {f.name: getattr(args, f.name) for f in fields(cls) if flag_of(f) and hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return cls(**values)


def report(error: RunError) -> int:
    """Print a run's failure as one line, once: by rank 0 when every rank hit the same one,
    else by the rank it happened on. Returns its exit status (2 for bad input)."""
    if launched_rank() == 0 or not error.same_on_every_rank:
        print(f"error: {error}", file=sys.stderr, flush=True)
    return error.exit_status


class CommandLine(NamedTuple):
    config: Any          # TrainConfig
    launch: dict         # fit()'s launch=: master_addr, master_port, interface
    rest: list[str]      # the arguments that are not ddp_abci's, for your own parser


def parse_command_line(argv: list[str] | None = None, *, own: Iterable[str] = (), **defaults: Any) -> CommandLine:
    """Your script's TrainConfig from its command line, the flags `python -m ddp_abci.train`
    takes (--epochs, --bs, --ckpt-dir, --resume, --stop-after, --interface, ...), with
    `defaults` for your program; the job scripts pass a TRAIN_SCRIPT the same flags as the
    trainer, so this is how a fit() script gets its checkpoint folder, resume and deadline:

        config, launch, rest = parse_command_line(epochs=30, global_batch=64)
        sys.exit(fit(model, train_set, loss_fn, config, launch=launch))

    Check mode (`--check-args RANKS`, or DDP_ABCI_CHECK_ARGS=RANKS in the environment, as
    scripts/submit.sh runs a TRAIN_SCRIPT before queueing it): the flags and the global batch
    for RANKS ranks are checked, CHECKED printed, and the process exits 0 (fit() never trains).

    Args: argv (default sys.argv[1:]); own: the flags your script takes itself
    (own=("--shards",)): they and their values come back in `rest`, in order, for your own
    parser; defaults: TrainConfig's fields your program changes.
    Returns: CommandLine(config, launch: for fit(launch=...), rest).
    Raises: SystemExit(2) after one `error:` line for a bad value, or a flag neither the trainer
    nor `own` knows (naming the nearest known one: a mistyped --save-every-minute would
    otherwise be dropped, and the run would train without its saves); SystemExit(0) in check mode."""
    from .config import TrainConfig  # noqa: PLC0415  (this module stays light for the command line)
    from .parallel.launch import LaunchOptions  # noqa: PLC0415

    parser = OneLineParser(prog=sys.argv[0] if argv is None else "train", allow_abbrev=False)
    add_options(parser, TrainConfig, defaults=defaults)
    add_options(parser, LaunchOptions)
    parser.add_argument("--check-args", type=int, metavar="RANKS", default=checking_ranks(),
                        help="check these flags for RANKS ranks, then exit 0 without training")
    args, rest = parser.parse_known_args(argv)
    strange = unknown_flag(parser, rest, own)
    if strange:
        parser.exit(2, f"error: {strange} (a flag of your script's own: parse_command_line(own=(\"--flag\",)))\n")
    try:
        config, launch = build(TrainConfig, args), build(LaunchOptions, args)
    except RunError as e:
        raise SystemExit(report(e)) from None
    if args.check_args:
        ranks, bs = args.check_args, config.global_batch
        if bs % ranks:
            parser.exit(2, f"error: --bs {bs} does not divide by {ranks} ranks: use a multiple of {ranks}, e.g. "
                           f"--bs {max(bs // ranks, 1) * ranks}\n")
        parser.exit(0, f"{CHECKED} for {ranks} ranks: global batch {bs} ({bs // ranks} per rank)\n")
    return CommandLine(config, {f.name: getattr(launch, f.name) for f in fields(launch)}, rest)


CHECKED = "ddp_abci: the arguments check out"


def checking_ranks() -> int | None:
    """DDP_ABCI_CHECK_ARGS: the ranks to check a script's flags for (submit.sh sets it), or None."""
    value = os.environ.get("DDP_ABCI_CHECK_ARGS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def unknown_flag(parser: argparse.ArgumentParser, rest: Iterable[str], own: Iterable[str] = ()) -> str | None:
    """'unknown flag --x; did you mean --y?' for the first flag of `rest` that neither `parser` nor
    `own` knows, or None."""
    own = list(own)
    strange = [t.split("=", 1)[0] for t in rest if t.startswith("-") and not _number(t)]
    strange = [flag for flag in strange if flag not in own]
    if not strange:
        return None
    known = [a for action in parser._actions for a in action.option_strings] + own
    near = difflib.get_close_matches(strange[0], known, n=1)
    return f"unknown flag {strange[0]}" + (f"; did you mean {near[0]}?" if near else f"; see {parser.prog} --help")


def _number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True
