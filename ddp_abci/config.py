"""Training configuration: one frozen dataclass, built by the command line or by your code.

Each field carries its flag, help and valid range (options.option): the command line and
the checks are made from them. The seed's own job (its model's size, its data, its loss)
is not here but in autoencoder_job.AutoencoderJob: these fields mean the same for any model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UsageError
from .options import check_fields, option, setting

# The choices live here, where the command line checks them before torch loads;
# precision.py, schedule.py and parallel/mpi_hook.py check theirs from here.
AMP_CHOICES = ("auto", "no", "fp16", "bf16")
COMM_CHOICES = ("auto", "mpi", "gloo", "nccl")
COMPRESSION_CHOICES = ("none", "fp16", "bf16", "powersgd")
SCHEDULE_CHOICES = ("constant", "cosine")
SPLIT_CHOICES = ("strided", "contiguous")
TRACKER_CHOICES = ("tensorboard", "wandb", "mlflow")
# A stop signal is acted on at the next check: at most this many steps, i.e. seconds even
# for steps of a few milliseconds, inside the few seconds mpirun and the schedulers allow.
MAX_STOP_CHECK_EVERY = 1000


@dataclass(frozen=True)
class TrainConfig:
    """How a run trains, for any model: every field is a flag of `python -m ddp_abci.train`
    (its help below) and a keyword of TrainConfig(...). Frozen; checked when made.
    Raises: UsageError (one line naming the field and the fix) for a value out of range or two
    fields that cannot go together."""

    epochs: int = option(200, "passes over the training set (the seed's 200)", low=1)
    global_batch: int = option(50, "global batch, split over the ranks (the seed's split_batches=True intent)",
                               flag="--bs", low=1)
    lr: float = option(1e-4, "learning rate; on --resume this run's value wins", low=0)
    betas: tuple[float, float] = option((0.0, 0.99), "Adam's betas (the seed's 0 0.99); on --resume this run's win",
                                        low=0, high=0.999999, metavar=("B1", "B2"))
    amp: str = option("auto", "auto (bf16 on GPUs of compute capability 8.0 and up, A100/H100/H200; fp16 with loss "
                              "scaling below, V100; fp32 on the CPU), no, fp16 (the seed's, with GradScaler) or bf16",
                      choices=AMP_CHOICES)
    seed: int = option(0, "seeds the model's build, the shuffle and every rank (seed + rank)", low=0, high=2**63 - 1)
    workers: int = option(0, "DataLoader workers per rank (0: the main process, fastest on 2 cores: "
                             "docs/benchmark.md)", low=0, high=1024)
    pin_memory: bool | None = option(None, "pinned host memory for the batches (default: with CUDA only)",
                                     negatable=True)
    persistent_workers: bool = option(True, "keep DataLoader workers between epochs", negatable=True)
    batched_fetch: bool = option(True, "make each batch with one call when the dataset answers a list of indices "
                                       "(batched_getitem, as LinspaceDataset); --no-batched-fetch: item by item and "
                                       "collate, as DataLoader does", negatable=True)
    direct_loader: bool = option(True, "without workers or pinned memory, read the sampler and dataset directly; "
                                       "--no-direct-loader: through DataLoader's own iterator", negatable=True)
    drop_last: bool = option(False, "drop each epoch's last global batch when it is smaller than --bs "
                                    "(a BatchNorm model cannot train on one item)")
    max_steps: int = option(0, "stop after N optimizer steps in all, resumed ones included; 0: no limit", low=0)
    ckpt_dir: str | None = option(None, "write DIR/last.pt after every epoch, at every save point of "
                                        "--save-every-steps/--save-every-minutes, at a stop and at the end", path=True,
                                  metavar="DIR")
    save_every_steps: int = option(0, "also save every N optimizer steps, mid-epoch too; 0: off", low=0,
                                   high=2**62, metavar="N")
    save_every_minutes: float | str = option(0.0, "also save every M minutes of wall-clock (rank 0's clock, agreed "
                                                  "by every rank at the stop agreement); auto: the interval that "
                                                  "loses least to failures, sqrt(2 x save stall x --mtbf-hours) "
                                                  "(Young 1974); 0: off", low=0, high=7 * 24 * 60, metavar="M",
                                             words=("auto",))
    mtbf_hours: float = option(24.0, "the job's mean time between failures, for --save-every-minutes auto",
                               low=1e-3, high=1e6, metavar="HOURS")
    keep: int = option(2, "checkpoints kept: last.pt, and the ones before as prev.pt, prev2.pt, ...; a resume takes "
                          "the newest that loads", low=1, high=1000, metavar="K")
    async_save: bool = option(True, "write checkpoints in the background while training goes on (the loop stalls "
                                    "only to copy the state); --no-async-save: every rank waits for the write",
                              negatable=True)
    resume: bool = option(False, "continue from --ckpt-dir's last.pt (a fresh start when there is none)")
    timeout_s: float = option(120.0, "seconds before a hung rendezvous or collective ends the job (exit 69), "
                                     "naming the rank that stopped answering: MPI and gloo by the watchdog, NCCL by "
                                     "torch's own (docs/reliability.md)", flag="--timeout", low=1e-3, high=7 * 86400)
    log_every_s: float = option(10.0, "seconds between progress lines inside an epoch (rank 0)", flag="--log-every",
                                low=1e-3)
    stop_check_every: int = option(8, f"steps between the ranks' agreement on a stop signal and divergence (at most "
                                      f"{MAX_STOP_CHECK_EVERY}; also at every epoch's end)", low=1,
                                   high=MAX_STOP_CHECK_EVERY)
    stop_after_s: float = option(0.0, "stop, save and exit 75 early enough that the save ends within SECONDS of the "
                                      "start; 0: never", flag="--stop-after", low=0, metavar="SECONDS")
    stop_at: float = option(0.0, "the --stop-after deadline as a wall-clock time (seconds since 1970, UTC): the job "
                                 "scripts pass the job's own end less its margin, so what runs before the trainer (the "
                                 "doctor, mpirun starting the ranks) comes out of the job's time; 0: never",
                            flag="--stop-at", low=0, metavar="UNIX_TIME")
    max_skipped_steps: int = option(50, "fp16: this many GradScaler-skipped steps in a row end the run as "
                                        "diverged (exit 65); 0: never", low=0)
    summary_json: str | None = option(None, "rank 0 writes the run's figures here (the benchmark reads them)",
                                      path=True)
    comm: str = option("auto", "gradient all-reduce: auto (NCCL on GPUs; on the CPU under mpirun MPI, or gloo where "
                               "it all-reduces the model's gradient clearly faster, measured at the start; else "
                               "gloo), mpi, gloo or nccl", choices=COMM_CHOICES)
    grad_compression: str = option("none", "send fewer bytes in the gradient all-reduce, through torch's DDP "
                                           "communication hooks (Accelerate's comm_hook): fp16 or bf16 (half the "
                                           "bytes), powersgd (a low-rank approximation with error feedback, its state "
                                           "saved in the checkpoint); on gloo or NCCL, not --comm mpi",
                                   choices=COMPRESSION_CHOICES)
    powersgd_rank: int = option(1, "PowerSGD's matrix approximation rank (higher: closer to the full gradient, more "
                                   "bytes)", low=1, high=1024)
    powersgd_warmup_steps: int = option(1000, "steps of plain all-reduce before PowerSGD starts (torch's "
                                              "start_powerSGD_iter; at least 2)", low=2)
    find_unused_parameters: bool = option(False, "let DDP skip parameters that get no gradient in a step (a layer "
                                                 "used on some steps or ranks only); costs a graph walk a step")
    sync_batchnorm: bool = option(False, "BatchNorm statistics over all ranks' batches (SyncBatchNorm, GPUs only); "
                                         "without it rank 0's statistics are shared before each evaluation and save")
    zero: bool = option(False, "shard the optimizer's state over the ranks (ZeRO stage 1: torch's "
                               "ZeroRedundancyOptimizer, as Accelerate's DeepSpeed zero_stage=1): Adam's 8 bytes a "
                               "parameter divided by the ranks, the parameters broadcast once more a step; checkpoints "
                               "stay whole and resume at any world size, with or without it")
    accum: int = option(1, "micro-batches per optimizer step (DDP's no_sync on all but the last)", low=1,
                        high=2**31 - 1)
    clip_norm: float = option(0.0, "clip the gradient norm to this (unscaled first under fp16); 0: no clipping",
                              low=0)
    eval_every: int = option(0, "evaluate the held-out set every E epochs (the seed's job holds out the last 10%% of "
                                "its items); 0: never", low=0)
    eval_every_steps: int = option(0, "evaluate the held-out set every N optimizer steps, mid-epoch too (a run of "
                                      "steps rather than epochs, a language model's), before any save at that step, "
                                      "so a resume neither repeats nor skips one; 0: by --eval-every's epochs",
                                   low=0, metavar="N")
    warmup_steps: int = option(0, "linear learning-rate warm-up over this many optimizer steps", low=0)
    schedule: str = option("constant", "after the warm-up: constant, or cosine to zero at the schedule's last step",
                           choices=SCHEDULE_CHOICES)
    schedule_steps: int = option(0, "the schedule's length in optimizer steps (cosine reaches zero there); 0: the "
                                    "run's own (--max-steps, else --epochs), fixed by its first job and kept by every "
                                    "resume; given on a resume it re-plans the curve, said in the resume line",
                                 low=0, metavar="N")
    metrics_jsonl: str | None = option(None, "rank 0 appends one JSON line per optimizer step", path=True)
    tensorboard: str | None = option(None, "rank 0 writes TensorBoard events to DIR "
                                           "(pip install 'ddp_abci[tensorboard]')", path=True, metavar="DIR")
    track: str = option("", "trackers rank 0 writes to, comma-separated: tensorboard, wandb, mlflow (Accelerate's "
                            "log_with); the config once, training and evaluation figures, one tracker run across a "
                            "chain's jobs (its id kept in --ckpt-dir); each needs its package (pip install "
                            "'ddp_abci[trackers]')", metavar="NAMES")
    track_dir: str | None = option(None, "where the trackers write (TensorBoard's events, W&B's offline runs, "
                                         "MLflow's file store): default DIR/tracking of --ckpt-dir, else ./tracking",
                                   path=True, metavar="DIR")
    project: str = option("ddp_abci", "the trackers' project: W&B's project, MLflow's experiment")
    tokens_per_item: int = option(0, "tokens an item holds (a language model's block size): progress lines, metrics, "
                                     "summary and status then show tokens/s (and MFU); 0: not counted", low=0)
    flops_per_token: float | str = option(0.0, "model FLOPs a token costs, forward and backward, for MFU; auto: 6 x "
                                               "the parameters (nanoGPT's estimate without its attention term); 0: no "
                                               "MFU", low=0, words=("auto",))
    peak_tflops: float = option(0.0, "one device's peak TFLOPS for MFU (default: the table for H200, H100, A100 and "
                                     "V100 in docs/watching.md; other devices: MFU unknown)", low=0)
    compile: bool = option(False, "torch.compile the DDP-wrapped model, as Accelerate's prepare() does (Dynamo's "
                                  "DDPOptimizer then keeps the all-reduce overlapping backward)")
    split: str = option("strided", "how each global batch is shared out: strided (DistributedSampler's every W-th "
                                   "item) or contiguous (a slice each, as Accelerate's split_batches)",
                        choices=SPLIT_CHOICES)
    fused_adam: bool = option(True, "the default optimizer's fused kernel (faster); --no-fused-adam: torch's "
                                    "per-tensor loop, as the seed and Accelerate", negatable=True)
    save_model: str | None = option(None, "rank 0 writes the trained model's state_dict here at the end", path=True)
    straggler_threshold: float = option(0.75, "name a rank whose step compute is slower than this fraction of the "
                                              "fastest rank's (a score below it: docs/watching.md); 0: off",
                                        low=0, high=1)

    def __post_init__(self) -> None:
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise UsageError(f"{setting(TrainConfig, 'betas')} must be two numbers, got {self.betas!r}")
        check_fields(self)
        if self.lr == 0:
            raise UsageError(f"{setting(TrainConfig, 'lr')} must be positive, got 0")
        if isinstance(self.save_every_minutes, str) and self.save_every_minutes != "auto":
            raise UsageError(f"{setting(TrainConfig, 'save_every_minutes')} takes minutes or auto, "
                             f"got {self.save_every_minutes!r}")
        if isinstance(self.flops_per_token, str) and self.flops_per_token != "auto":
            raise UsageError(f"{setting(TrainConfig, 'flops_per_token')} takes a number or auto, "
                             f"got {self.flops_per_token!r}")
        unknown = [t for t in self.trackers if t not in TRACKER_CHOICES]
        if unknown:
            raise UsageError(f"{setting(TrainConfig, 'track')} names {unknown[0]!r}: the trackers are "
                             f"{', '.join(TRACKER_CHOICES)}")
        if self.resume and not self.ckpt_dir:
            raise UsageError(f"{setting(TrainConfig, 'resume')} needs {setting(TrainConfig, 'ckpt_dir')}, "
                             "the folder holding last.pt")

    @property
    def trackers(self) -> tuple[str, ...]:
        """--track's names, each once, in order."""
        return tuple(dict.fromkeys(t.strip() for t in self.track.split(",") if t.strip()))

    def to_dict(self) -> dict:
        """Plain types only, so the checkpoint still loads with weights_only=True."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def name(field: str) -> str:
    """A TrainConfig field as messages name it: 'global_batch (--bs)'."""
    return setting(TrainConfig, field)


def turn_on(field: str) -> str:
    """A switch as messages name it: 'drop_last=True (--drop-last)'."""
    return name(field).replace(" (", "=True (", 1)
