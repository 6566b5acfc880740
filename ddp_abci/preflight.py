"""Preflight: everything a run can check before its first step, so that bad input costs
no work and overwrites nothing. Rank 0 checks the files; every rank checks its data."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from . import checkpoint as ckpt
from .collectives import broadcast_error, print_main, raise_if_any_rank_failed
from .config import TrainConfig
from .data import batch_fetcher, check_item, to_device
from .errors import UsageError
from .launch import Launch
from .model import LossFn
from .precision import autocast


def check_files(config: TrainConfig, launch: Launch, ckpt_file: Path | None, train_items: int) -> dict | None:
    """Check the files this run writes, and the checkpoint it resumes: rank 0 decides, all
    ranks obey. Returns the snapshot to resume from (loaded on every rank), or None."""
    error, checked = None, None
    if launch.is_main:
        for flag, path in (("--metrics-jsonl", config.metrics_jsonl), ("--summary-json", config.summary_json),
                           ("--save-model", config.save_model)):
            if path and error is None:
                error = output_error(flag, path)
    if ckpt_file is not None and launch.is_main and error is None:
        try:
            ckpt.check_writable(ckpt_file.parent)
            if ckpt_file.exists() and not config.resume:
                raise ckpt.CheckpointError(
                    f"{ckpt_file} exists and would be overwritten; pass --resume to continue it, "
                    "or choose another --ckpt-dir")
            if ckpt_file.exists():
                checked = ckpt.load_checkpoint(ckpt_file)
                check_resumable(checked, config, train_items, ckpt_file)
        except UsageError as e:
            error = str(e)
        except Exception as e:  # anything else too: the other ranks wait in the broadcast
            error = f"checking {ckpt_file} failed: {e!r}"
    broadcast_error(launch, error)
    if ckpt_file is None or not config.resume:
        return None
    if not ckpt_file.exists():
        print_main(launch, f"resume: no checkpoint at {ckpt_file}; starting fresh")
        return None
    return checked if checked is not None else ckpt.load_checkpoint(ckpt_file)  # rank 0 has it already


def output_error(flag: str, path: str) -> str | None:
    """Why `path` could not be written at the end of the run, or None; nothing is created."""
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path} is a folder; name a file"
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
             ("--split", saved.get("split", "strided"), config.split, "each rank must see the batches it would have"),
             ("training items", snapshot.get("train_items", train_items), train_items,
              "the epoch must be the same; --num-items and --eval-every change it for the seed's data")]
    for flag, before, now, why in fixed:
        if before != now:
            raise ckpt.CheckpointError(f"{ckpt_file} was written with {flag} {before}, this run has {now}: {why}; "
                                       f"resume with {flag} {before}, or use another --ckpt-dir")


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
