"""ddp_abci: multi-node PyTorch training with plain DistributedDataParallel, launched by mpirun.

The embedding API, one function per step (each in the module named for its concern):

    from ddp_abci import discover_launch, distributed, build_model, wrap_model, build_loader
    launch = discover_launch()                      # dist/launch.py: rank, sizes, rendezvous
    with distributed(launch) as device:           # dist/process_group.py: NCCL or gloo, torn down on exit
        model = wrap_model(build_model(seed=0), device, launch.world_size)   # model.py
        loader = build_loader(LinspaceDataset(), launch, global_batch=50)      # data.py
        precision = resolve_precision("auto", device)                          # precision.py

Names are imported lazily so that `import ddp_abci` stays cheap (no torch until used).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Launch": "dist.launch", "LaunchOptions": "dist.launch", "discover_launch": "dist.launch",
    "open_process_group": "dist.process_group", "close_process_group": "dist.process_group",
    "distributed": "dist.process_group", "choose_device": "dist.process_group",
    "LinspaceDataset": "data", "build_loader": "data", "per_rank_batch": "data",
    "SimpleModule": "model", "build_model": "model", "wrap_model": "model", "unwrap": "model",
    "rmse_loss": "model",
    "resolve_precision": "precision", "autocast": "precision", "make_scaler": "precision",
    "save_atomic": "checkpoint", "load_checkpoint": "checkpoint",
    "TrainConfig": "config", "SeedJob": "seed_job", "Trainer": "trainer", "UsageError": "errors", "fit": "lifecycle",
    "RunError": "errors", "Diverged": "errors", "SaveFailed": "errors", "RankFailed": "errors",
    "RunPlan": "plan", "plan_run": "plan",
    "build_optimizer": "model", "seed_optimizer": "model", "AutoencoderLoss": "model",
    "ShardBatchSampler": "data", "to_device": "data", "StopRequest": "dist.signals", "EXIT_STOPPED": "dist.signals",
    "Watchdog": "dist.watchdog", "EXIT_RANK_LOST": "dist.watchdog",
    "gather": "dist.collectives", "gather_for_metrics": "dist.collectives", "reduce": "dist.collectives",
    "print_main": "dist.collectives", "print_per_node": "dist.collectives",
    "wait_for_everyone": "dist.collectives", "main_process_first": "dist.collectives",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'ddp_abci' has no attribute {name!r}")
