"""The whole job in one call, its life cycle in one place: discover the launch, plan and
check, open the process group, train, close.

    from ddp_abci import fit
    sys.exit(fit(model, train_set, loss_fn, TrainConfig(epochs=3), eval_set=test_set))

The command line (`python -m ddp_abci.train`) is this same call with the seed's job.
(Not named fit.py: importing a submodule sets it as the package's attribute, and
`ddp_abci.fit` would then be this module, not the function.)
"""
from __future__ import annotations

import contextlib
import gc
import socket
import sys
import time
import traceback
from typing import Any, Callable, Iterator, Mapping

from .cli import report
from .config import TrainConfig
from .errors import RunError, UsageError
from .parallel.signals import StopRequest
from .seed_job import SeedJob


def fit(model: Any = None, train_set: Any = None, loss_fn: Callable | None = None, config: TrainConfig | None = None,
        *, eval_set: Any = None, optimizer: Any = None, metrics: Mapping[str, Callable] | None = None,
        on_eval: Callable[[dict], None] | None = None, collate_fn: Callable | None = None,
        seed_job: SeedJob | None = None, stop: StopRequest | None = None, master_addr: str | None = None,
        master_port: int | None = None, interface: str | None = None, scheduler: Callable | None = None,
        state: Mapping[str, Any] | None = None, environment: Any = None) -> int:
    """Train `model` on `train_set` with `loss_fn(model, batch)` on every rank the launcher
    started; returns the exit status: 0 done, 75 stopped by SIGTERM/SIGUSR1/Ctrl-C with a
    checkpoint to resume, 2 bad input (one line printed, nothing written), 65 diverged,
    69 a rank stopped answering and 74 a checkpoint that could not be written: errors.py.

    What is left out of model, train_set and loss_fn is the seed's job (`seed_job`,
    default SeedJob(): its autoencoder, LinspaceDataset, RMSE). `optimizer`: a factory
    params -> optimizer, given a list of the model's parameters, or an optimizer class,
    called with lr=config.lr (default: the seed's Adam from config.lr and config.betas).
    `metrics` maps names to per-item functions evaluated on `eval_set`; `on_eval` gets the
    evaluation's figures on rank 0; `collate_fn` makes a list of items into a batch
    (default: torch's default_collate). `scheduler`: a factory optimizer -> LRScheduler,
    stepped once per optimizer step, saved and restored with the checkpoint. `state`: name ->
    an object with state_dict()/load_state_dict() (an EMA, a counter), saved at every save
    point and restored on resume. `environment`: a launch environment of your own
    (environments/), instead of the one detected. Pass an entered `stop` to keep your own
    signal handling. `train_set` may be an IterableDataset (streams.py).
    """
    config = config or TrainConfig()
    with contextlib.ExitStack() as stack:
        stop = stop or stack.enter_context(StopRequest())  # before torch loads: see train.main
        parts = dict(model=model, train_set=train_set, eval_set=eval_set, loss_fn=loss_fn, optimizer=optimizer,
                     metrics=metrics, on_eval=on_eval, collate_fn=collate_fn, seed_job=seed_job, scheduler=scheduler,
                     state=state)
        meeting = dict(master_addr=master_addr, master_port=master_port, interface=interface, environment=environment,
                       timeout_s=config.timeout_s)
        try:
            return _train(config, stop, meeting, parts)
        except RunError as e:  # bad input (2), diverged (65), a failed save (74): one line each
            return report(e)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off (then back as it was) while torch loads.
    Importing torch and torch._dynamo creates hundreds of thousands of objects that live
    as long as the process and almost no garbage, and the collections they set off are
    pure cost (measured: docs/benchmark.md, start-up)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _train(config: TrainConfig, stop: StopRequest, launch_options: dict, parts: dict) -> int:
    """Discover, check what can be checked alone, open the group, train, close: in that order."""
    # Imported here so that `--help` and bad flags answer without loading torch.
    with collector_paused():
        import torch._dynamo  # noqa: F401  DDP's and torch.optim's constructors load it anyway
        import torch.distributed as dist

        from .parallel.launch import discover_launch
        from .parallel.process_group import choose_device, distributed
        from .parallel.watchdog import end_job, peer_lost
        from .plan import plan_run
        from .trainer import Trainer

    if dist.is_available() and dist.is_initialized():
        raise UsageError("fit() opens and closes its own process group, and one is open already: call "
                         "Trainer(config, launch, device, ...) inside your own group instead, or destroy yours first")
    startup = {"process_unix": stop.created_unix, "imports_unix": time.time()}
    launch = discover_launch(**launch_options)  # MPI_Init happens here, under mpirun
    startup["launch_unix"] = time.time()
    plan = plan_run(config, launch, choose_device(launch))  # every choice checked before the group opens
    with distributed(launch, timeout_s=config.timeout_s) as device:
        startup["group_unix"] = time.time()  # the run's first line comes once its gradient path is known (assembly.py)
        try:
            # The Trainer holds DDP, which holds the group: `with` frees it before the group closes.
            with Trainer(config, launch, device, plan=plan, startup=startup, stop=stop, **parts) as trainer:
                return trainer.run()
        except RunError as e:
            if e.same_on_every_rank or launch.world_size == 1:
                raise
            # One rank's own failure, said by it: the others would wait for it in their next
            # collective (for ever under MPI), so it ends the job now, not after --timeout.
            end_job(launch, report(e))
        except Exception as e:
            if launch.world_size == 1:
                raise
            if peer_lost(e):  # another rank ended the job: its launcher ends this one in a moment
                time.sleep(10)
            print(f"error: rank {launch.rank} (host {socket.gethostname()}) failed; the job ends (exit 1):",
                  file=sys.stderr, flush=True)
            traceback.print_exc()
            end_job(launch, 1)
    return 1  # not reached: end_job does not return
