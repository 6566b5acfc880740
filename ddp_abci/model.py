"""Model: the seed's minimal autoencoder, and its DistributedDataParallel wrapper."""
from __future__ import annotations

import functools
import shutil
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .errors import UsageError


class SimpleModule(nn.Module):
    """Linear(dim_in -> dim_hidden) then Linear(dim_hidden -> dim_in), as in the seed."""

    def __init__(self, dim_in: int = 1000, dim_hidden: int = 100) -> None:
        super().__init__()
        self.dim_in = dim_in
        self.dim_hidden = dim_hidden
        self.net = nn.Sequential(nn.Linear(dim_in, dim_hidden), nn.Linear(dim_hidden, dim_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def build_model(seed: int, dim_in: int = 1000, dim_hidden: int = 100) -> SimpleModule:
    """Seeded immediately before construction, so every rank starts from the same weights
    (DDP also broadcasts rank 0's, but a seeded build makes runs reproducible)."""
    torch.manual_seed(seed)
    try:
        return SimpleModule(dim_in, dim_hidden)
    except (RuntimeError, MemoryError) as e:  # the allocator refused: say which flags made it big
        if "alloc" not in str(e).lower() and not isinstance(e, MemoryError):
            raise
        params = 2 * dim_in * dim_hidden + dim_in + dim_hidden
        raise UsageError(f"the model's {params:,} parameters ({params * 4 / 1e9:.1f} GB) do not fit in memory; "
                         "use a smaller --dim-in or --dim-hidden") from None


def rmse_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed's loss: the square root of the batch's mean squared error."""
    return ((x - y) ** 2).mean().sqrt()


def mse_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error, a per-sample mean: K accumulated micro-batches of B then equal
    one batch of K*B exactly (the seed's RMSE, a square root of the mean, does not)."""
    return ((x - y) ** 2).mean()


LOSSES = {"rmse": rmse_loss, "mse": mse_loss}

# What the Trainer calls: loss_fn(model, batch) -> a scalar tensor, inside autocast.
LossFn = Callable[[nn.Module, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class AutoencoderLoss:
    """The seed's job as a loss_fn: reconstruct the batch, loss(x, model(x)).
    A class, not a lambda, so that it pickles (DataLoader workers, torch.compile)."""

    def __init__(self, kind: str = "rmse") -> None:
        self.kind, self.fn = kind, LOSSES[kind]

    def __call__(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, model(x))

    def per_item(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Each item's own loss (the evaluation's exact per-item mean)."""
        y = model(x).float()
        mse = ((x - y) ** 2).mean(dim=1)
        return mse.sqrt() if self.kind == "rmse" else mse


def compile_model(model: nn.Module, device: torch.device) -> nn.Module:
    """torch.compile, where it can run: Inductor builds C++ kernels on the CPU and Triton ones on GPUs."""
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        raise UsageError("--compile on the CPU needs a C++ compiler (g++) for Inductor's kernels; "
                         "install one or drop --compile")
    try:
        return torch.compile(model)
    except RuntimeError as e:  # e.g. a Python version Dynamo does not support yet
        raise UsageError(f"torch.compile cannot run here ({str(e).splitlines()[0]}); drop --compile") from None


def wrap_model(model: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """Move to the device and wrap in DDP. On one process DDP would only all-reduce with
    itself, so the bare module is returned (Accelerate does the same)."""
    model = model.to(device)
    if world_size == 1:
        return model
    # gradient_as_bucket_view: gradients live inside DDP's all-reduce buckets, which saves
    # one copy of every gradient per step (and its memory).
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)


def seed_optimizer(lr: float, betas: tuple[float, float], fused: bool = True) -> OptimizerFactory:
    """The seed's Adam, as the Trainer's optimizer factory (params -> optimizer).
    fused=True does the whole update in one kernel per parameter group: 0.20 ms a step
    against 0.67 ms for the per-tensor loop (2-core AMD EPYC VM, torch 2.13.0 CPU, Open MPI 5.0.11, 2026-12;
    README Benchmark; it runs on CUDA too).
    Its rounding differs from the loop's in the last bits, which the seed's job amplifies
    (README, parity): fused=False matches the seed and Accelerate exactly."""
    return functools.partial(torch.optim.Adam, lr=lr, betas=tuple(betas), fused=fused or None)


def build_optimizer(model: nn.Module, lr: float, betas: tuple[float, float]) -> torch.optim.Adam:
    """The seed's Adam over a model's parameters."""
    return seed_optimizer(lr, betas)(model.parameters())


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP (and inside torch.compile's wrapper)."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)
