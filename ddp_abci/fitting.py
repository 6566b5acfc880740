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
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator, Mapping

from .autoencoder_job import AutoencoderJob
from .cli import checking_ranks, report
from .config import TrainConfig
from .errors import RunError, UsageError
from .exits import EXIT_DONE, EXIT_FAILED
from .parallel.signals import StopRequest


@dataclass(frozen=True)
class Evaluation:
    """fit()'s held-out evaluation in one keyword: `evaluation=Evaluation(test_set, {"accuracy":
    correct}, on_eval=final.update)` (the same as eval_set=, metrics=, on_eval=).

    dataset: the held-out Dataset or stream; metrics: name -> fn(model, batch) giving one value
    per item (default: the seed's per-item error, else the loss alone); on_eval: gets each
    evaluation's figures on rank 0. How often: TrainConfig's eval_every."""

    dataset: Any
    metrics: Mapping[str, Callable] | None = None
    on_eval: Callable[[dict], None] | None = None


def fit(model: Any = None, train_set: Any = None, loss_fn: Callable | None = None, config: TrainConfig | None = None,
        *, evaluation: Evaluation | None = None, launch: Any = None, eval_set: Any = None, optimizer: Any = None,
        metrics: Mapping[str, Callable] | None = None, on_eval: Callable[[dict], None] | None = None,
        collate_fn: Callable | None = None, seed_job: AutoencoderJob | None = None, stop: StopRequest | None = None,
        master_addr: str | None = None, master_port: int | None = None, interface: str | None = None,
        scheduler: Callable | None = None, state: Mapping[str, Any] | None = None, environment: Any = None) -> int:
    """Train `model` on `train_set` with `loss_fn(model, batch)` on every rank the launcher
    started.

    Args:
        model: an nn.Module on the CPU, unwrapped (default: the seed's autoencoder).
        train_set: a map-style Dataset, an IterableDataset (a stream: streams.py, including
            Hugging Face datasets, WebDataset, litdata and MosaicML streams), or a DataLoader
            over either (training_set.py says what is kept of it).
        loss_fn: fn(model, batch) -> a scalar tensor, run inside autocast.
        config: TrainConfig (default: its defaults).
        evaluation: Evaluation(dataset, metrics, on_eval); or the same as eval_set=, metrics=, on_eval=.
        launch: LaunchOptions(master_addr, master_port, interface) and environment=: where the
            ranks meet (default: the launcher's); or the same as master_addr=, master_port=,
            interface=. environment: a launch environment of your own (environments/).
        optimizer: a factory params -> optimizer, given a list of the model's parameters, or an
            optimizer class called with lr=config.lr (default: the seed's Adam).
        collate_fn: makes a list of items into a batch (default: torch's default_collate).
        seed_job: the seed's job (AutoencoderJob) for what model, train_set and loss_fn leave out.
        stop: an entered StopRequest, to keep your own signal handling.
        scheduler: a factory optimizer -> LRScheduler, stepped once per optimizer step.
        state: name -> an object with state_dict()/load_state_dict() (an EMA, a counter),
            saved at every save point and restored on resume.
    Returns: the exit status: 0 done, 75 stopped by SIGTERM/SIGUSR1/Ctrl-C or --stop-after
        with a checkpoint to resume, 2 bad input (one `error:` line printed, nothing written),
        65 diverged, 69 a rank stopped answering, 74 a checkpoint could not be written
        (exits.py).
    Raises: nothing for the statuses above; an unexpected failure (a bug, CUDA out of memory)
        on one rank ends every rank with exit 1 and the traceback.
    """
    config = config or TrainConfig()
    if checking_ranks():  # submit.sh's check of a script that reads no flags through parse_command_line
        print("ddp_abci: fit() reached with DDP_ABCI_CHECK_ARGS set, its flags unchecked: not training", flush=True)
        return EXIT_DONE
    with contextlib.ExitStack() as stack:
        stop = stop or stack.enter_context(StopRequest())  # before torch loads: see train.main
        try:
            evaluation = _one_evaluation(evaluation, eval_set, metrics, on_eval)
            meeting = _one_meeting(launch, master_addr, master_port, interface, environment)
            parts = dict(model=model, train_set=train_set, eval_set=evaluation.dataset, loss_fn=loss_fn,
                         optimizer=optimizer, metrics=evaluation.metrics, on_eval=evaluation.on_eval,
                         collate_fn=collate_fn, seed_job=seed_job, scheduler=scheduler, state=state)
            return _train(config, stop, dict(meeting, timeout_s=config.timeout_s), parts)
        except RunError as e:  # bad input (2), diverged (65), a failed save (74): one line each
            return report(e)


def _one_evaluation(evaluation: Evaluation | None, eval_set: Any, metrics: Any, on_eval: Any) -> Evaluation:
    if evaluation is None:
        return Evaluation(eval_set, metrics, on_eval)
    if any(v is not None for v in (eval_set, metrics, on_eval)):
        raise UsageError("fit() got evaluation= and eval_set=/metrics=/on_eval= too: give them in one of the two")
    return evaluation


def _one_meeting(launch: Any, master_addr: str | None, master_port: int | None, interface: str | None,
                 environment: Any) -> dict:
    """discover_launch()'s keywords, from launch=LaunchOptions(...) or the separate ones."""
    separate = dict(master_addr=master_addr, master_port=master_port, interface=interface)
    if launch is None:
        return dict(separate, environment=environment)
    if any(v is not None for v in separate.values()):
        raise UsageError("fit() got launch= and master_addr=/master_port=/interface= too: give them in one of the two")
    given = dict(launch) if isinstance(launch, Mapping) else {f.name: getattr(launch, f.name) for f in fields(launch)}
    return dict(given, environment=environment if environment is not None else given.get("environment"))


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


def _train(config: TrainConfig, stop: StopRequest, meeting: dict, parts: dict) -> int:
    """Discover, plan what can be planned alone, open the group, train, close: in that order."""
    # Imported here so that `--help` and bad flags answer without loading torch.
    with collector_paused():
        import torch._dynamo  # noqa: F401  DDP's and torch.optim's constructors load it anyway
        import torch.distributed as dist

        from .autoencoder_job import complete
        from .parallel.launch import discover_launch
        from .parallel.phases import peer_lost
        from .parallel.process_group import choose_device, distributed
        from .parallel.watchdog import end_job
        from .plan import plan_run
        from .trainer import Trainer

    if dist.is_available() and dist.is_initialized():
        raise UsageError("fit() opens and closes its own process group, and one is open already: call "
                         "Trainer(config, launch, device, ...) inside your own group instead, or destroy yours first")
    startup = {"process_unix": stop.created_unix, "imports_unix": time.time()}
    launch = discover_launch(**meeting)  # MPI_Init happens here, under mpirun
    startup["launch_unix"] = time.time()
    job = complete(parts.pop("model"), parts.pop("train_set"), parts.pop("eval_set"), parts.pop("loss_fn"),
                   parts.pop("seed_job"), config)
    # Every choice checked before the group opens, each made once: the Trainer is built from it.
    plan = plan_run(config, launch, choose_device(launch), job.train_set, parts["collate_fn"])
    with distributed(launch, timeout_s=config.timeout_s) as device:
        startup["group_unix"] = time.time()  # the run's first line comes once its gradient path is known (assembly.py)
        try:
            # The Trainer holds DDP, which holds the group: `with` frees it before the group closes.
            with Trainer(config, launch, device, job=job, plan=plan, startup=startup, stop=stop, **parts) as trainer:
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
            end_job(launch, EXIT_FAILED)
    return EXIT_FAILED  # not reached: end_job does not return
