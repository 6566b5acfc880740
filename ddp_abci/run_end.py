"""The run's last collectives, after its last step, in the order trainer.Trainer._train calls
them: every rank's weights checked alike, the summary JSON, the trained model's weights. Each
is called on every rank and skips itself by configuration, never by rank (the collective rule,
trainer.py); each takes the Trainer and reads what the run built."""
from __future__ import annotations

import contextlib
from typing import Any

from .checkpointing import checkpoint as ckpt
from .errors import SaveFailed
from .model import unwrap
from .parallel import zero
from .parallel.collectives import all_ranks, check_replicas_agree, rank0_decides
from .parallel.signals import signal_name
from .parallel.watchdog import collective
from .tracking import peak_memory_mib, run_summary
from .tracking import write_summary as write_summary_file


@collective("replica check")
def check_replicas(trainer: Any) -> None:
    """Collective: proves every rank ends with the same weights and buffers."""
    check_replicas_agree(trainer.built.model, trainer.launch)


@collective("summary gather")
def write_summary(trainer: Any, last_loss: float, stopped_by: int) -> None:
    """Collective (skipped without --summary-json): every rank's peak memory and optimizer state,
    written by rank 0 with the run's figures (the benchmark reads them)."""
    config, built = trainer.config, trainer.built
    if not config.summary_json:
        return
    peak, kind = peak_memory_mib(trainer.device)
    peaks, state_bytes = all_ranks(peak), all_ranks(zero.state_bytes(built.optimizer))
    if trainer.launch.is_main:
        write_summary_file(config.summary_json, run_summary(
            trainer.launch.world_size, config.global_batch, trainer.precision, trainer.step, last_loss, trainer.clock,
            peaks, kind, signal_name(stopped_by) if stopped_by else None, trainer.device,
            checkpoints_saved=built.checkpoints.saved, checkpoint_stall_s=built.checkpoints.stall_s,
            stragglers=built.stragglers and built.stragglers.summary(),
            gradients=built.gradients.name, gradients_measured_ms=built.gradients.measured_ms,
            optimizer_state_bytes_per_rank=state_bytes, zero=zero.is_sharded(built.optimizer),
            **built.trackers.tokens(trainer.clock.samples_per_s())))


@collective("model save")
def save_model(trainer: Any) -> None:
    """Collective (skipped without --save-model, or with work left): the trained weights alone
    (unwrapped state_dict), as accelerator.save does; rank 0 writes, all obey its verdict."""
    config = trainer.config
    if config.save_model and trainer._finished():
        with trainer.watchdog.working("writing the model") if trainer.launch.is_main else contextlib.nullcontext():
            rank0_decides(trainer.launch, lambda: ckpt.save_weights(unwrap(trainer.built.model), config.save_model),
                          SaveFailed)
