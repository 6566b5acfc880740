"""Small text files (status, chain.json, progress.json) replaced whole: a reader sees the old
text or the new, never half of one, and a failed write leaves no temporary behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`.
    Raises: OSError (the disk full, the folder gone); the temporary file is removed first."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
