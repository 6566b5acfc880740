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
from .parts import Parts, Plugin, complete


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
        *, evaluation: Evaluation | None = None, launch: Any = None, optimizer: Any = None,
        scheduler: Callable | None = None, state: Mapping[str, Any] | None = None, collate_fn: Callable | None = None,
        seed_job: Plugin | None = None, stop: StopRequest | None = None, environment: Any = None,
        count_tokens: Callable[[Any], int] | None = None, **earlier: Any) -> int:
    """Train `model` on `train_set` with `loss_fn(model, batch)` on every rank the launcher
    started.

    Args:
        model: an nn.Module on the CPU, unwrapped (default: the seed's autoencoder).
        train_set: a map-style Dataset, an IterableDataset (a stream: streams.py, including
            Hugging Face datasets, WebDataset, litdata and MosaicML streams), or a DataLoader
            over either (training_set.py says what is kept of it).
        loss_fn: fn(model, batch) -> a scalar tensor, run inside autocast.
        config: TrainConfig (default: its defaults).
        evaluation: Evaluation(dataset, metrics, on_eval): the held-out set, its figures, and
            what gets them on rank 0.
        launch: LaunchOptions(master_addr, master_port, interface), or a mapping of those (what
            parse_command_line returns): where the ranks meet (default: the launcher's).
        optimizer: a factory params -> optimizer, given a list of the model's parameters, or an
            optimizer class called with lr=config.lr (default: Adam from config.lr and betas).
        scheduler: a factory optimizer -> LRScheduler, stepped once per optimizer step.
        state: name -> an object with state_dict()/load_state_dict() (an EMA, a counter),
            saved at every save point and restored on resume.
        collate_fn: makes a list of items into a batch (default: torch's default_collate).
        seed_job: a plug-in (parts.Plugin) for what model, train_set and loss_fn leave out
            (default: the seed's AutoencoderJob).
        stop: an entered StopRequest, to keep your own signal handling.
        environment: a launch environment of your own (environments/), used instead of the detected one.
        count_tokens: fn(batch) -> the tokens in one of this rank's batches (its padding left out):
            tokens/s and MFU from what the batches hold (or config.tokens_per_item, a fixed number).
        earlier: the earlier spellings, still taken: eval_set=, metrics=, on_eval= (Evaluation's
            fields) and master_addr=, master_port=, interface= (LaunchOptions').
    Returns: the exit status (exits.MEANINGS): 0 done, 75 stopped with a checkpoint to resume,
        2 bad input (one `error:` line printed, nothing written), 65 diverged, 69 a rank stopped
        answering, 74 a checkpoint could not be written.
    Raises: TypeError for a keyword fit() does not take; nothing for the statuses above; an
        unexpected failure (a bug, CUDA out of memory) on one rank ends every rank with exit 1
        and the traceback.
    """
    unknown = set(earlier) - {"eval_set", "metrics", "on_eval", "master_addr", "master_port", "interface"}
    if unknown:
        raise TypeError(f"fit() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    config = config or TrainConfig()
    if checking_ranks():  # submit.sh's check of a script that reads no flags through parse_command_line
        print("ddp_abci: fit() reached with DDP_ABCI_CHECK_ARGS set, its flags unchecked: not training", flush=True)
        return EXIT_DONE
    with contextlib.ExitStack() as stack:
        stop = stop or stack.enter_context(StopRequest())  # before torch loads: see train.main
        try:
            evaluation = _one_evaluation(evaluation, earlier)
            meeting = _one_meeting(launch, earlier, environment)
            parts = Parts(model, train_set, loss_fn, eval_set=evaluation.dataset, metrics=evaluation.metrics,
                          optimizer=optimizer, scheduler=scheduler, state=state, collate_fn=collate_fn,
                          on_eval=evaluation.on_eval, count_tokens=count_tokens)
            return _train(config, stop, dict(meeting, timeout_s=config.timeout_s), parts, seed_job)
        except RunError as e:  # bad input (2), diverged (65), a failed save (74): one line each
            return report(e)


def _one_evaluation(evaluation: Evaluation | None, earlier: Mapping[str, Any]) -> Evaluation:
    fields_given = {k: earlier[k] for k in ("eval_set", "metrics", "on_eval") if earlier.get(k) is not None}
    if evaluation is None:
        return Evaluation(fields_given.get("eval_set"), fields_given.get("metrics"), fields_given.get("on_eval"))
    if fields_given:
        raise UsageError("fit() got evaluation= and eval_set=/metrics=/on_eval= too: give them in one of the two")
    return evaluation


def _one_meeting(launch: Any, earlier: Mapping[str, Any], environment: Any) -> dict:
    """discover_launch()'s keywords, from launch=LaunchOptions(...) (or a mapping) or the separate ones."""
    separate = {k: earlier.get(k) for k in ("master_addr", "master_port", "interface")}
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


def _train(config: TrainConfig, stop: StopRequest, meeting: dict, given: Parts, seed_job: Plugin | None) -> int:
    """Discover, plan what can be planned alone, open the group, train, close: in that order."""
    # Imported here so that `--help` and bad flags answer without loading torch.
    with collector_paused():
        import torch._dynamo  # noqa: F401  DDP's and torch.optim's constructors load it anyway
        import torch.distributed as dist

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
    parts = complete(given, seed_job, config, AutoencoderJob)
    # Every choice checked before the group opens, each made once: the Trainer is built from it.
    plan = plan_run(config, launch, choose_device(launch), parts)
    with distributed(launch, timeout_s=config.timeout_s):  # on plan.device
        startup["group_unix"] = time.time()  # the run's first line comes once its gradient path is known (assembly.py)
        try:
            # The Trainer holds DDP, which holds the group: `with` frees it before the group closes.
            with Trainer.from_plan(plan, startup=startup, stop=stop) as trainer:
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
