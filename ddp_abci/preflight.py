"""Preflight: everything a run can check before its first step, so that bad input costs
no work and overwrites nothing. Rank 0 checks the files; every rank checks its data and
runs loss_fn once. The functions named share_* are collectives; the rest are local."""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch.utils.data import Dataset, default_collate

from .checkpointing import checkpoint as ckpt
from .config import TrainConfig, name, turn_on
from .data import CollateFailed, batch_fetcher, batch_len, describe, first_batch, to_device
from .errors import UsageError, one_line
from .model import LossFn, unwrap
from .parallel.collectives import all_ranks, print_main, raise_if_any_rank_failed, rank0_decides
from .parallel.launch import Launch
from .precision import autocast
from .stream_readers import Reader, reading_failure
from .streams import has_length, is_stream
from .trackers import check_installed
from .training_set import TrainingSet

UNUSED_ADVICE = (f"remove the layer, freeze it (requires_grad_(False)), or set {turn_on('find_unused_parameters')} "
                 "when a layer is used on some steps or ranks only")


def check_outputs(config: TrainConfig) -> None:
    """Rank 0's check of the files the run writes besides its checkpoints (choice.share runs it)."""
    check_installed(config.trackers + (("tensorboard",) if config.tensorboard else ()))
    if config.tensorboard:
        if Path(config.tensorboard).exists() and not Path(config.tensorboard).is_dir():
            raise UsageError(f"{name('tensorboard')} {config.tensorboard} is a file; name a folder")
    for field in ("metrics_jsonl", "summary_json", "save_model"):
        path = getattr(config, field)
        error = output_error(name(field), path, atomic=field == "save_model") if path else None
        if error:
            raise UsageError(error)


def share_disk_check(launch: Launch, ckpt_dir: Path | None, model: torch.nn.Module) -> None:
    """Collective: rank 0 refuses a --ckpt-dir without room for two checkpoints."""
    def decide() -> None:
        error = ckpt.disk_space_error(ckpt_dir, ckpt.estimated_bytes(model)) if ckpt_dir is not None else None
        if error:
            raise UsageError(error)
    rank0_decides(launch, decide)


def output_error(flag: str, path: str, atomic: bool = False) -> str | None:
    """Why `path` could not be written at the end of the run, or None; nothing is created.
    An atomic output is renamed into place, so it must be a regular file or new: renaming
    over /dev/null would replace the device itself."""
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path} is a folder; name a file"
    if atomic and target.exists() and not target.is_file():
        return f"{flag} {path} is not a regular file and would be replaced; name a file"
    if not target.parent.is_dir():
        return f"{flag} {path}: the folder {target.parent} does not exist; create it or choose another path"
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        return f"{flag} {path} cannot be written (permission denied); choose a writable path"
    return None


def check_data(data: TrainingSet, reader: Reader | None, eval_set: Dataset | None, config: TrainConfig,
               launch: Launch) -> None:
    """Local: sizes that would train something other than what the log says, and datasets
    that the sampler cannot share out or the collate step cannot batch (its own message)."""
    world = launch.world_size
    for what, dataset, collate in (("training set", data.dataset, data.collate_fn),
                                   ("evaluation set", eval_set, data.collate_fn)):
        if dataset is None:
            continue
        if not is_stream(dataset) and not has_length(dataset):
            raise UsageError(f"the {what} is a {type(dataset).__name__} with neither a length nor an iterator: give "
                             "a map-style Dataset (__len__ and __getitem__) or an IterableDataset (__iter__)")
        if not is_stream(dataset) and len(dataset) < world:
            raise UsageError(f"the {what} has {len(dataset)} items for {world} ranks: every rank needs at least one; "
                             f"use more items (num_items, --num-items, for the seed's data) or fewer ranks")
        items = read_first(reader if dataset is data.dataset else None, dataset, 1, what)
        if not items:
            raise UsageError(f"the {what} {type(dataset).__name__} yields no items")
        check_collates(items[0], collate, what)
    if data.stream:
        if config.schedule == "cosine" and not config.max_steps and reader.batches_per_epoch() is None:
            raise UsageError(f"{name('schedule')} cosine needs the run's length: set {name('max_steps')}, or give "
                             "the stream a __len__")
        return
    if config.global_batch > data.items:
        raise UsageError(f"{name('global_batch')} {config.global_batch} is larger than the training set "
                         f"({data.items} items); use {data.items // world * world} or less")


def read_first(reader: Reader | None, dataset: Any, count: int, what: str = "training set") -> list[Any]:
    """A dataset's first `count` items (a stream's through its reader, which leaves the
    library as it was); a failure is one line with the library's own message."""
    try:
        if reader is not None:
            return reader.first_items(count)
        if is_stream(dataset):
            return list(itertools.islice(iter(dataset), count))
        return [dataset[i] for i in range(min(count, len(dataset)))]
    except UsageError:
        raise
    except Exception as e:
        raise UsageError(f"reading the {what}'s first items failed ({reading_failure(e)}); fix the "
                         f"dataset's {'__iter__' if is_stream(dataset) else '__getitem__'}") from None


def check_collates(item: Any, collate_fn: Callable | None, what: str = "training set") -> None:
    """Refuse, with the collate step's own message, an item it cannot make into a batch."""
    collate = collate_fn or default_collate
    try:
        collate([item, item])
    except Exception as e:
        how = getattr(collate, "__name__", type(collate).__name__)
        raise UsageError(f"the {what}'s first item ({describe(item)}) cannot be batched by {how}: "
                         f"{type(e).__name__}: {one_line(e)}; return tensors, numbers, numpy arrays or strings, or "
                         "tuples, lists and dicts of them, or pass collate_fn= that batches yours") from None


def dry_run(model: torch.nn.Module, data: TrainingSet, reader: Reader | None, loss_fn: LossFn, precision: str,
            device: torch.device, per_rank_batch: int, *, find_unused: bool = False, eval_set: Dataset | None = None,
            metrics: Mapping[str, Callable] | None = None, last_batch: int = 0) -> str | None:
    """Local: one forward and backward of loss_fn on a first batch, as training will run
    it (and on a batch of `last_batch` items, the size of an epoch's short last batch on
    each rank); weights, buffers, gradients and the RNG are put back as they were. Returns
    what is wrong, in one line, or None: the loss is not a scalar or not connected to the
    model, a trainable parameter got no gradient (DDP would stop at the second step), the
    short last batch fails (BatchNorm on one item), a metric does not give one value per item."""
    collate_fn = data.collate_fn
    try:
        fetch = batch_fetcher(data.dataset, collate_fn) if not data.stream else None
        batch = first_batch(read_first(reader, data.dataset, per_rank_batch), collate_fn) if fetch is None else \
            fetch[list(range(min(per_rank_batch, data.items)))]
        batch = to_device(batch, device)
    except (CollateFailed, UsageError) as e:
        return str(e)
    snapshot = _state_of(model)
    try:
        with autocast(precision, device):
            loss = loss_fn(model, batch)
        error = _not_a_scalar(loss) or _not_connected(loss, model)
        if error is None:
            loss.backward()
            error = None if find_unused else _unused(model)
        if error is None and last_batch and fetch is not None:
            error = _short_batch_fails(model, fetch, loss_fn, precision, device, last_batch)
        if error is None and metrics and eval_set is not None:
            error = _bad_metric(model, eval_set, collate_fn, metrics, precision, device, per_rank_batch)
    except Exception as e:
        error = (f"loss_fn(model, batch) raised {type(e).__name__}: {_first_line(e)} on a first batch; "
                 "fix the loss function, or the model or dataset it is given")
    finally:
        _restore(model, snapshot)
    return error


def share_stream_order(launch: Launch, reader: Reader) -> None:
    """Collective: rank 0 says, before the first step, when the stream's order cannot be read
    again alike (an unseeded shuffle, or each rank drawing its own seed): a resume mid-epoch
    would then replay other items, and is refused."""
    keys = all_ranks(repr(reader.order_key()))
    warning = reader.order_warning()
    if len(set(keys)) > 1 and reader.one_order_across_ranks:
        raise UsageError(f"{reader.kind}: each rank drew its own shuffle seed ({', '.join(keys[:2])}, ...: no seed= "
                         "given), so the ranks would share out differently shuffled shards, training some items "
                         "twice and others never; pass seed= to .shuffle()")
    if warning is None and len(set(keys)) > 1:
        warning = (f"each rank drew its own shuffle seed ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''}: "
                   "no seed= given): the order differs on each run, and a resume mid-epoch would replay other "
                   "items; pass seed= to it")
    if warning is not None:
        print_main(launch, f"warning: {reader.kind}: {warning}; a resume mid-epoch is refused")
    note = reader.resume_note()
    if note is not None:
        print_main(launch, f"note: {reader.kind}: {note}")


def share_dry_run(error: str | None) -> None:
    """Collective: a failed dry run on any rank stops every rank with its message."""
    raise_if_any_rank_failed(error)


def short_last_batch(data: TrainingSet, config: TrainConfig, world: int) -> int:
    """Items each rank gets in the epoch's last batch when it is shorter than the rest, else 0
    (a stream trains whole batches only)."""
    if data.drop_last or data.stream:
        return 0
    padded = -(-data.items // world) * world  # DistributedSampler pads to a multiple of the world
    return padded % config.global_batch // world


def _state_of(model: torch.nn.Module) -> dict:
    return {"training": model.training, "buffers": [b.detach().clone() for b in model.buffers()],
            "rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available()
            else None}


def _restore(model: torch.nn.Module, state: dict) -> None:
    with torch.no_grad():
        for buffer, saved in zip(model.buffers(), state["buffers"], strict=True):
            buffer.copy_(saved)
    for p in model.parameters():
        p.grad = None
    model.train(state["training"])
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


def _not_a_scalar(loss: Any) -> str | None:
    if not isinstance(loss, torch.Tensor):
        return f"loss_fn returned a {type(loss).__name__}, not a tensor; return a scalar tensor (e.g. loss.mean())"
    if loss.dim() != 0 or not loss.is_floating_point():
        return (f"loss_fn returned a {loss.dtype} tensor of shape {tuple(loss.shape)}; return one floating "
                "scalar (reduce it with .mean() or .sum())")
    return None


def _not_connected(loss: torch.Tensor, model: torch.nn.Module) -> str | None:
    if loss.requires_grad:
        return None
    if not any(p.requires_grad for p in model.parameters()):
        return "the model has no trainable parameters (every one has requires_grad=False); unfreeze what should train"
    return ("loss_fn returned a loss with no gradient: it was detached (.detach(), .item(), torch.no_grad()) or "
            "computed without the model's output; compute it from model(...) and return the tensor")


def _unused(model: torch.nn.Module) -> str | None:
    unused = [n for n, p in unwrap(model).named_parameters() if p.requires_grad and p.grad is None]
    if not unused:
        return None
    shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
    return (f"trainable parameters got no gradient from loss_fn on a first batch: {shown}; DDP would stop at the "
            f"second step; {UNUSED_ADVICE}")


def _short_batch_fails(model: torch.nn.Module, fetch: Any, loss_fn: LossFn, precision: str, device: torch.device,
                       items: int) -> str | None:
    for p in model.parameters():
        p.grad = None
    try:
        with autocast(precision, device):
            loss_fn(model, to_device(fetch[list(range(items))], device)).backward()
    except Exception as e:
        return (f"loss_fn fails on the epoch's short last batch of {items} item(s) per rank ({type(e).__name__}: "
                f"{_first_line(e)}); set {turn_on('drop_last')} to drop it, or choose a global_batch (--bs) that "
                "divides the training set")
    return None


def _bad_metric(model: torch.nn.Module, eval_set: Dataset, collate_fn: Callable | None, metrics: Mapping[str, Callable],
                precision: str, device: torch.device, per_rank_batch: int) -> str | None:
    batch = to_device(first_batch(read_first(None, eval_set, per_rank_batch, "evaluation set"), collate_fn), device)
    items = batch_len(batch)
    model.eval()
    with torch.no_grad(), autocast(precision, device):
        for metric, fn in metrics.items():
            value = fn(model, batch)
            if not isinstance(value, torch.Tensor) or value.numel() != items:
                got = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                       else f"a {type(value).__name__}")
                return (f"metric {metric!r} returned {got} for a batch of {items} items; return one value per item "
                        "(e.g. (pred == y).float(), not its mean): the evaluation averages them over every item")
    return None
