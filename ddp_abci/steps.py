"""One optimizer step: the micro-batches it trains (Groups), the step itself (train_step), what
it gives (StepResult, summed in an EpochTally), and how a failure inside it is told.

Groups: the epoch's micro-batches, --accum at a time, on the device. A stream's groups come
with their positions, and are read ahead up to the next check step, so that the ranks can
agree, before training them, how many every rank has: a rank whose share runs out never
leaves the others waiting in DDP's all-reduce.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import time
from typing import Any, Callable, Iterator, NamedTuple

import torch

from .config import turn_on
from .data import CollateFailed, batch_len, to_device
from .errors import RankFailed, one_line
from .parallel.phases import peer_lost, timed_out
from .precision import autocast
from .preflight import UNUSED_ADVICE
from .stream_readers import reading_failure


class StepResult(NamedTuple):
    """What one optimizer step gives the loop."""

    loss: torch.Tensor         # mean of the micro-batch losses, detached
    skipped: bool              # fp16 overflow: GradScaler skipped optimizer.step
    grad_norm: float | None    # total gradient norm before clipping (with --clip-norm)
    samples: int               # items trained in this step, over all ranks
    tokens: int = 0            # tokens in them (fit(count_tokens=...): this rank's count x the ranks), 0: uncounted


class Group(NamedTuple):
    """One step's micro-batches, with a stream's position after each."""

    batches: list[Any]         # the micro-batches, on the device
    where: list[dict]          # a stream's position after each (empty for a map-style set)


class EpochTally:
    """What an epoch has trained so far on this rank (its loss sum stays on the device)."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), device=device)
        self.steps = self.samples = self.skipped = 0
        self.norms: list[float] = []
        self.started = time.perf_counter()
        self.last: StepResult | None = None

    def add(self, result: StepResult) -> None:
        self.loss_sum += result.loss
        self.steps, self.samples = self.steps + 1, self.samples + result.samples
        self.skipped += result.skipped
        if result.grad_norm is not None:
            self.norms.append(result.grad_norm)
        self.last = result


class Groups:
    """The rest of an epoch in groups of `accum` micro-batches (a shorter last group),
    with a read-ahead queue for streams (available())."""

    def __init__(self, batches: Iterator[Any], accum: int, device: torch.device, non_blocking: bool, *,
                 stream: bool, here: str, step: Callable[[], int], watchdog: Any) -> None:
        self.batches, self.accum, self.device, self.non_blocking = batches, accum, device, non_blocking
        self.stream, self.here, self.step, self.watchdog = stream, here, step, watchdog
        self.ahead: collections.deque[Group] = collections.deque()
        self.ended = False

    def available(self, wanted: int) -> int:
        """Read ahead until `wanted` groups wait or the stream ended; how many wait."""
        while len(self.ahead) < wanted and not self.ended:
            group = self._read()
            if group is None:
                self.ended = True
            else:
                self.ahead.append(group)
        return min(len(self.ahead), wanted)

    def dropped_items(self) -> int:
        """Items read ahead and never trained (the epoch ended before them)."""
        return sum(batch_len(b) for group in self.ahead for b in group.batches)

    def __iter__(self) -> Iterator[Group]:
        while True:
            group = self.ahead.popleft() if self.ahead else self._read()
            if group is None:
                return
            yield group

    def _read(self) -> Group | None:
        try:
            with self.watchdog.awaiting_data():  # a stream that yields nothing ends the job after --timeout
                items = list(itertools.islice(self.batches, self.accum))
        except CollateFailed as e:
            raise RankFailed(f"{self.here}: {e}") from None
        except Exception as e:  # the dataset's __getitem__ or __iter__, a worker
            raise RankFailed(f"{self.here}: reading a batch of step {self.step() + 1} failed ({reading_failure(e)}); "
                             "fix the dataset") from None
        if not items:
            return None
        batches, where = ([b for b, _ in items], [w for _, w in items]) if self.stream else (items, [])
        if self.device.type == "cpu":  # the batches are where the step needs them (CPU: no CUDA to come from)
            return Group(batches, where)
        return Group([to_device(b, self.device, non_blocking=self.non_blocking) for b in batches], where)


def train_step(trainer: Any, micro_batches: list[Any]) -> StepResult:
    """One optimizer step of `trainer` (a Trainer: its built parts, loss_fn, precision, watchdog)
    over the micro-batches (--accum of them; one by default): zero the gradients, each micro-
    batch's loss under autocast and its backward (DDP all-reduces in the last one's), the clip,
    the optimizer's and the schedule's step.
    Returns: the StepResult. Raises: RankFailed for this rank's own failure in loss_fn or
    backward (own_failure), or the collective's error after the watchdog's verdict."""
    built, watchdog, config = trainer.built, trainer.watchdog, trainer.config
    built.optimizer.zero_grad(set_to_none=True)
    count, loss_sum, samples, tokens, what = len(micro_batches), None, 0, 0, ""
    try:
        for i, batch in enumerate(micro_batches):
            last = i == count - 1
            with grad_sync(built.ddp, last):
                what = "loss_fn raised"
                with autocast(trainer.precision, trainer.device), watchdog.working("loss_fn"):
                    loss = trainer.loss_fn(built.model, batch)
                # / count: the accumulated gradient is that of the micro-batch losses' mean (x / 1 is
                # skipped: an op and a backward node). DDP all-reduces during the last one's backward.
                what = "the backward pass failed"
                with backward_phase(watchdog, last and trainer.launch.world_size > 1, built.gradients):
                    built.scaler.scale(loss / count if count > 1 else loss).backward()
            loss = loss.detach()
            if loss.dtype != torch.float32:  # summed in float32 whatever autocast returned
                loss = loss.float()
            loss_sum = loss if loss_sum is None else loss_sum + loss
            samples += batch_len(batch)
            if trainer.count_tokens is not None:
                tokens += int(trainer.count_tokens(batch))
    except Exception as e:
        raise own_failure(e, watchdog, trainer.here, what, trainer.step, batch, bool(config.ckpt_dir)) from None
    grad_norm = None
    if config.clip_norm:
        built.scaler.unscale_(built.optimizer)  # clip true gradients, not scaled ones
        grad_norm = torch.nn.utils.clip_grad_norm_(built.model.parameters(), config.clip_norm).item()
    skipped = optimizer_step(built.optimizer, built.scaler)
    if built.scheduler is not None and not skipped:
        built.scheduler.step()  # a step the scaler skipped did not happen for the schedule either
    return StepResult(loss_sum / count if count > 1 else loss_sum, skipped, grad_norm,
                      samples * trainer.launch.world_size, tokens * trainer.launch.world_size)


def step_failure(here: str, what: str, error: Exception, step: int, items: int, resumable: bool) -> RankFailed:
    """This rank's own failure inside a step as one line naming rank, host and the fix (fit()
    then ends every rank at once): the preflight's dry run passed, so this batch is what differs."""
    text = one_line(error)
    if "Expected to have finished reduction" in text or "find_unused_parameters" in text:
        advice = UNUSED_ADVICE
    elif "Expected more than 1 value per channel" in text:
        advice = (f"the batch held {items} item(s) on this rank (an epoch's short last batch?): set "
                  f"{turn_on('drop_last')} to drop it")
    else:
        advice = "fix loss_fn or the model for this batch" + (", then rerun with resume=True (--resume)"
                                                              if resumable else "")
    return RankFailed(f"{here}: {what} {type(error).__name__}: {text} at step {step + 1}; {advice}")


def own_failure(error: Exception, watchdog: Any, here: str, what: str, step: int, batch: Any,
                resumable: bool) -> BaseException:
    """What a failure inside a step's user code ends the run with: this rank's own
    (step_failure), unless it is a collective there (the user's, or DDP's in forward) that
    outlived --timeout or lost its peer: the watchdog's verdict, and the error raised as it is."""
    if timed_out(error) or peer_lost(error):
        watchdog.user_collective_failed(error)
        return error
    return step_failure(here, what, error, step, batch_len(batch), resumable)


def grad_sync(ddp: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """DDP's no_sync() around all but the last micro-batch: it toggles
    require_backward_grad_sync, which DDP reads in forward, so K micro-batches cost one all-reduce."""
    if last or not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return ddp.no_sync()


def backward_phase(watchdog: Any, syncing: bool, gradients: Any) -> contextlib.AbstractContextManager:
    """What the watchdog sees during backward: a path that marks its own waits (the MPI
    hook) does so; through gloo or NCCL the syncing backward holds the all-reduce, timed."""
    if syncing and not gradients.marks_its_waits:
        return watchdog.waiting("backward with the gradient all-reduce", gradients.ready_at)
    return watchdog.working("backward")


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
    """optimizer.step through the GradScaler; True when fp16 overflow skipped it."""
    if not scaler.is_enabled():
        optimizer.step()
        return False
    # GradScaler skips optimizer.step on inf/NaN gradients and then lowers the scale,
    # so a lower scale means a skipped step (Accelerate 1.16 patches optimizer.step to tell).
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() < before
