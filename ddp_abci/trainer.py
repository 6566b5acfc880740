"""The training loop: the whole DDP life cycle of one run, read top to bottom.

    Trainer(...)   everything built (assembly.py), the checkpoint's parts registered, a resume loaded
    run()          -> _train(): epochs until --epochs or --max-steps, or an agreed stop
    _run_epoch()   its steps; the ranks agree every --stop-check-every steps and at each save point
    train_step()   one optimizer step over --accum micro-batches
    then the loop's collectives, in the order a run meets them

The collective rule: a collective is a call every rank must make, in the same order, or the
ranks wait for each other for ever. The Trainer's wear @collective, are called on every rank
and skip themselves by configuration (no --ckpt-dir, no --summary-json), never by rank. An
`if launch.is_main:` around one is the classic DDP deadlock; here it ends the job within
--timeout with a line naming each rank's step and collective (parallel.watchdog).
"""
from __future__ import annotations

import gc
import math
import socket
import time
from typing import Any, Callable, Mapping

import torch

from . import run_end, run_folder
from .assembly import Assembly, assemble
from .autoencoder_job import AutoencoderJob
from .checkpointing.resume import Position
from .config import TrainConfig
from .errors import Diverged, RunError
from .evaluation import MetricFn, evaluate
from .exits import end_of_run
from .model import LossFn, OptimizerFactory, unwrap
from .parallel.collectives import broadcast_buffers, print_main
from .parallel.launch import Launch
from .parallel.signals import StopRequest
from .parallel.watchdog import Watchdog, collective
from .parts import Parts, Plugin, complete
from .plan import RunPlan, plan_run
from .steps import EpochTally, Groups, StepResult, train_step
from .stragglers import StepClock
from .tracking import Clock, epoch_line, training_line


class Trainer:
    """One run's loop, built once from its plan (plan.RunPlan: the parts, the config, the launch
    and every choice resolved), then run(). Two ways in, each total: `Trainer(config, launch,
    device, model=..., train_set=..., loss_fn=..., ...)` inside a process group you opened
    (the parts as fit() takes them, planned here), and `Trainer.from_plan(plan)`, as fit() and
    the comparison tools build it from the plan they made before the group opened.

    Args: config (TrainConfig), launch (parallel.launch.Launch), device (the rank's device);
    the parts as fit() takes them (parts.Parts' fields: model, train_set, eval_set, loss_fn,
    optimizer, metrics, on_eval, collate_fn, scheduler, state, count_tokens), what they leave out taken from
    seed_job (default: the seed's AutoencoderJob); startup: the start-up milestones; stop: the
    StopRequest that turns signals into a stop (a new one when None).
    Raises: RunError (UsageError and its kin: one line, exit 2) for a part that cannot work,
    before any training; the process group stays as it was.
    """

    def __init__(self, config: TrainConfig, launch: Launch, device: torch.device, *,
                 model: torch.nn.Module | None = None, train_set: Any = None, eval_set: Any = None,
                 loss_fn: LossFn | None = None, optimizer: OptimizerFactory | type | None = None,
                 metrics: Mapping[str, MetricFn] | None = None, on_eval: Callable[[dict], None] | None = None,
                 collate_fn: Callable | None = None, seed_job: Plugin | None = None, scheduler: Callable | None = None,
                 state: Mapping[str, Any] | None = None, count_tokens: Callable[[Any], int] | None = None,
                 startup: dict[str, float] | None = None, stop: StopRequest | None = None) -> None:
        given = Parts(model, train_set, loss_fn, eval_set=eval_set, metrics=metrics, optimizer=optimizer,
                      scheduler=scheduler, state=state, collate_fn=collate_fn, on_eval=on_eval,
                      count_tokens=count_tokens)
        self._build(plan_run(config, launch, device, complete(given, seed_job, config, AutoencoderJob)), startup, stop)

    @classmethod
    def from_plan(cls, plan: RunPlan, *, startup: dict[str, float] | None = None,
                  stop: StopRequest | None = None) -> "Trainer":
        """The Trainer of a plan made before the process group opened (fit(), the comparison tools)."""
        trainer = cls.__new__(cls)
        trainer._build(plan, startup, stop)
        return trainer

    def _build(self, plan: RunPlan, startup: dict[str, float] | None, stop: StopRequest | None) -> None:
        config, launch, parts = plan.config, plan.launch, plan.parts
        self.config, self.launch, self.device, self.plan = config, launch, plan.device, plan
        self.precision, self.per_rank_batch, self.stream = plan.precision, plan.per_rank_batch, plan.data.stream
        self.clock, self.stop, self.host = Clock(startup), stop or StopRequest(), socket.gethostname()
        self.here = f"rank {launch.rank} (host {self.host})"  # who a failure names
        self.position = Position()  # where the run is: the start, or (assembly.py) a resume's
        self.eval_set, self.on_eval, self.loss_fn = parts.eval_set, parts.on_eval, parts.loss_fn
        self.count_tokens = parts.count_tokens
        self.collate_fn, self.eval_metrics = plan.data.collate_fn, dict(parts.metrics or {})
        held_out = parts.eval_set is not None
        self.eval_every = (config.eval_every or (0 if config.eval_every_steps else 1)) if held_out else 0
        self.eval_every_steps, self.evaluated_at = config.eval_every_steps if held_out else 0, -1
        self.watchdog = Watchdog(launch, config.timeout_s, record=self._record, report_dir=config.ckpt_dir,
                                 step=lambda: self.position.step).start()
        self.tally, self.steps_left, self.save_due, self.groups = EpochTally(self.device), None, False, None
        self.step_clock = StepClock(self.watchdog)
        self.built: Assembly | None = None  # everything the loop trains with (assembly.py), kept whole
        try:
            self.built = assemble(plan, self.watchdog, self.stop, self.position, clock=self.clock,
                                  eval_metrics=self.eval_metrics if self.eval_every or self.eval_every_steps else {})
        except BaseException:
            # Free DDP now, while the group is open: dropped later with the traceback, its
            # reducer's gloo threads deadlock on the GIL (seen as a rank hung at exit).
            self.close()
            raise

    @property
    def model(self) -> torch.nn.Module | None:
        """The model the loop calls: DDP-wrapped on several ranks, compiled with --compile; None
        once run() has returned or close() was called."""
        return self.built.model if self.built is not None else None

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer the loop steps; None once run() has returned or close() was called."""
        return self.built.optimizer if self.built is not None else None

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> int:
        """Train until --epochs or --max-steps, or until a stop signal; returns the exit status
        (0 done, 75 stopped with a checkpoint) and, with --ckpt-dir, records it in DIR/status
        (rank 0; a rank's own failure: that rank). Once it has returned the Trainer holds no
        model, optimizer or DDP: the process group can close whatever holds the Trainer.
        Raises: RunError (Diverged 65, SaveFailed 74, RankFailed 2), recorded first."""
        try:
            status, line = self._train()
        except RunError as e:
            if self.launch.is_main or not e.same_on_every_rank:  # said once: by rank 0, or by the failing rank
                self._record(e.exit_status, f"error: {e}")
            raise
        self._record(status, line)
        self.close(together=True)  # a finished Trainer holds nothing of the process group, however it is held
        return status

    def _train(self) -> tuple[int, str]:
        batches = self.built.batches
        print_main(self.launch, training_line(self.config, len(batches) if batches.sized else None,
                                              self.per_rank_batch, self.precision, self.built.checkpoints.file))
        if self.built.agreement.deadline is not None:
            print_main(self.launch, self.built.agreement.deadline_line())
        stopped_by, last_loss, steps_before = 0, math.nan, self.step
        with self.watchdog.working("training"):
            while not self._finished() and not stopped_by:
                stopped_by, last_loss = self._run_epoch()
            self._finish_saves()
        self.built.trackers.close()
        run_end.check_replicas(self)
        run_end.write_summary(self, last_loss, stopped_by)
        run_end.save_model(self)
        status, line = end_of_run(stopped_by, self._finished(), self.position, steps_before, last_loss,
                                  self.built.checkpoints.file)
        print_main(self.launch, line)
        return status, line

    def _run_epoch(self) -> tuple[int, float]:
        """Train the rest of the current epoch, saving at each save point inside it; returns
        (the stop signal or 0, the epoch's mean loss over all ranks)."""
        stream, built = self.stream, self.built
        batches = built.batches.begin(self.epoch) if stream else built.batches.begin(self.epoch, self.batch_in_epoch)
        self.groups = Groups(batches, self.config.accum, self.device, self.plan.data.pin_memory, stream=stream,
                             here=self.here, step=lambda: self.step, watchdog=self.watchdog)
        self.tally, self.steps_left, stopped_by = EpochTally(self.device), None, 0
        built.trackers.epoch_started(self.step)
        self.step_clock.restart()
        if stream:
            stopped_by = self._agree()  # how many steps every rank has, before the first
        for group in self.groups if not stopped_by else ():
            result = self.train_step(group.batches)
            self._count(result, group)
            step = self.position.step
            if self.eval_every_steps and step % self.eval_every_steps == 0:
                self._evaluate()  # before any save at this step: a resume from it neither repeats nor skips it
            if built.agreement.due(step) or self._at_save_point() or built.save_points.step_due(step):
                stopped_by = self._agree()
                if stopped_by or self._at_save_point():
                    break
                if built.save_points.step_due(self.step) or self.save_due:
                    self._save()
        mean = self._epoch_report()
        if self._epoch_done():
            self.position.epoch, self.position.batch_in_epoch = self.epoch + 1, 0
        self._save()
        if self.tally.steps and self._evaluation_due():
            self._evaluate()
        return stopped_by, mean

    def _evaluation_due(self) -> bool:
        """At an epoch's end every --eval-every epochs; and at the run's end (a run that ends on
        --max-steps mid-epoch, or with --eval-every-steps), unless its last step was just evaluated."""
        if self.evaluated_at == self.step:
            return False
        if self.eval_every and self.batch_in_epoch == 0:
            return self.epoch % self.eval_every == 0
        return bool(self.eval_every or self.eval_every_steps) and self._finished()

    def _count(self, result: StepResult, group: Any) -> None:
        """A step done: the tallies, the clocks, the logs, the stream's position."""
        now, built, position = time.perf_counter(), self.built, self.position
        self.tally.add(result)
        position.advance(len(group.batches))
        self.step_clock.step_done(now)
        for where in group.where:
            built.batches.trained_one(where)
        if self.steps_left is not None:
            self.steps_left -= 1
        built.trackers.after_step(now, position.step, position.epoch, result, built.optimizer, built.scaler,
                                  self.clock, self.tally, self._where)
        built.agreement.watch(result.grad_norm, result.skipped)

    def _where(self) -> str:
        """The progress line's place (only when a line is due: len() of a loader is not free)."""
        return self.position.label(self.config.epochs, len(self.built.batches) if self.built.batches.sized else None,
                                   self.config.global_batch)

    # Where the run is (resume.Position): epochs completed, batches of this epoch, optimizer steps.
    epoch = property(lambda self: self.position.epoch)
    batch_in_epoch = property(lambda self: self.position.batch_in_epoch)
    step = property(lambda self: self.position.step)

    def _epoch_done(self) -> bool:
        return self.steps_left == 0 if self.stream else self.batch_in_epoch == len(self.built.batches)

    def _finished(self) -> bool:
        max_steps = self.config.max_steps
        return self.epoch >= self.config.epochs or (bool(max_steps) and self.step >= max_steps)

    def _at_save_point(self) -> bool:
        """An epoch's last step, or the run's last: the ranks always agree there (no diverged save)."""
        return self._epoch_done() or self._finished()

    # -- one step --------------------------------------------------------------------------

    def train_step(self, micro_batches: list[Any]) -> StepResult:
        """One optimizer step over the micro-batches (--accum of them; one by default): steps.train_step."""
        return train_step(self, micro_batches)

    # -- the loop's collectives, in the order a run meets them -----------------------------

    @collective("stop agreement")
    def _agree(self) -> int:
        """Collective: the stop signal, the deadline, a divergence, a save due by rank 0's
        clock, a stream's end and every rank's compute time, agreed in one all-reduce."""
        agreement = self.built.agreement
        window = agreement.steps_to_next_check(self.step) if self.stream and self.steps_left is None else 0
        with self.watchdog.working("reading ahead"):
            shortfall = window - self.groups.available(window) if window else 0
        since = agreement.checked_step
        verdict = agreement.agree(self.step, self.tally.loss_sum, shortfall=shortfall,
                                  save_due=self.launch.is_main and self.built.save_points.clock_due(),
                                  compute_us=self.step_clock.take_median_us())
        if verdict.diverged:
            last = self.tally.last.loss.item() if self.tally.last is not None else math.nan
            raise Diverged(agreement.describe(verdict.diverged, since, self.step, last, self.built.checkpoints.file,
                                              self.config.lr))
        if window and verdict.shortfall:
            self.steps_left = window - verdict.shortfall  # a rank's share ends there: every rank's epoch does
        self.save_due = bool(verdict.save)
        if self.built.stragglers is not None:
            for line in self.built.stragglers.observe(verdict.compute_us):
                print(line, flush=True)
        return verdict.signal

    @collective("epoch loss reduce")
    def _epoch_report(self) -> float:
        """Collective: the epoch's loss averaged over every rank's steps (not rank 0's own), logged,
        with a stream's items left untrained: those read ahead past the shortest share's end (only
        when the epoch ended: after a stop the resume trains them) and the readers' short batches."""
        tally, batches = self.tally, self.built.batches
        ahead = self.groups.dropped_items() if self.stream and self._epoch_done() else 0
        short = batches.dropped if self.stream else 0
        totals = [tally.loss_sum.item(), tally.steps, ahead, short]
        if self.launch.world_size > 1:  # through the gradients' path: MPI's all-reduce where it carries them
            totals = self.built.gradients.sum_vector(totals, self.device)
        mean = totals[0] / max(totals[1], 1)
        part = "" if self._epoch_done() or not batches.sized else f" [{self.batch_in_epoch}/{len(batches)} batches]"
        print_main(self.launch, epoch_line(f"{self.epoch + 1}/{self.config.epochs}{part}", mean, tally,
                                           int(totals[2]), int(totals[3])))
        stragglers = self.built.stragglers
        self.built.trackers.scalars(self.step, {"epoch_loss": mean, **(stragglers.tracked() if stragglers else {})})
        self.built.trackers.epoch_ended(self.step, self.epoch, self.clock.samples_per_s(), mean if totals[1] else None)
        return mean

    @collective("checkpoint save")
    def _save(self) -> None:
        """Collective (the save itself skipped without --ckpt-dir): rank 0's BatchNorm statistics
        on every rank (before each save and evaluation); then the checkpoint manager gathers,
        serialises and starts the write, and a failed earlier write stops every rank here."""
        broadcast_buffers(self.built.model)
        self.built.checkpoints.save(self.step)
        if self.built.checkpoints.enabled:
            line = self.built.save_points.saved(self.built.checkpoints.last_stall_s)
            if line:
                print_main(self.launch, line)
        self.save_due = False
        self.step_clock.restart()

    @collective("the last checkpoint write")
    def _finish_saves(self) -> None:
        """Collective: the write in flight, waited for; its failure is exit 74 on every rank."""
        self.built.checkpoints.finish()

    @collective("evaluation")
    def _evaluate(self) -> None:
        """Collective (skipped without an eval set): each rank evaluates its share, then the
        exact figures over every held-out item are combined."""
        with self.watchdog.working("evaluating its share"):
            results, count = evaluate(unwrap(self.built.model), self.eval_set, self.loss_fn, self.launch, self.device,
                                      self.precision, self.per_rank_batch, self.eval_metrics, self.collate_fn)
        figures = ", ".join(f"{metric} {value:.4f}" for metric, value in results.items())
        print_main(self.launch, f"eval after epoch {self.epoch} (step {self.step}): {figures} "
                                f"over {count} held-out items")
        self.built.trackers.evaluated(self.step, self.epoch, results)
        if self.on_eval is not None and self.launch.is_main:
            self.on_eval(dict(results, epoch=self.epoch, step=self.step))
        self.evaluated_at = self.step
        self.step_clock.restart()

    def _record(self, status: int, line: str) -> None:
        """The run's end in DIR/status, which the job scripts read."""
        if self.config.ckpt_dir:
            run_folder.write_status(self.config.ckpt_dir, status, finished=status == 0 and self._finished(),
                                    step=self.step, line=line, rank=self.launch.rank, host=self.host)

    # -- life cycle: `with Trainer(...) as trainer:` frees what holds the process group ------

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(together=exc_type is None)

    def close(self, together: bool = False) -> None:
        """Release DDP, its hooks and the optimizer, so that the process group can really be
        freed when it is closed: gloo joins its worker threads only when the last reference
        goes (see parallel/process_group.close_process_group). Safe to call twice.
        together: run() returned, on every rank (Watchdog.stop)."""
        built, self.built, self.groups = self.built, None, None
        if built is not None:
            built.trackers.close()
            built.checkpoints.writer.wait()  # a write in flight finishes: the file on disk stays whole either way
        del built
        gc.collect()  # DDP's reducer sits in reference cycles
        self.watchdog.stop(together)
