"""What one run trains, for any model: the parts fit() takes, in one frozen dataclass, and the
plug-in that supplies what the caller leaves out. The seed's job (autoencoder_job.AutoencoderJob)
is one such plug-in: `python -m ddp_abci.train` is fit() with the parts it builds, reached the same
way as a user's model and data.

Imports nothing heavy: the command line builds the plug-in before torch loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol


@dataclass(frozen=True)
class Parts:
    """The run's parts, as fit() and Trainer take them.

    model: an nn.Module on the CPU, unwrapped; train_set: a Dataset, an IterableDataset or a
    DataLoader; loss_fn(model, batch) -> a scalar tensor; eval_set: held out (or None);
    metrics: name -> fn(model, batch) giving one value per item; optimizer: a factory
    params -> optimizer, or an optimizer class (None: Adam from TrainConfig); scheduler: a
    factory optimizer -> LRScheduler; state: name -> an object with state_dict(); collate_fn:
    makes a list of items into a batch; on_eval: gets each evaluation's figures on rank 0;
    count_tokens: fn(batch) -> the tokens in one of this rank's batches (throughput.py);
    settings: the plug-in's own settings, recorded in the checkpoint's config."""

    model: Any
    train_set: Any
    loss_fn: Callable
    eval_set: Any = None
    metrics: Mapping[str, Callable] | None = None
    optimizer: Any = None
    scheduler: Callable | None = None
    state: Mapping[str, Any] | None = None
    collate_fn: Callable | None = None
    on_eval: Callable[[dict], None] | None = None
    count_tokens: Callable[[Any], int] | None = None
    settings: dict = field(default_factory=dict)


class Plugin(Protocol):
    """A job that builds what a run trains from its own settings (the seed's AutoencoderJob)."""

    def build(self, seed: int, eval_every: int) -> Parts:
        """Its model (the same on every rank for one `seed`), data, loss and metrics; a held-out
        set when `eval_every` asks for evaluation."""

    def to_dict(self) -> dict:
        """Its settings, plain data, for the checkpoint's config."""


def complete(given: Parts, plugin: Plugin | None, config: Any, default: Callable[[], Plugin]) -> Parts:
    """`given` as it is when it names a model, a training set and a loss; else those left out
    (and the held-out set and metrics, when the caller gave neither) from `plugin`, or from
    `default()`, with the plug-in's settings kept for the checkpoint."""
    if given.model is not None and given.train_set is not None and given.loss_fn is not None:
        return given
    plugin = plugin or default()
    built = plugin.build(config.seed, config.eval_every or config.eval_every_steps)
    own_loss = given.loss_fn is None
    return replace(given, model=given.model if given.model is not None else built.model,
                   train_set=given.train_set if given.train_set is not None else built.train_set,
                   eval_set=built.eval_set if given.train_set is None and given.eval_set is None else given.eval_set,
                   loss_fn=built.loss_fn if own_loss else given.loss_fn,
                   metrics=built.metrics if given.metrics is None and own_loss else given.metrics,
                   settings=plugin.to_dict())
