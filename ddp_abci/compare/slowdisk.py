"""A slow shared file system on one machine, for the checkpoint benchmark and its tests: an
ext4 file system on a loop device, mounted on a folder, whose writes a cgroup v1 blkio
controller throttles (blkio.throttle.write_bps_device) for the processes put in its group,
as a busy parallel file system gives one client 50 MB/s. Needs root; down() removes it all.

    with SlowDisk(workdir, megabytes_per_s=50) as disk:
        subprocess.run(disk.throttled(["mpirun", ...]))   # the command and its children are in the group
"""
from __future__ import annotations

import os
import secrets
import subprocess
import time
from pathlib import Path
from typing import Sequence

from .lab_base import Lab

BLKIO = Path("/sys/fs/cgroup/blkio")


def _sh(*cmd: str) -> str:
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stdout.strip()}")
    return done.stdout.strip()


class SlowDisk(Lab):
    def __init__(self, workdir: Path, megabytes_per_s: float = 50, size_mb: int = 3000) -> None:
        if os.geteuid() != 0 or not (BLKIO / "cgroup.procs").exists():
            raise PermissionError("a slow disk needs root and cgroup v1's blkio controller")
        self.workdir, self.rate, self.size_mb = Path(workdir), megabytes_per_s, size_mb
        self.image = self.workdir / "slowdisk.img"
        self.mount = self.workdir / "slowdisk"
        self.group = BLKIO / f"ddp_abci_slowdisk_{secrets.token_hex(3)}"
        self.device: str | None = None

    def up(self) -> None:
        _sh("truncate", "-s", f"{self.size_mb}M", str(self.image))
        self.device = _sh("losetup", "-f", "--show", str(self.image))
        _sh("mkfs.ext4", "-q", self.device)
        self.mount.mkdir(exist_ok=True)
        _sh("mount", self.device, str(self.mount))
        numbers = _sh("lsblk", "-no", "MAJ:MIN", self.device).split()[0]
        self.group.mkdir()
        (self.group / "blkio.throttle.write_bps_device").write_text(f"{numbers} {int(self.rate * 1e6)}")

    def throttled(self, cmd: Sequence[str]) -> list[str]:
        """`cmd` started inside the throttled group (its children too: they inherit it)."""
        return ["sh", "-c", f'echo $$ > {self.group}/cgroup.procs && exec "$@"', "sh", *cmd]

    def down(self) -> None:
        if self.group.exists():
            for pid in (self.group / "cgroup.procs").read_text().split():
                try:
                    (BLKIO / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # it ended meanwhile
            for _ in range(50):
                try:
                    self.group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        if self.mount.exists():
            subprocess.run(["umount", "-l", str(self.mount)], capture_output=True)
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True)
        self.image.unlink(missing_ok=True)
