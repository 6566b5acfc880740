"""The seed document's job in torch: its minimal autoencoder, its toy dataset, its loss and its
optimizer. A plug-in like any user's model and data: autoencoder_job.AutoencoderJob (light, for
the command line) builds these, and the loop meets them only as a model, datasets, a loss_fn and
its metrics. Nothing outside these two modules names them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from .errors import UsageError
from .model import OptimizerFactory, adam


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

class AutoencoderLoss:
    """The seed's job as a loss_fn: reconstruct the batch, loss(x, model(x)).
    A class, not a lambda, so that it pickles (DataLoader workers, torch.compile)."""

    def __init__(self, kind: str = "rmse") -> None:
        self.kind, self.fn = kind, LOSSES[kind]

    def __call__(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, model(x))

    def metrics(self) -> dict:
        """The seed's evaluation figure: the exact mean over items of each item's RMSE (or MSE)."""
        return {f"mean {self.kind.upper()}": self.per_item}

    def per_item(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Each item's own loss (the evaluation's exact per-item mean)."""
        y = model(x).float()
        mse = ((x - y) ** 2).mean(dim=1)
        return mse.sqrt() if self.kind == "rmse" else mse


def autoencoder_optimizer(lr: float, betas: tuple[float, float], fused: bool = True) -> OptimizerFactory:
    """The seed's Adam, as the Trainer's optimizer factory (params -> optimizer): the default one."""
    return adam(lr, betas, fused)


seed_optimizer = autoencoder_optimizer  # its name before 2026-12-06, kept for code that imports it


def build_optimizer(model: nn.Module, lr: float, betas: tuple[float, float]) -> torch.optim.Adam:
    """The seed's Adam over a model's parameters."""
    return autoencoder_optimizer(lr, betas)(model.parameters())


class LinspaceDataset(Dataset):
    """Item i is linspace(0, i, dim) as float32 (the seed's DummyDataset), for i in [start, start + num_items).

    Indexed with a list of indices it returns the whole batch as one contiguous tensor,
    equal bit for bit to the items (`batched_getitem`): build_loader then fetches each batch
    with one vectorised product instead of a Python loop and a collate copy.

    A set of at most KEPT_BYTES is made whole at its first batch, and each batch is a copy of
    its rows; a larger set makes each batch's rows anew. Why: docs/benchmark.md, "The loop
    against DDP's floor".
    """

    batched_getitem = True
    KEPT_BYTES = 256 * 2**20

    def __init__(self, dim: int = 1000, num_items: int = 10000, start: int = 0) -> None:
        self.dim = dim
        self.start = start
        self.num_items = num_items
        self._rows: np.ndarray | None = None

    def __len__(self) -> int:
        return self.num_items

    def __getitem__(self, idx: int | Sequence[int]) -> torch.Tensor:
        if isinstance(idx, (int, np.integer)):
            return torch.from_numpy(np.linspace(0, self.start + idx, self.dim).astype(np.float32))
        if self._rows is None and self.num_items * self.dim * 4 <= self.KEPT_BYTES:
            self._rows = linspace_rows(np.arange(self.num_items, dtype=np.float64) + self.start, self.dim)
        if self._rows is not None:
            return torch.from_numpy(self._rows[np.asarray(idx, dtype=np.intp)])  # a copy: the batch owns its rows
        return torch.from_numpy(linspace_rows(np.asarray(idx, dtype=np.float64) + self.start, self.dim))


def linspace_rows(stops: np.ndarray, dim: int) -> np.ndarray:
    """Row i is np.linspace(0, stops[i], dim) as float32, bit for bit, with numpy's arithmetic
    (k * (stop / (dim - 1)) in float64, the last point set to stop exactly), written straight
    into the float32 batch. Faster than numpy's batched linspace, which also switches every
    row of a batch holding a 0 stop to another rounding (its gh-5437 branch), so that rows
    there could differ from the items; here each row is its item.

    numpy, not torch: between training steps each small torch op costs more than this whole
    product (the figures: docs/benchmark.md, "where the per-step time goes")."""
    rows = np.empty((len(stops), dim), dtype=np.float32)
    if dim == 1:
        rows[:] = 0  # np.linspace(0, s, 1) is [0.]
        return rows
    np.multiply((stops / (dim - 1))[:, None], np.arange(dim, dtype=np.float64), out=rows, casting="same_kind")
    rows[:, -1] = stops
    return rows


def autoencoder_datasets(dim_in: int, num_items: int,
                         eval_items: int) -> tuple[LinspaceDataset, LinspaceDataset | None]:
    """The seed's data: LinspaceDataset, its last `eval_items` held out (10% with --eval-every)."""
    train_items = num_items - eval_items
    eval_set = LinspaceDataset(dim_in, eval_items, start=train_items) if eval_items else None
    return LinspaceDataset(dim_in, train_items), eval_set
