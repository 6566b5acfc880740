"""The job's secret, and a signature on every value the project writes to rank 0's rendezvous
store, so that no one outside the job steers it.

torch's TCPStore authenticates nothing: any process that reaches its port can read and write
any key (PyTorch's SECURITY.md: use it on trusted networks only), and on a shared node or fabric
other users can reach it. The project's own control keys (heartbeats, the verdict's claim, the
hang report's request, each rank's place, the ranks leaving, the --comm auto probes) therefore
carry an HMAC-SHA256 of the job, the key, a counter and the value, under a secret of 32 random
bytes rank 0 draws at start, as Horovod signs its control messages. A value that fails the
check is not acted on: it is counted, and said once a key in the log (never a traceback, never a
stop). A value whose counter is below one already read under its key is a replay, refused too.

The secret travels over MPI (a broadcast) under mpirun, else in a file only the job's user can
read (secret_file: 0600, in a 0700 folder under the home the nodes share); it is never in a
command line, an environment variable, a log, a checkpoint or the store. What this does not
protect (PyTorch's own rendezvous keys, a user who floods or deletes keys, the gradients on the
wire): docs/security.md.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

SECRET_BYTES = 32


def draw() -> bytes:
    """32 random bytes from the kernel: the job's secret, drawn on rank 0."""
    return os.urandom(SECRET_BYTES)


class Signer:
    """Signs and checks one job's store values. `job` names the job (its rendezvous address and
    port): a value signed for another job does not check out here. `who`: the reader, as the
    log names it ("rank 3")."""

    def __init__(self, secret: bytes, job: str, who: str = "this rank") -> None:
        self._secret, self.job, self.who = secret, job, who
        self.last: dict[str, int] = {}      # the highest counter read under each key
        self.rejected: dict[str, int] = {}  # values refused, each key's count
        self._lock = threading.Lock()

    def _mac(self, key: str, counter: int, value: str) -> str:
        message = json.dumps([self.job, key, counter, value]).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sign(self, key: str, value: Any, counter: int) -> str:
        """The string to store under `key`: the value (plain data), its counter and its signature."""
        text = json.dumps(value)
        return json.dumps({"c": counter, "v": text, "m": self._mac(key, counter, text)})

    def verify(self, key: str, raw: bytes | str | None, replay: bool = True) -> Any:
        """The value under `key` when it checks out, else None (counted, said once a key). With
        `replay`, a counter below the highest read under this key is refused too (the same one,
        read again, is the same value)."""
        try:
            stored = json.loads(raw.decode() if isinstance(raw, bytes) else raw or "")
            counter, text, mac = int(stored["c"]), str(stored["v"]), str(stored["m"])
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return self._refuse(key, "not a signed value")
        if not hmac.compare_digest(mac, self._mac(key, counter, text)):
            return self._refuse(key, "its signature does not check out")
        with self._lock:
            latest = self.last.get(key, -1)
            if not (replay and counter < latest):
                self.last[key] = max(counter, latest)
        if replay and counter < latest:
            return self._refuse(key, f"an older value replayed (counter {counter} after {latest})")
        return json.loads(text)

    def _refuse(self, key: str, why: str) -> None:
        with self._lock:
            count = self.rejected[key] = self.rejected.get(key, 0) + 1
        if count == 1:
            print(f"warning: {self.who} refused a value written to rank 0's store under {key} ({why}): not this job's; "
                  "refusals are counted and said again at the end", file=sys.stderr, flush=True)
        return None

    def summary(self) -> str:
        """One line of the values refused, for the end of the run ("" when none were)."""
        if not self.rejected:
            return ""
        keys = ", ".join(f"{key} {count}" for key, count in sorted(self.rejected.items()))
        return f"warning: {self.who} refused {sum(self.rejected.values())} value(s) in rank 0's store that were not " \
               f"this job's: {keys}"


# -- the secret without MPI -----------------------------------------------------------------------

def secret_file(addr: str, port: int, environ: Mapping[str, str] | None = None) -> Path:
    """Where rank 0 leaves the secret for ranks started without MPI: DDP_ABCI_SECRETS_DIR, else
    ~/.ddp_abci/secrets (the home the nodes share), one file a rendezvous address and port."""
    env = os.environ if environ is None else environ
    folder = Path(env["DDP_ABCI_SECRETS_DIR"]) if env.get("DDP_ABCI_SECRETS_DIR") else \
        Path(env.get("HOME") or Path.home()) / ".ddp_abci" / "secrets"
    return folder / f"job-{addr.replace(':', '_')}-{port}.key"


def leave(secret: bytes, path: Path) -> None:
    """The secret in `path`, readable by its owner alone (0600 in a 0700 folder) before a byte of
    it is written, renamed into place whole."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.parent.stat().st_mode & 0o077:
        raise PermissionError(f"{path.parent} can be entered by other users: chmod 700 it, or set "
                              "DDP_ABCI_SECRETS_DIR to a folder only you can enter")
    part = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    os.replace(part, path)


def job_secret(launch: Any, timeout_s: float) -> bytes:
    """The job's secret on this rank: the launch's (MPI's broadcast, or rank 0's own draw), else
    rank 0's file, fetched once its store answers (it wrote the file before it listened), one
    written since this process started. Raises: PermissionError naming the fix when it does not come."""
    if launch.secret:
        return launch.secret
    path = secret_file(launch.master_addr, launch.master_port,
                       launch.environment.environ if launch.environment is not None else None)
    secret = fetch(path, newer_than=_started() - 10, timeout_s=timeout_s)
    if secret is None:
        raise PermissionError(f"rank {launch.rank} found no secret of this job's rank 0 in {path} within "
                              f"{timeout_s:g} s: every rank must see the same home (or DDP_ABCI_SECRETS_DIR)")
    return secret


def _started() -> float:
    """This process's start, seconds since 1970 (the kernel's record in /proc), else now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        booted = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                      if line.startswith("btime"))
        return booted + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration, IndexError):
        return time.time()


def fetch(path: Path, newer_than: float, timeout_s: float) -> bytes | None:
    """The secret rank 0 left in `path`, once one written after `newer_than` (this process's own
    start less a margin: not an earlier job's) is there; None after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if path.stat().st_mtime >= newer_than:
                secret = path.read_bytes()
                if len(secret) == SECRET_BYTES:
                    return secret
        except OSError:
            pass
        time.sleep(0.1)
    return None
