"""The paths the gradient all-reduce can take, one object each: what DDP is given (a
communication hook, or none), and how the trainer's small control all-reduce goes the same
way. plan.resolve_comm chooses the path by name, or leaves the CPU's choice between MPI and
gloo to comm_choice.measure_and_choose, once the model's size is known; the loop only asks the object.

    nccl   GPUs: DDP's own all-reduce over NCCL
    gloo   the CPU: torch's allreduce hook over gloo, timed
    mpi    the CPU under mpirun with mpi4py: each bucket through MPI (mpi_hook.py)

--grad-compression puts one of torch's compression hooks (fp16, bf16, PowerSGD: Compression)
in place of the plain all-reduce on the gloo and NCCL paths, timed as gloo's.
"""
# No `from __future__ import annotations` here: DDP checks a hook's annotations as objects.
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from .mpi_hook import mpi_max_vector, mpi_sum_vector, register_mpi_hook


class Compression:
    """--grad-compression: one of torch's DDP communication hooks that send fewer bytes, as
    Accelerate's DDPCommunicationHookType maps them (fp16_compress_hook, bf16_compress_hook,
    powerSGD_hook), and its state as a checkpoint part. PowerSGD's state is each rank's own
    (the error feedback is the rank's local residual): saved for every rank, as tensors and
    plain values (its numpy generator's state included), so that a resume continues it exactly.

    PowerSGD keys its state by DDP's gradient bucket and lays it out in the bucket's parameter
    order; DDP rebuilds its buckets once, after the first step, in the order the gradients came,
    so a resumed run's first step meets the saved state in another layout. Before each bucket
    this keeps the state in the layout of the bucket it is applied to: each parameter's slices
    (of the error, of P and of Q) moved to where the bucket has it, which changes no number."""

    HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook,
             "powersgd": powerSGD_hook.powerSGD_hook}

    def __init__(self, kind: str, rank: int = 1, warmup_steps: int = 1000) -> None:
        self.kind, self.hook = kind, self.HOOKS[kind]
        self.state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=warmup_steps,
            use_error_feedback=True, warm_start=True, random_seed=0) if kind == "powersgd" else None
        self.names: dict[int, str] = {}               # id(parameter) -> its name
        self.layouts: dict[int, tuple] = {}           # bucket index -> ((name, numel, rows, cols), ...)
        self.pieces: tuple[int, dict] | None = None   # (iteration, name -> its slices): the state split up
        # PowerSGD: a bucket's collectives wait for the bucket before's (compressed_hook).
        self.in_order = kind == "powersgd"
        self.pending: torch.futures.Future | None = None

    def name_parameters(self, model: torch.nn.Module) -> None:
        self.names = {id(p): n for n, p in model.named_parameters()}

    def before(self, bucket: dist.GradBucket) -> None:
        """The state laid out as this bucket has its parameters (PowerSGD only)."""
        if self.state is None:
            return
        index = bucket.index()
        layout = tuple((self.names[id(p)], g.numel(), *_matrix(g))
                       for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True))
        if self.layouts.get(index) != layout:
            if self.pieces is None or self.pieces[0] != self.state.iter:  # once a step: before any bucket changed it
                self.pieces = (self.state.iter, self._split())
            self._assemble(index, layout, self.pieces[1])
            # Another bucket's state for these parameters is older now (DDP's first step in a
            # process has one bucket where the rebuilt ones have two): dropped, or a later split
            # would take it for theirs.
            names = {entry[0] for entry in layout}
            for other in [i for i, known in self.layouts.items() if i != index and names & {e[0] for e in known}]:
                self._assemble(other, (), {})
                del self.layouts[other]
        self.layouts[index] = layout

    def _packed(self, layout: tuple) -> list[tuple[str, int, int]]:
        """(name, P's length, Q's length) of the compressed tensors, in PowerSGD's packing order:
        by shape, in the order shapes first come, each shape's tensors in bucket order."""
        by_shape: dict[tuple[int, int], list] = {}
        for name, _, n, m in layout:
            rank = min(n, m, self.state.matrix_approximation_rank)
            if n and powerSGD_hook._should_compress(n, m, rank, self.state.min_compression_rate)[0]:
                by_shape.setdefault((n, m), []).append((name, n * rank, m * rank))
        return [entry for entries in by_shape.values() for entry in entries]

    def _split(self) -> dict[str, dict[str, torch.Tensor]]:
        pieces: dict[str, dict[str, torch.Tensor]] = {}
        for index, layout in self.layouts.items():
            for kind, sizes in (("error", [(name, numel) for name, numel, _, _ in layout]),
                                ("p_memory", [(name, p) for name, p, _ in self._packed(layout)]),
                                ("q_memory", [(name, q) for name, _, q in self._packed(layout)])):
                flat = getattr(self.state, f"{kind}_dict").get(index)
                if flat is not None:
                    for (name, _), part in zip(sizes, flat.split([size for _, size in sizes]), strict=True):
                        pieces.setdefault(name, {})[kind] = part.clone()
        return pieces

    def _assemble(self, index: int, layout: tuple, pieces: dict) -> None:
        for kind, order in (("error", [name for name, _, _, _ in layout]),
                            ("p_memory", [name for name, _, _ in self._packed(layout)]),
                            ("q_memory", [name for name, _, _ in self._packed(layout)])):
            store = getattr(self.state, f"{kind}_dict")
            if all(kind in pieces.get(name, {}) for name in order) and order:
                store[index] = torch.cat([pieces[name][kind] for name in order])
            else:
                store.pop(index, None)  # nothing saved for it yet: PowerSGD starts it afresh

    def state_dict(self) -> dict:
        state = self.state
        if state is None:
            return {}
        kind, keys, pos, has_gauss, cached = state.rng.get_state()
        return {"iter": state.iter, "rng": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
                "layouts": {str(k): [list(entry) for entry in v] for k, v in self.layouts.items()},
                **{name: {str(k): v for k, v in getattr(state, f"{name}_dict").items()}
                   for name in ("error", "p_memory", "q_memory")}}

    def load_state_dict(self, saved: dict) -> None:
        state = self.state
        if state is None or not saved:
            return
        kind, keys, pos, has_gauss, cached = saved["rng"]
        state.rng.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        state.iter = saved["iter"]
        self.layouts = {int(k): tuple(tuple(entry) for entry in v) for k, v in saved.get("layouts", {}).items()}
        for name in ("error", "p_memory", "q_memory"):
            setattr(state, f"{name}_dict", {int(k): v for k, v in saved[name].items()})


def _matrix(gradient: torch.Tensor) -> tuple[int, int]:
    """(rows, columns) PowerSGD sees a gradient as; (0, 0) for a vector, which it never compresses."""
    return (gradient.shape[0], gradient.numel() // gradient.shape[0]) if gradient.dim() > 1 else (0, 0)


class GradientPath:
    """DDP's own all-reduce through the process group's backend (gloo or NCCL), or with
    `compression`, torch's compression hook in its place."""

    # Whether the path marks its own waits for the watchdog (the MPI hook does, per bucket);
    # otherwise the syncing backward is timed as a whole.
    marks_its_waits = False

    def __init__(self, name: str, compression: Compression | None = None) -> None:
        self.name = name if compression is None else f"{name}, {compression.kind} compressed"
        self.compression, self.last_ready = compression, 0.0
        self.measured_ms: dict[str, float] | None = None  # what --comm auto chose it on (measure_and_choose)

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        """Give DDP this path's hook (nothing: DDP's own all-reduce; or the compression's, timed)."""
        if self.compression is not None:
            self.compression.name_parameters(ddp.module)
            ddp.register_comm_hook(self, compressed_hook)

    def ready_at(self) -> float:
        """When the last gradient bucket of the latest backward was ready (0: not known)."""
        return self.last_ready

    def max_vector(self, values: list[int], device: torch.device) -> list[int]:
        """Element-wise MAX of a few ints over all ranks (the stop agreement)."""
        flags = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [int(v) for v in flags.tolist()]

    def sum_vector(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum of a few numbers over all ranks, in float64 (the epoch's report)."""
        totals = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        return totals.tolist()

    def __repr__(self) -> str:
        return f"GradientPath({self.name!r})"


def compressed_hook(path: GradientPath, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The compression's hook, its bucket's ready time noted (the straggler clock's compute ends
    there). PowerSGD issues its second and third all-reduce from its futures' callbacks, which
    gloo runs on its own threads as each finishes: with two buckets or more (any model over
    DDP's 1 MiB first bucket) the ranks then issued bucket 1's first all-reduce and bucket 0's
    later ones in different orders, and gloo aborted the job ("Received data size doesn't match
    expected size"). Each bucket therefore starts when the one before has ended, on every
    backend: issuing collectives in one order on all ranks is each backend's contract."""
    path.last_ready = time.monotonic()
    compression = path.compression
    if compression.pending is not None:
        compression.pending.wait()
    compression.before(bucket)
    future = compression.hook(compression.state, bucket)
    compression.pending = future if compression.in_order else None
    return future


class GlooGradients(GradientPath):
    """DDP's all-reduce over gloo, through torch's own allreduce hook (the same division and
    sum as DDP's built-in one), which notes when the last bucket became ready: backward's
    compute ends there, and the rest of backward is the wait for the all-reduce (the straggler
    clock counts only the compute)."""

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        ddp.register_comm_hook(self, timed_allreduce_hook)


def timed_allreduce_hook(state: GlooGradients, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.last_ready = time.monotonic()
    return default_hooks.allreduce_hook(None, bucket)


class MPIGradients(GradientPath):
    """Each gradient bucket through MPI: on the CPU, Open MPI's all-reduce through shared
    memory costs a fraction of gloo's (docs/benchmark.md)."""

    marks_its_waits = True
    report_comm: Any = None  # the epoch reports' communicator, made in register()

    def register(self, ddp: torch.nn.Module, watchdog: object = None) -> None:
        from mpi4py import MPI  # noqa: PLC0415  (only under mpirun: importing it starts MPI)

        register_mpi_hook(ddp, watchdog)
        # The reports' own communicator (Dup is collective: every rank registers at the same
        # point). On COMM_WORLD beside the agreement, a rank that skipped an agreement would pair
        # its epoch report with the other rank's agreement, and MPI would end both ranks on the
        # mismatch ("message truncated") where, apart, each waits and the watchdog names both.
        self.report_comm = MPI.COMM_WORLD.Dup()

    def max_vector(self, values: list[int], device: torch.device) -> list[int]:
        return mpi_max_vector(values)

    def sum_vector(self, values: list[float], device: torch.device) -> list[float]:
        return mpi_sum_vector(values, self.report_comm)


def gradient_path(name: str, compression: Compression | None = None) -> "GradientPath":
    """The path object for resolve_comm's choice (compressed: gloo's and NCCL's only)."""
    if compression is not None:
        return GradientPath(name, compression)
    return {"mpi": MPIGradients, "gloo": GlooGradients}.get(name, GradientPath)(name)
