"""ddp_abci: multi-node PyTorch training with plain DistributedDataParallel, launched by mpirun.

The embedding API, one function per step (each in the module named for its concern):

    from ddp_abci import discover_launch, distributed, build_model, wrap_model, build_loader
    launch = discover_launch()                      # parallel/launch.py: rank, sizes, rendezvous
    with distributed(launch) as device:           # parallel/process_group.py: NCCL or gloo, torn down on exit
        model = wrap_model(build_model(seed=0), device, launch.world_size)   # model.py (the seed's: autoencoder.py)
        loader = build_loader(LinspaceDataset(), launch, global_batch=50)      # data.py
        precision = resolve_precision("auto", device)                          # precision.py

Names are imported lazily so that `import ddp_abci` stays cheap (no torch until used).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Launch": "parallel.launch", "LaunchOptions": "parallel.launch", "discover_launch": "parallel.launch",
    "open_process_group": "parallel.process_group", "close_process_group": "parallel.process_group",
    "distributed": "parallel.process_group", "choose_device": "parallel.process_group",
    "LinspaceDataset": "autoencoder", "build_loader": "data", "per_rank_batch": "data",
    "SimpleModule": "autoencoder", "build_model": "autoencoder", "wrap_model": "model", "unwrap": "model",
    "rmse_loss": "autoencoder",
    "resolve_precision": "precision", "autocast": "precision", "make_scaler": "precision",
    "save_atomic": "checkpointing.checkpoint", "load_checkpoint": "checkpointing.checkpoint",
    "TrainConfig": "config", "AutoencoderJob": "autoencoder_job", "SeedJob": "autoencoder_job", "Trainer": "trainer",
    "UsageError": "errors", "fit": "fitting",
    "RunError": "errors", "parse_command_line": "cli", "ShardedFiles": "sharded_files",
    "Environment": "environments", "ENVIRONMENTS": "environments", "rank_variables": "environments",
    "launched_rank": "environments", "launched_world_size": "environments", "AlreadySplit": "stream_readers",
    "Evaluation": "fitting",
    "Diverged": "errors", "SaveFailed": "errors", "RankFailed": "errors",
    "RunPlan": "plan", "plan_run": "plan",
    "build_optimizer": "autoencoder", "autoencoder_optimizer": "autoencoder", "seed_optimizer": "autoencoder",
    "AutoencoderLoss": "autoencoder",
    "ShardBatchSampler": "data", "to_device": "data",
    "StopRequest": "parallel.signals", "EXIT_STOPPED": "exits", "EXIT_USAGE": "exits",
    "Watchdog": "parallel.watchdog", "EXIT_RANK_LOST": "exits",
    "gather": "parallel.collectives", "gather_for_metrics": "parallel.collectives", "reduce": "parallel.collectives",
    "print_main": "parallel.collectives", "print_per_node": "parallel.collectives",
    "wait_for_everyone": "parallel.collectives", "main_process_first": "parallel.collectives",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'ddp_abci' has no attribute {name!r}")
