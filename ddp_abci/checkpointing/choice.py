"""The resume decision in one place: which checkpoint a run resumes from (last.pt, or the newest
kept one that loads), whether it fits this run (resume.check_contract), and putting it back,
part by part, with one line saying what changed. Rank 0 reads the files and decides; every rank
obeys its verdict (a collective). Rotation, the other half of keeping checkpoints: checkpoint.rotate.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from .. import run_folder
from ..config import TrainConfig
from ..parallel.collectives import print_main, rank0_decides
from ..parallel.launch import Launch
from . import checkpoint as ckpt
from . import resume


def share(launch: Launch, config: TrainConfig, ckpt_file: Path | None, train_items: int | None,
          first: Callable[[], None] = lambda: None) -> tuple[dict | None, Path | None]:
    """Collective: rank 0 runs `first` (the run's other file checks), then chooses the checkpoint
    (choose); every rank obeys its verdict and loads the snapshot it chose (rank 0 has it).
    Returns (the snapshot, its file), or (None, None) for a fresh start."""
    mine: list = [None]

    def decide() -> str | None:
        first()
        if ckpt_file is None:
            return None
        snapshot, chosen = choose(config, ckpt_file, train_items)
        mine[0] = snapshot
        return str(chosen) if chosen else None

    chosen = rank0_decides(launch, decide)
    if chosen is None:
        if ckpt_file is not None and config.resume:
            print_main(launch, f"resume: no checkpoint at {ckpt_file}; starting fresh")
        return None, None
    return (mine[0] if launch.is_main else ckpt.load_checkpoint(chosen)), Path(chosen)


def choose(config: TrainConfig, ckpt_file: Path, train_items: int | None) -> tuple[dict | None, Path | None]:
    """Rank 0's part: DIR/last.pt checked against this run, or the newest kept checkpoint that
    loads when last.pt cannot be read; (None, None) for a fresh start. A folder that cannot take
    a checkpoint, or a last.pt that --resume does not ask for, is refused (CheckpointError); the
    temporaries a killed write left are removed."""
    ckpt.check_writable(ckpt_file.parent)
    if ckpt_file.exists() and not config.resume:
        raise ckpt.CheckpointError(f"{ckpt_file} exists and would be overwritten; pass --resume (resume=True) to "
                                   "continue it, or choose another --ckpt-dir")
    stale = ckpt.remove_stale_temporaries(ckpt_file.parent)
    if stale:
        print(f"preflight: removed {len(stale)} temporary checkpoint file(s) left by a killed run: "
              f"{', '.join(p.name for p in stale)}", flush=True)
    if not (config.resume and ckpt_file.exists()):
        return None, None
    first_error = None
    for candidate in run_folder.kept_checkpoints(ckpt_file.parent):
        try:
            snapshot = ckpt.load_checkpoint(candidate)
        except ckpt.CheckpointError as e:
            first_error = first_error or e
            continue
        if candidate != ckpt_file:
            print(f"resume: {ckpt_file} cannot be used ({str(first_error).split(';')[0]}); falling back to "
                  f"{candidate}, the newest checkpoint kept before it", flush=True)
        resume.check_contract(snapshot, config, train_items, candidate)
        return snapshot, candidate
    raise first_error


def restore(snapshot: dict, path: Path, checkpoints: Any, parts: resume.Parts, config: TrainConfig, launch: Launch,
            per_rank_batch: int, watchdog: Any, epoch_batches: int | None) -> None:
    """Every part but the model's weights (loaded before DDP wraps it) from the checkpoint, and
    one line saying so, with this run's settings that differ. `epoch_batches`: a map-style
    set's batches an epoch (a position past them is refused), None for a stream."""
    checkpoints.rotate = path == ckpt.checkpoint_path(config.ckpt_dir)  # never keep a bad last.pt as prev.pt
    checkpoints.restore(snapshot, skip=("model",))
    position = parts.position
    watchdog.note_checkpoint(position.step, path)
    changed = parts.optimizer.changed + resume.changed_run_settings(snapshot.get("config", {}), config)
    if getattr(parts.scheduler, "note", ""):
        changed.append(parts.scheduler.note)
    note = f"; this run's settings win: {', '.join(changed)}" if changed else ""
    if snapshot["world_size"] != launch.world_size:
        note += (f"; world size changed {snapshot['world_size']} -> {launch.world_size}, global batch "
                 f"{config.global_batch} kept, so each rank now takes {per_rank_batch}")
    print_main(launch, f"resume: {path} at epoch {position.epoch}, batch {position.batch_in_epoch}, "
                       f"step {position.step}{note}")
    if epoch_batches is not None and position.batch_in_epoch >= epoch_batches:
        raise ckpt.CheckpointError(f"resume position batch {position.batch_in_epoch} lies past the epoch's "
                                   f"{epoch_batches} batches; resume with the dataset and --bs the checkpoint "
                                   "was made with")
