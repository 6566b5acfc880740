"""Training configuration: one frozen dataclass, built by the command line or by your code."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import UsageError

# The choices live here, where the command line checks them before torch loads;
# precision.py, schedule.py and comm_hook.py check theirs with check_choice, from here.
AMP_CHOICES = ("auto", "no", "fp16", "bf16")
COMM_CHOICES = ("auto", "mpi", "gloo", "nccl")
LOSS_CHOICES = ("rmse", "mse")
SCHEDULE_CHOICES = ("constant", "cosine")
SPLIT_CHOICES = ("strided", "contiguous")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 200                 # the seed's 200
    global_batch: int = 50            # --bs: split over the ranks (the seed's split_batches=True)
    lr: float = 1e-4
    betas: tuple[float, float] = (0.0, 0.99)
    amp: str = "auto"                 # auto: fp16 on CUDA, fp32 on the CPU
    seed: int = 0
    workers: int = 0                  # 0: fastest on 2 cores, 13.4k vs 8.8k samples/s with 4 (README Command line)
    pin_memory: bool | None = None    # None: only when training on CUDA
    persistent_workers: bool = True
    max_steps: int = 0                # optimizer steps in all, resumed ones included; 0 = no limit
    ckpt_dir: str | None = None
    resume: bool = False
    timeout_s: float = 120.0          # process-group timeout: a hung collective fails after this
    dim_in: int = 1000
    dim_hidden: int = 100
    num_items: int = 10000
    log_every_s: float = 10.0         # progress lines inside long epochs, rank 0 only
    stop_check_every: int = 8         # steps between the ranks' agreement on a stop signal
    summary_json: str | None = None   # rank 0 writes the run's figures here (the benchmark reads it)
    comm: str = "auto"                # gradient all-reduce: auto (NCCL on GPUs, MPI on CPUs under mpirun), mpi, gloo
    accum: int = 1                    # micro-batches per optimizer step (gradient accumulation)
    loss: str = "rmse"                # rmse (the seed's) or mse (a per-sample mean)
    clip_norm: float = 0.0            # clip the gradient norm to this; 0 = no clipping
    eval_every: int = 0               # evaluate the held-out split every E epochs; 0 = never
    warmup_steps: int = 0             # linear LR warm-up over this many optimizer steps
    schedule: str = "constant"        # after warm-up: constant or cosine (to zero at the last step)
    metrics_jsonl: str | None = None  # rank 0 appends one JSON line per optimizer step
    compile: bool = False             # torch.compile the model before wrapping it in DDP
    split: str = "strided"            # each global batch over the ranks: strided (DistributedSampler) or contiguous
    fused_adam: bool = True           # the default optimizer's fused kernel (off: torch's per-tensor loop)
    save_model: str | None = None     # rank 0 writes the trained (unwrapped) state_dict here at the end
    max_skipped_steps: int = 50       # fp16: this many GradScaler skips in a row count as diverged; 0 = never
    stop_after_s: float = 0.0         # stop, save and exit 75 before this many seconds since start; 0 = never
    tensorboard: str | None = None    # rank 0 writes TensorBoard events into this folder (the [tensorboard] extra)

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise UsageError(f"betas must be two numbers (--betas B1 B2), got {self.betas!r}")
        for flag, value, low, high in _ranges(self):
            _check_range(flag, value, low, high)
        if self.lr == 0:
            raise UsageError("--lr must be positive, got 0")
        for flag, value, choices in (("--amp", self.amp, AMP_CHOICES), ("--loss", self.loss, LOSS_CHOICES),
                                     ("--schedule", self.schedule, SCHEDULE_CHOICES),
                                     ("--comm", self.comm, COMM_CHOICES), ("--split", self.split, SPLIT_CHOICES)):
            check_choice(flag, value, choices)
        if self.eval_every and self.eval_items < 1:
            raise UsageError(f"--num-items {self.num_items} leaves no held-out items for --eval-every")
        if self.resume and not self.ckpt_dir:
            raise UsageError("--resume needs --ckpt-dir DIR (the folder holding last.pt)")
        for flag, path in (("--ckpt-dir", self.ckpt_dir), ("--metrics-jsonl", self.metrics_jsonl),
                           ("--summary-json", self.summary_json), ("--save-model", self.save_model),
                           ("--tensorboard", self.tensorboard)):
            if path is not None and not str(path).strip():
                raise UsageError(f"{flag} is an empty path; name a file or folder, or leave the flag out")

    @property
    def eval_items(self) -> int:
        """Held out for evaluation when --eval-every is set: the last 10% of the items, never trained on."""
        return self.num_items // 10 if self.eval_every else 0

    def to_dict(self) -> dict:
        """Plain types only, so the checkpoint still loads with weights_only=True."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    """The one check of every named choice: a UsageError listing them."""
    if value not in choices:
        raise UsageError(f"unknown {flag} {value!r}; use {flag} one of {', '.join(choices)}")


# A stop signal is acted on at the next check: at most this many steps, i.e. seconds even
# for steps of a few milliseconds, inside the few seconds mpirun and the schedulers allow.
MAX_STOP_CHECK_EVERY = 1000
INF = float("inf")


def _ranges(c: TrainConfig) -> list[tuple[str, object, float, float]]:
    """(flag, value, lowest, highest) for every number: each must be finite and in range."""
    return [("--epochs", c.epochs, 1, INF), ("--bs", c.global_batch, 1, INF), ("--lr", c.lr, 0, INF),
            ("--betas", c.betas[0], 0, 0.999999), ("--betas", c.betas[1], 0, 0.999999),
            ("--seed", c.seed, 0, 2**63 - 1), ("--workers", c.workers, 0, 1024), ("--max-steps", c.max_steps, 0, INF),
            ("--timeout", c.timeout_s, 1e-3, 7 * 86400), ("--dim-in", c.dim_in, 1, 2**31 - 1),
            ("--dim-hidden", c.dim_hidden, 1, 2**31 - 1), ("--num-items", c.num_items, 1, 2**62),
            ("--log-every", c.log_every_s, 1e-3, INF),
            ("--stop-check-every", c.stop_check_every, 1, MAX_STOP_CHECK_EVERY), ("--accum", c.accum, 1, 2**31 - 1),
            ("--clip-norm", c.clip_norm, 0, INF), ("--eval-every", c.eval_every, 0, INF),
            ("--warmup-steps", c.warmup_steps, 0, INF), ("--max-skipped-steps", c.max_skipped_steps, 0, INF),
            ("--stop-after", c.stop_after_s, 0, INF)]


def _check_range(flag: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{flag} must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or not low <= value <= high:
        bounds = f"at least {low:g}" if high == INF else f"between {low:g} and {high:g}"
        raise UsageError(f"{flag} must be finite and {bounds}, got {value!r}")
