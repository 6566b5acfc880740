"""The blog's job (the seed document's) as a plug-in (parts.Plugin): its settings in one small
dataclass, from which its autoencoder, toy dataset, loss and metrics are built (autoencoder.py).

`python -m ddp_abci.train` builds an AutoencoderJob from its flags (--dim-in, --dim-hidden,
--num-items, --loss) and fit() builds the parts from it, as it would take a user's. A fit()
user who brings a model, data and loss never meets these settings: they are not TrainConfig's.

Imports nothing heavy at the top: the command line builds the dataclass before torch loads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UsageError
from .options import check_fields, option, setting
from .parts import Parts

LOSS_CHOICES = ("rmse", "mse")

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

    def build(self, seed: int, eval_every: int) -> Parts:
        """The seed's model (built from `seed`, the same on every rank), its datasets, its loss
        and its evaluation figure (each item's RMSE or MSE, averaged exactly)."""
        from .autoencoder import AutoencoderLoss, autoencoder_datasets, build_model  # noqa: PLC0415  (torch here)

        held_out = self.eval_items(eval_every)
        if eval_every and held_out < 1:
            raise UsageError(f"{setting(AutoencoderJob, 'num_items')} {self.num_items} leaves no held-out items for "
                             "eval_every (--eval-every); use at least 10 items")
        train_set, eval_set = autoencoder_datasets(self.dim_in, self.num_items, held_out)
        model, loss = build_model(seed, self.dim_in, self.dim_hidden), AutoencoderLoss(self.loss)
        return Parts(model, train_set, loss, eval_set=eval_set, metrics=loss.metrics())

    def to_dict(self) -> dict:
        """Recorded in the checkpoint's `config` beside TrainConfig's fields, as before the split."""
        return asdict(self)


SeedJob = AutoencoderJob  # its name before 2026-12-06, kept for code that imports it

