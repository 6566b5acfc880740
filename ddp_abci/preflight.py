"""Preflight: everything a run can check before its first step, so that bad input costs
no work and overwrites nothing. Rank 0 checks the files; every rank checks its data."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from . import checkpoint as ckpt
from .collectives import broadcast_error, broadcast_object, print_main, raise_if_any_rank_failed
from .config import TrainConfig
from .data import batch_fetcher, check_item, to_device
from .errors import UsageError
from .launch import Launch
from .model import LossFn
from .precision import autocast
from .tracking import check_tensorboard_installed


def check_files(config: TrainConfig, launch: Launch, ckpt_file: Path | None,
                train_items: int) -> tuple[dict | None, Path | None]:
    """Check the files this run writes, and the checkpoint it resumes: rank 0 decides, all
    ranks obey. Returns the snapshot to resume from (loaded on every rank) and its file
    (last.pt, or prev.pt when last.pt is unreadable), or (None, None)."""
    verdict: list = [None, None]  # [error, file to resume from]
    checked = None
    if launch.is_main:
        try:
            _check_outputs(config)
            if ckpt_file is not None:
                checked, verdict[1] = _checkpoint_to_resume(config, ckpt_file, train_items)
                _remove_stale_temporaries(ckpt_file.parent)
        except UsageError as e:
            verdict[0] = str(e)
        except Exception as e:  # anything else too: the other ranks wait in the broadcast
            verdict[0] = f"checking {ckpt_file} failed: {e!r}"
    error, chosen = broadcast_object(launch, verdict)
    if error:
        raise UsageError(error)
    if chosen is None:
        if ckpt_file is not None and config.resume:
            print_main(launch, f"resume: no checkpoint at {ckpt_file}; starting fresh")
        return None, None
    return (checked if checked is not None else ckpt.load_checkpoint(chosen)), Path(chosen)  # rank 0 has it


def _check_outputs(config: TrainConfig) -> None:
    if config.tensorboard:
        check_tensorboard_installed()
        if Path(config.tensorboard).exists() and not Path(config.tensorboard).is_dir():
            raise UsageError(f"--tensorboard {config.tensorboard} is a file; name a folder")
    for flag, path in (("--metrics-jsonl", config.metrics_jsonl), ("--summary-json", config.summary_json),
                       ("--save-model", config.save_model)):
        error = output_error(flag, path) if path else None
        if error:
            raise UsageError(error)


def _checkpoint_to_resume(config: TrainConfig, ckpt_file: Path, train_items: int) -> tuple[dict | None, str | None]:
    """DIR/last.pt checked against this run, or DIR/prev.pt when last.pt cannot be read."""
    ckpt.check_writable(ckpt_file.parent)
    if ckpt_file.exists() and not config.resume:
        raise ckpt.CheckpointError(f"{ckpt_file} exists and would be overwritten; pass --resume to continue it, "
                                   "or choose another --ckpt-dir")
    if not (config.resume and ckpt_file.exists()):
        return None, None
    chosen = ckpt_file
    try:
        snapshot = ckpt.load_checkpoint(ckpt_file)
    except ckpt.CheckpointError as e:
        previous = ckpt_file.with_name(ckpt.PREVIOUS)
        if not previous.exists():
            raise
        snapshot, chosen = ckpt.load_checkpoint(previous), previous
        print(f"resume: {ckpt_file} cannot be used ({str(e).split(';')[0]}); falling back to {previous}, "
              "the checkpoint before it", flush=True)
    check_resumable(snapshot, config, train_items, chosen)
    return snapshot, str(chosen)


def _remove_stale_temporaries(ckpt_dir: Path) -> None:
    stale = ckpt.remove_stale_temporaries(ckpt_dir)
    if stale:
        print(f"preflight: removed {len(stale)} temporary checkpoint file(s) left by a killed run: "
              f"{', '.join(p.name for p in stale)}", flush=True)


def check_disk_space(launch: Launch, ckpt_dir: Path | None, model: torch.nn.Module) -> None:
    """Rank 0 refuses a --ckpt-dir without room for two checkpoints, before the first step."""
    error = None
    if ckpt_dir is not None and launch.is_main:
        error = ckpt.disk_space_error(ckpt_dir, ckpt.estimated_bytes(model))
    broadcast_error(launch, error)


def output_error(flag: str, path: str) -> str | None:
    """Why `path` could not be written at the end of the run, or None; nothing is created.
    --save-model is renamed into place (atomically), so it must be a regular file or new:
    renaming over /dev/null would replace the device itself."""
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path} is a folder; name a file"
    if flag == "--save-model" and target.exists() and not target.is_file():
        return f"{flag} {path} is not a regular file and would be replaced; name a file"
    if not target.parent.is_dir():
        return f"{flag} {path}: the folder {target.parent} does not exist; create it or choose another path"
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{flag} {path} cannot be written (permission denied); choose a writable path"
    return None


def check_resumable(snapshot: dict, config: TrainConfig, train_items: int, ckpt_file: Path) -> None:
    """The resume contract: what must not change for the continuation to be exact (the
    world size, epochs, --max-steps, hyper-parameters and logging may)."""
    saved = snapshot.get("config", {})
    fixed = [("--bs", snapshot["global_batch"], config.global_batch, "an exact resume needs the same global batch"),
             ("--seed", saved.get("seed", config.seed), config.seed, "the rest of the epoch must be shuffled alike"),
             ("--split", saved.get("split", "strided"), config.split, "each rank must see the batches it would have")]
    for flag, before, now, why in fixed:
        if before != now:
            raise ckpt.CheckpointError(f"{ckpt_file} was written with {flag} {before}, this run has {now}: {why}; "
                                       f"resume with {flag} {before}, or use another --ckpt-dir")
    before = snapshot.get("train_items", train_items)
    if before != train_items:
        seed_data = (f"--num-items {saved['num_items']} --eval-every {saved.get('eval_every', 0)}"
                     if "num_items" in saved else "the same dataset")
        raise ckpt.CheckpointError(f"{ckpt_file} was written with {before} training items, this run has {train_items}: "
                                   f"the epoch must be the same; resume with {seed_data} for the seed's data (or "
                                   "the same training set), or use another --ckpt-dir")


def check_data(train_set: Dataset, eval_set: Dataset | None, config: TrainConfig, launch: Launch) -> None:
    """Sizes that would train something other than what the log says, and item types
    that the collate cannot batch."""
    world = launch.world_size
    for name, dataset in (("training set", train_set), ("evaluation set", eval_set)):
        if dataset is None:
            continue
        n = len(dataset)
        if n < world:
            raise UsageError(f"the {name} has {n} items for {world} ranks: every rank needs at least one; "
                             f"use more items (--num-items) or fewer ranks")
        check_item(dataset[0], "item 0")
    if config.global_batch > len(train_set):
        raise UsageError(f"global batch {config.global_batch} is larger than the training set "
                         f"({len(train_set)} items); use --bs {len(train_set) // world * world} or less")


def dry_run(model: torch.nn.Module, train_set: Dataset, loss_fn: LossFn, precision: str, device: torch.device,
            per_rank_batch: int) -> None:
    """Call loss_fn once on a first batch, in eval mode without gradients (no weights,
    buffers or RNG change), and check that it gives a finite-typed scalar. Every rank
    does it, and a failure on any one stops them all with its message."""
    error = None
    try:
        batch = to_device(batch_fetcher(train_set)[list(range(min(per_rank_batch, len(train_set))))], device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), autocast(precision, device):
                loss = loss_fn(model, batch)
        finally:
            model.train(was_training)
        error = _not_a_scalar(loss)
    except Exception as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        error = (f"loss_fn(model, batch) raised {type(e).__name__}: {text} on a first batch; "
                 "fix the loss function, or the model or dataset it is given")
    raise_if_any_rank_failed(error)


def _not_a_scalar(loss: Any) -> str | None:
    if not isinstance(loss, torch.Tensor):
        return f"loss_fn returned a {type(loss).__name__}, not a tensor; return a scalar tensor (e.g. loss.mean())"
    if loss.dim() != 0 or not loss.is_floating_point():
        return (f"loss_fn returned a {loss.dtype} tensor of shape {tuple(loss.shape)}; return one floating "
                "scalar (reduce it with .mean() or .sum())")
    return None
