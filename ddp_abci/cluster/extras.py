"""Your packages beside the image's (datasets, tokenizers, tensorboard, wandb, ...), two ways, the
image's own stack (torch, numpy, mpi4py, their dependencies) never moved by them:

    python -m ddp_abci.cluster.extras install -r REQUIREMENTS   in the image's build (both recipes):
                                                               after the pinned stack, every package
                                                               already there a constraint
    python -m ddp_abci.cluster.extras venv DIR [PIP ARGS]       a virtual environment that sees the
                                                               image's packages, for a small addition
                                                               without a rebuild (scripts/container/
                                                               make_venv.sh runs it inside the image)

A requirement that needs another version of a package the image holds is refused, naming both:
pip's resolver, given the image's packages as constraints, finds it before anything installs.

Why a virtual environment and not ~/.local: the job scripts set PYTHONNOUSERSITE=1, because
~/.local/lib/pythonX.Y is one folder for every Python of that version the user ever ran `pip
install --user` with, on the login node or elsewhere, and it would shadow the image's packages on
every rank, unversioned and unseen in the job's log. A venv is named by the job (VENV=DIR, in its
first line), holds only what was installed into it, and was installed against the image's pins.
"""
from __future__ import annotations

import argparse
import re
import site
import subprocess
import sys
import tempfile
import venv
from importlib import metadata
from pathlib import Path
from typing import Sequence

from ..exits import EXIT_FAILED

# pip's own tools are not the image's stack: a requirement may well ask for a newer one.
NOT_PINNED = {"pip", "setuptools", "wheel"}
PTH = "ddp_abci_image.pth"  # the venv's link to the image's packages


class Conflict(Exception):
    """A requirement that would move a package of the image: one line naming both."""


def pins() -> list[str]:
    """NAME==VERSION of every package this Python sees, pip's tools aside."""
    seen: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name and name not in NOT_PINNED:
            seen.setdefault(name, dist.version)
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


def pip_install(python: str, pip_args: Sequence[str], pinned: Sequence[str]) -> None:
    """`python -m pip install -c PINS PIP_ARGS`, the pins as constraints. Raises: Conflict."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="image-pins-") as constraints:
        constraints.write("".join(f"{pin}\n" for pin in pinned))
        constraints.flush()
        done = subprocess.run([python, "-m", "pip", "install", "--no-cache-dir", "-c", constraints.name, *pip_args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise Conflict(conflict_line(done.stdout) or f"pip install {' '.join(pip_args)} failed (exit "
                                                      f"{done.returncode}, its lines above)")


def conflict_line(pip_output: str) -> str | None:
    """pip's "The conflict is caused by:" block as one line naming the package and the pin it would move."""
    block = re.search(r"The conflict is caused by:\n((?:[ \t]+\S.*\n?)+)", pip_output)
    if not block:
        return None
    lines = [line.strip() for line in block[1].splitlines() if line.strip()]
    wants = [line for line in lines if " depends on " in line]
    pinned = [line.split("(constraint) ", 1)[1] for line in lines if "(constraint)" in line]
    if not wants or not pinned:
        return "; ".join(lines)
    return (f"your requirements would move the image's pinned stack: {'; '.join(wants)}, and the image has "
            f"{', '.join(pinned)}: choose a version that takes the image's, or change the pin in the recipe and "
            "rebuild")


def install(pip_args: Sequence[str]) -> None:
    """Into this Python (the image's, at build time), constrained to what it holds. Raises: Conflict."""
    files = ("-r", "--requirement", "-c", "--constraint")
    named = [a for i, a in enumerate(pip_args) if not a.startswith("-") and (i == 0 or pip_args[i - 1] not in files)]
    if not named and not _requirements_listed(pip_args):
        print("extras: none asked for (EXTRA_REQUIREMENTS, EXTRA_PACKAGES)", flush=True)
        return
    pip_install(sys.executable, pip_args, pins())


def _requirements_listed(pip_args: Sequence[str]) -> bool:
    """Whether a -r FILE among the arguments lists anything."""
    files = [pip_args[i + 1] for i, a in enumerate(pip_args[:-1]) if a in ("-r", "--requirement")]
    return any(line.strip() and not line.lstrip().startswith("#")
               for path in files for line in Path(path).read_text().splitlines())


def make_venv(folder: Path, pip_args: Sequence[str]) -> Path:
    """A virtual environment at `folder` (made when absent) whose Python sees this Python's
    packages after its own (a .pth file naming their folders), then PIP_ARGS installed into it,
    constrained to this Python's packages. Returns its Python. Raises: Conflict.
    It gets no pip or setuptools of its own: the image's, seen through the .pth file, install into
    it, where ensurepip's older setuptools would shadow the image's (torch 2.13 asks for >= 77)."""
    python = folder / "bin" / "python"
    if not python.exists():
        venv.create(folder, with_pip=False, symlinks=True)
    own = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              stdout=subprocess.PIPE, text=True, check=True).stdout.strip())
    (own / PTH).write_text("".join(f"{path}\n" for path in site.getsitepackages()))
    if pip_args:
        pip_install(str(python), pip_args, pins())
    return python


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_abci.cluster.extras", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="into this Python, constrained to what it holds")
    made = commands.add_parser("venv", help="a virtual environment that sees this Python's packages")
    made.add_argument("dir", type=Path)
    args, pip_args = parser.parse_known_args(argv)
    try:
        if args.command == "install":
            install(pip_args)
        else:
            python = make_venv(args.dir.absolute(), pip_args)
            print(f"extras: {args.dir} holds your packages beside the image's; the job scripts run its Python with "
                  f"VENV={args.dir.absolute()} ({python})", flush=True)
    except Conflict as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
