"""Checkpoint files: atomic writes of DIR/last.pt (the ones before kept as DIR/prev.pt,
DIR/prev2.pt, ... with --keep; their names: run_folder.py), validated weights_only loads.

Format (other tools read these keys): model, optimizer, scaler, scheduler, epoch, step,
world_size, config, plus for exact resume: batch_in_epoch, global_batch, train_items,
rng (rank 0's generators), rng_per_rank, and format = FORMAT; with fit(state=...) one key
`state/NAME` per object (and `state/NAME_per_rank` where the ranks' values differ); with a
stream, `data_per_rank`; with --grad-compression powersgd, `grad_compression_per_rank`.
Checkpoints of earlier versions of this format (with a sampler_epoch key, without
train_items or rng_per_rank) still load. What writes them, when: manager.py.
"""
from __future__ import annotations

import errno
import io
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import run_folder
from ..errors import SaveFailed, UsageError

FORMAT = "ddp_abci/1"
FILENAME, PREVIOUS = run_folder.CHECKPOINT, run_folder.PREVIOUS
# torch.save writes to `.<name>.<random>.tmp` beside the file (save_atomic); a rank killed
# mid-write leaves one behind, which the next run's preflight removes.
STALE_PATTERNS = run_folder.STALE_PATTERNS
REQUIRED = ("format", "model", "optimizer", "scaler", "epoch", "step", "world_size", "config",
            "batch_in_epoch", "global_batch", "rng")
# Every key every checkpoint holds: REQUIRED, which a load insists on, and those older versions
# of the format lacked; and the keys some hold: a stream's position, fit(state=...)'s objects
# (NAME their names). docs/reliability.md documents each.
KEYS = (*REQUIRED, "train_items", "rng_per_rank", "scheduler", "gradients")
OPTIONAL_KEYS = ("data", "data_per_rank", "state/NAME", "state/NAME_per_rank", "grad_compression",
                 "grad_compression_per_rank")


class CheckpointError(UsageError):
    """A checkpoint that cannot be used; it is left untouched."""


def checkpoint_path(ckpt_dir: str | os.PathLike) -> Path:
    return run_folder.path(ckpt_dir, FILENAME)


def check_writable(ckpt_dir: str | os.PathLike) -> None:
    """Prove now, before training, that DIR can take a checkpoint: create it and a probe file."""
    try:
        Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=ckpt_dir, prefix=".probe-"):
            pass
    except OSError as e:
        raise CheckpointError(f"--ckpt-dir {ckpt_dir} cannot be written ({e.strerror}); "
                              "choose a writable folder") from None


def save_atomic(state: dict[str, Any] | memoryview, path: str | os.PathLike) -> None:
    """Write to a temporary file in the same folder, flush it to disk, then rename it over
    `path`. A crash at any point leaves either the old file or the new one, whole:
    rename within one file system is atomic, and fsync orders the data before it.
    `state` is a dict for torch.save, or the bytes torch.save already made (serialize())."""
    path = Path(path)
    if path.exists() and not path.is_file():  # a rename over /dev/null would replace the device
        raise OSError(errno.EINVAL, "not a regular file, refusing to replace it", str(path))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(state, memoryview):
                f.write(state)  # releases the GIL for the whole write: see manager.py
            else:
                torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def rotate(path: Path, keep: int) -> None:
    """Before a new last.pt is written: each kept checkpoint moves one name older (prev.pt
    to prev2.pt, ...; the oldest beyond `keep` is replaced), then last.pt becomes prev.pt.
    Every step is one atomic rename, so at every instant each file is whole."""
    names = run_folder.previous_names(keep)
    for older, newer in zip(reversed(names[1:]), reversed(names[:-1]), strict=False):
        if path.with_name(newer).exists():
            os.replace(path.with_name(newer), path.with_name(older))
    if names:
        keep_previous(path)


def keep_previous(path: Path) -> None:
    """Make DIR/prev.pt the current DIR/last.pt, atomically, before a new last.pt is written.

    A hard link costs no space and no copy; renaming it over prev.pt is atomic, so at every
    instant both files are whole (one of them maybe the older). Where the file system has
    no hard links, a copy does the same, slower."""
    if not path.exists():
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{PREVIOUS}.", suffix=".tmp")
    os.close(fd)
    try:
        os.unlink(tmp)
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, path.with_name(PREVIOUS))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(ckpt_dir: Path) -> list[Path]:
    """Delete the temporary files a killed write left in DIR (only this project's own names)."""
    stale = [p for pattern in STALE_PATTERNS for p in Path(ckpt_dir).glob(pattern) if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def serialize(state: dict[str, Any]) -> memoryview:
    """torch.save into memory (no second copy: a view of the buffer), for save_atomic."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer()


def estimated_bytes(model: torch.nn.Module) -> int:
    """What a checkpoint of `model` will take: its tensors, plus two per-parameter buffers
    (Adam's moments: the most that torch's standard optimizers keep), plus a little for
    the rest (schedule, scaler, RNG, configuration). The optimizer's state does not exist
    before the first step, so it cannot be measured yet, only estimated."""
    tensors = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return tensors + 2 * params + 256 * 1024


def disk_space_error(ckpt_dir: Path, need: int) -> str | None:
    """Why DIR cannot hold the checkpoints (the new temporary file beside the kept one), or None."""
    free = shutil.disk_usage(ckpt_dir).free
    if free >= 2 * need:
        return None
    return (f"--ckpt-dir {ckpt_dir} has {_mb(free)} free, a checkpoint of this run takes about {_mb(need)} "
            f"and saving needs twice that ({_mb(2 * need)}: the new file beside the kept one); "
            "free space there or choose a --ckpt-dir with more room")


def save_weights(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """The trained weights alone (the model's state_dict), as accelerator.save does; a failure
    is one line (SaveFailed: the run's checkpoint is already saved, exit 74)."""
    try:
        save_atomic(model.state_dict(), path)
    except Exception as e:
        raise SaveFailed(save_failure(e, Path(path))) from None


def save_failure(error: BaseException, path: Path) -> str:
    """One line for a checkpoint that could not be written: the innermost OS error's reason
    (torch.save wraps ENOSPC in a RuntimeError about its zip writer)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    reason = f"{cause.strerror} (errno {cause.errno})" if isinstance(cause, OSError) and cause.strerror else (
        str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__)
    kept = "the previous last.pt is intact" if path.exists() else "no earlier checkpoint existed"
    return (f"saving {path} failed: {reason}; {kept} and no temporary file was left; "
            f"free space or fix the folder {path.parent}, then rerun with --resume")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load with weights_only=True (a crafted file cannot run code) and check it is ours."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, foreign pickle, ... : all mean "not usable"
        reason = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        if reason.startswith("Weights only load failed"):
            reason = "not a file that torch.save wrote with tensors only"
        raise CheckpointError(
            f"{path} is truncated or not a ddp_abci checkpoint ({reason}); "
            "it was left as it is: move it away or use another --ckpt-dir"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or any(k not in state for k in REQUIRED):
        raise CheckpointError(
            f"{path} is not a {FORMAT} checkpoint; it was left as it is: move it away or use another --ckpt-dir"
        )
    return state


def check_model_shape(state: dict[str, Any], model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Refuse a checkpoint whose tensors do not fit the model, naming the first mismatch."""
    ours = model.state_dict()
    theirs = state["model"]
    for name, tensor in ours.items():
        if name not in theirs or tuple(theirs[name].shape) != tuple(tensor.shape):
            got = tuple(theirs[name].shape) if name in theirs else "missing"
            raise CheckpointError(
                f"{path} holds another model shape ({name}: {got}, this model {tuple(tensor.shape)}); "
                "build the same model (for the seed's: the same --dim-in/--dim-hidden) or use another --ckpt-dir"
            )
    extra = set(theirs) - set(ours)
    if extra:
        raise CheckpointError(f"{path} holds parameters this model lacks ({sorted(extra)[0]}); use another --ckpt-dir")


def rng_state() -> dict[str, Any]:
    """This process's RNG states: torch's (and CUDA's), Python's `random` and numpy's global
    generator, which user datasets and augmentations draw from. Tensors and lists only, so
    that weights_only can load them."""
    version, keys, gauss = random.getstate()
    kind, np_keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "random": [version, list(keys), gauss],
             "numpy": [kind, torch.from_numpy(np_keys.astype(np.int64)), pos, has_gauss, cached]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "random" in state:  # absent from checkpoints written before they were saved
        version, keys, gauss = state["random"]
        random.setstate((version, tuple(keys), gauss))
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
