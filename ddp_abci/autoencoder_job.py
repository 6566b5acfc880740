"""The blog's job (the seed document's): its autoencoder, its toy dataset and its loss, from one small dataclass.

`python -m ddp_abci.train` builds an AutoencoderJob from its flags (--dim-in, --dim-hidden,
--num-items, --loss) and fit() builds the model, the data and the loss from it. A fit() user
who brings a model, data and loss never meets these settings: they are not TrainConfig's.

Imports nothing heavy at the top: the command line builds the dataclass before torch loads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from .errors import UsageError
from .options import check_fields, option, setting

LOSS_CHOICES = ("rmse", "mse")


class JobParts(NamedTuple):
    model: Any       # torch.nn.Module
    train_set: Any   # torch.utils.data.Dataset
    eval_set: Any    # the held-out Dataset, or None
    loss_fn: Any     # loss_fn(model, batch) -> scalar tensor


class Job(NamedTuple):
    """What one run trains: fit()'s parts, completed from the seed's job where left out."""
    model: Any
    train_set: Any
    eval_set: Any
    loss_fn: Any
    settings: dict   # the seed's job's settings, for the checkpoint's config ({} for your own parts)


@dataclass(frozen=True)
class AutoencoderJob:
    """The seed document's job, for what fit() is not given: its autoencoder (dim_in ->
    dim_hidden -> dim_in), LinspaceDataset of num_items (the last tenth held out with
    --eval-every) and its loss (RMSE, or MSE). Frozen; checked when made (UsageError)."""

    dim_in: int = option(1000, "the autoencoder's input width (the seed's 1000)", low=1, high=2**31 - 1)
    dim_hidden: int = option(100, "the autoencoder's hidden width (the seed's 100)", low=1, high=2**31 - 1)
    num_items: int = option(10000, "items of the seed's dataset (item i is linspace(0, i, --dim-in)); with "
                                   "--eval-every the last 10%% are held out", low=1, high=2**62)
    loss: str = option("rmse", "rmse (the seed's) or mse (a per-sample mean)", choices=LOSS_CHOICES)

    def __post_init__(self) -> None:
        check_fields(self)

    def eval_items(self, eval_every: int) -> int:
        """Held out for evaluation when it is asked for: the last 10% of the items, never trained on."""
        return self.num_items // 10 if eval_every else 0

    def build(self, seed: int, eval_every: int) -> JobParts:
        """The seed's model (built from `seed`, the same on every rank), its datasets and its loss."""
        from .data import autoencoder_datasets  # noqa: PLC0415  (torch loads here, not at import)
        from .model import AutoencoderLoss, build_model  # noqa: PLC0415

        held_out = self.eval_items(eval_every)
        if eval_every and held_out < 1:
            raise UsageError(f"{setting(AutoencoderJob, 'num_items')} {self.num_items} leaves no held-out items for "
                             "eval_every (--eval-every); use at least 10 items")
        train_set, eval_set = autoencoder_datasets(self.dim_in, self.num_items, held_out)
        model = build_model(seed, self.dim_in, self.dim_hidden)
        return JobParts(model, train_set, eval_set, AutoencoderLoss(self.loss))

    def to_dict(self) -> dict:
        """Recorded in the checkpoint's `config` beside TrainConfig's fields, as before the split."""
        return asdict(self)


SeedJob = AutoencoderJob  # its name before 2026-12-06, kept for code that imports it


def complete(model: Any, train_set: Any, eval_set: Any, loss_fn: Any, seed_job: "AutoencoderJob | None",
             config: Any) -> Job:
    """fit()'s parts with what is left out taken from the seed's job, and the job's settings
    for the checkpoint's config (empty when the user brought model, data and loss)."""
    if model is not None and train_set is not None and loss_fn is not None:
        return Job(model, train_set, eval_set, loss_fn, {})
    job = seed_job or AutoencoderJob()
    parts = job.build(config.seed, config.eval_every or config.eval_every_steps)
    eval_set = parts.eval_set if train_set is None and eval_set is None else eval_set
    return Job(parts.model if model is None else model, train_set if train_set is not None else parts.train_set,
               eval_set, loss_fn or parts.loss_fn, job.to_dict())
