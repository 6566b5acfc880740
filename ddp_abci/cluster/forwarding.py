"""The submitting shell's variables that reach every rank of every job. PBS and Grid Engine start
a job with a login environment, and mpirun hands ranks on other nodes only what it is told, so a
variable reaches the ranks only if it is named: the job scripts' own (ALWAYS), HF_* and WANDB_*
(DEFAULT), and what FORWARD_ENV names ("HF_HOME MY_* TOKENIZERS_PARALLELISM": names or shell
patterns).

Values whose names look like secrets (SECRET_WORDS: HF_TOKEN, WANDB_API_KEY, ...) never go into
.submit/, a log or a command line: submit.sh writes them into a file of their own, readable by
the user alone (mode 0600, in a 0700 folder under the home directory, which the nodes share),
and the job reads it; mpirun gets their names (`-x HF_TOKEN`), and takes each value from its
own environment, not from its command line. The file goes when the chain ends.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# What the job scripts forward whatever FORWARD_ENV says: where Python and its libraries are,
# and the settings of NCCL, torch and the thread count.
ALWAYS = ("PATH", "LD_LIBRARY_PATH", "NCCL_*", "TORCH_*", "OMP_NUM_THREADS", "PYTHONNOUSERSITE")
DEFAULT = ("HF_*", "WANDB_*")
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
# Read from the submitting shell into the settings file: the login shell's own PATH and
# LD_LIBRARY_PATH are not the node's (the job's modules and image set those).
NOT_CARRIED = ("PATH", "LD_LIBRARY_PATH")


def patterns(forward_env: str | None) -> list[str]:
    """The names and patterns whose variables reach the ranks: ALWAYS, DEFAULT and FORWARD_ENV's."""
    return [*ALWAYS, *DEFAULT, *(forward_env or "").split()]


def looks_secret(name: str) -> bool:
    """Whether a variable's name says it holds a secret (a token, a key, a password)."""
    return any(word in name.upper() for word in SECRET_WORDS)


def chosen(environ: Mapping[str, str], wanted: Sequence[str]) -> list[str]:
    """The names in `environ` that one of `wanted` names or matches, sorted."""
    return sorted(name for name in environ if any(fnmatch.fnmatchcase(name, pattern) for pattern in wanted))


def carried(environ: Mapping[str, str], forward_env: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(the plain variables, the secret ones) the submitting shell gives the jobs."""
    names = [name for name in chosen(environ, patterns(forward_env)) if name not in NOT_CARRIED]
    plain = {name: environ[name] for name in names if not looks_secret(name)}
    secret = {name: environ[name] for name in names if looks_secret(name)}
    return plain, secret


def secrets_folder(environ: Mapping[str, str]) -> Path:
    """Where the secrets files go: DDP_ABCI_SECRETS_DIR, else ~/.ddp_abci/secrets."""
    given = environ.get("DDP_ABCI_SECRETS_DIR")
    return Path(given) if given else Path(environ.get("HOME") or Path.home()) / ".ddp_abci" / "secrets"


def write_secrets(values: Mapping[str, str], folder: Path, name: str) -> Path:
    """FOLDER/NAME.env, `export NAME=VALUE` lines, created readable by its owner alone (0600, in a
    0700 folder) before a byte is written. Raises: OSError, ValueError for a folder others can enter."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o077:
        raise ValueError(f"{folder} can be entered by other users (mode {folder.stat().st_mode & 0o777:o}): "
                         f"chmod 700 {folder}, or set DDP_ABCI_SECRETS_DIR to a folder only you can enter")
    target = folder / f"{name}.env"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"export {key}={shlex.quote(value)}\n" for key, value in values.items()))
    return target


def secret_in_mpi_args(mpi_args: str) -> str | None:
    """The first secret-looking NAME that MPI_ARGS gives a value on the command line (-x NAME=VALUE)."""
    words = shlex.split(mpi_args or "")
    for i in range(len(words) - 1):
        name = words[i + 1].split("=", 1)[0]
        if words[i] == "-x" and "=" in words[i + 1] and looks_secret(name):
            return name
    return None


def mpirun_flags(environ: Mapping[str, str], forward_env: str | None, also: Iterable[str] = ()) -> list[str]:
    """`-x NAME` for each variable the ranks get from the job's environment (values stay out of
    the command line: mpirun reads them from its own environment)."""
    names = chosen(environ, patterns(forward_env))
    names += [name for name in also if name in environ and name not in names]
    return [flag for name in names for flag in ("-x", name)]


def shell_assignments(values: Mapping[str, str]) -> str:
    """`NAME=VALUE` lines a shell sources back to the same values."""
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in values.items() if re.fullmatch(r"\w+", key))
