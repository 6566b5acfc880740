"""The model's way into the loop, for any model: the DistributedDataParallel wrapper,
torch.compile, the optimizer built and checked, the default optimizer. (The seed's
autoencoder: autoencoder.py.)"""
from __future__ import annotations

import functools
import shutil
from collections import Counter
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .errors import UsageError

# What the Trainer calls: loss_fn(model, batch) -> a scalar tensor, inside autocast.
LossFn = Callable[[nn.Module, Any], torch.Tensor]
# What fit(optimizer=) takes: params -> optimizer, given a list of the model's parameters (so
# that a weight-decay split can go over it twice), or an optimizer class, called with lr=config.lr.
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def compile_model(model: nn.Module, device: torch.device) -> nn.Module:
    """torch.compile, where it can run: Inductor builds C++ kernels on the CPU and Triton ones on GPUs."""
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        raise UsageError("--compile on the CPU needs a C++ compiler (g++) for Inductor's kernels; "
                         "install one or drop --compile")
    try:
        return torch.compile(model)
    except RuntimeError as e:  # e.g. a Python version Dynamo does not support yet
        raise UsageError(f"torch.compile cannot run here ({str(e).splitlines()[0]}); drop --compile") from None


def wrap_model(model: nn.Module, device: torch.device, world_size: int, *,
               find_unused_parameters: bool = False) -> nn.Module:
    """Move to the device and wrap in DDP. On one process DDP would only all-reduce with
    itself, so the bare module is returned (Accelerate does the same).
    find_unused_parameters: DDP walks the autograd graph after each forward and marks the
    parameters it did not reach as ready, so a layer used on some steps or ranks only does
    not stop the reduction (Accelerate: DistributedDataParallelKwargs; Fabric: a strategy)."""
    model = model.to(device)
    if world_size == 1:
        return model
    # gradient_as_bucket_view: gradients live inside DDP's all-reduce buckets, which saves
    # one copy of every gradient per step (and its memory).
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True,
               find_unused_parameters=find_unused_parameters)


def adam(lr: float, betas: tuple[float, float], fused: bool = True) -> OptimizerFactory:
    """The default optimizer, Adam from TrainConfig's lr and betas, as a factory (params -> optimizer).
    fused=True does the whole update in one kernel per parameter group, about 3 times faster
    than the per-tensor loop here (docs/benchmark.md); it runs on CUDA too. Its rounding differs
    from the loop's in the last bits, which the seed's job amplifies (docs/accelerate.md,
    parity): fused=False matches the seed and Accelerate exactly."""
    return functools.partial(torch.optim.Adam, lr=lr, betas=tuple(betas), fused=fused or None)


def make_optimizer(factory: Any, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The optimizer from fit()'s `optimizer`, checked before any step: an optimizer that
    holds every trainable parameter exactly once. Anything else is one line naming what
    it got (a weight-decay split over a generator silently drops its second half)."""
    params = list(model.parameters())
    if isinstance(factory, torch.optim.Optimizer):
        raise UsageError(f"optimizer= got an optimizer already built ({type(factory).__name__}); pass a factory, e.g. "
                         f"optimizer=lambda params: torch.optim.{type(factory).__name__}(params, lr=...): the "
                         "optimizer must be built over the parameters of the model the trainer wraps")
    if isinstance(factory, type) and issubclass(factory, torch.optim.Optimizer):
        optimizer = factory(params, lr=lr)  # a class: called with lr=config.lr, nothing else from the config
    elif not callable(factory):
        raise UsageError(f"optimizer= must be a factory (params -> optimizer) or an optimizer class, "
                         f"got a {type(factory).__name__}")
    else:
        try:
            optimizer = factory(params)
        except Exception as e:
            raise UsageError(f"the optimizer factory raised {type(e).__name__}: {str(e).strip()[:200]}; it gets a "
                             "list of the model's parameters and returns a torch.optim.Optimizer over them "
                             "(each param group a dict with 'params')") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"the optimizer factory returned a {type(optimizer).__name__}, not a torch.optim.Optimizer; "
                         "return the optimizer itself (a learning-rate schedule goes in TrainConfig.schedule)")
    _check_groups(optimizer, model)
    return optimizer


def _check_groups(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    names = {id(p): n for n, p in unwrap(model).named_parameters()}
    held = Counter(id(p) for group in optimizer.param_groups for p in group["params"])
    missing = [n for n, p in unwrap(model).named_parameters() if p.requires_grad and id(p) not in held]
    twice = [names.get(pid, "?") for pid, count in held.items() if count > 1]
    foreign = sum(count for pid, count in held.items() if pid not in names)
    for problem, found in (("leaves out", missing), ("holds twice", twice)):
        if found:
            raise UsageError(f"the optimizer {problem} trainable parameters: {', '.join(found[:6])}"
                             f"{' ...' if len(found) > 6 else ''}; every trainable parameter must be in exactly one "
                             "param group (the factory gets a list: split it with two comprehensions over it)")
    if foreign:
        raise UsageError(f"the optimizer holds {foreign} tensor(s) that are not this model's parameters; build it over "
                         "the parameters the factory is given")


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside torch.compile's wrapper and DDP, in either order."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        elif isinstance(model, (DDP, nn.DataParallel)):
            model = model.module
        else:
            return model
