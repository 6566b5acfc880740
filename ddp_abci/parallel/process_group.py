"""Process group: the one place where torch.distributed is opened and closed."""
from __future__ import annotations

import contextlib
import os
import socket
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist

from ..errors import UsageError
from .launch import Launch


class JoinFailed(UsageError):
    """This rank could not meet the others at the master address and port."""

    same_on_every_rank = False


class BackendFailed(UsageError):
    """The ranks met, but the communication backend (NCCL) could not start on this rank."""

    same_on_every_rank = False


def choose_device(launch: Launch) -> torch.device:
    """cuda:<local rank> when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        if launch.local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"local rank {launch.local_rank} but only {torch.cuda.device_count()} GPUs on this node; "
                "start one rank per GPU (mpirun -map-by ppr:<gpus>:node)"
            )
        return torch.device("cuda", launch.local_rank)
    return torch.device("cpu")


def cpu_threads(launch: Launch, environ: dict | os._Environ = os.environ) -> int | None:
    """Threads per rank on the CPU: the cores this rank may use, shared by the ranks of its
    node; None when OMP_NUM_THREADS is set (the user's choice wins).

    mpirun binds each rank to its own core by default, so the affinity mask, not the
    node's core count, is what a rank really has.
    """
    if environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0))
    per_rank = (os.cpu_count() or 1) // launch.local_world_size
    return max(1, min(cores, per_rank))


def open_process_group(launch: Launch, *, timeout_s: float = 120.0, backend: str | None = None) -> torch.device:
    """Join the process group and return this rank's device.

    The CUDA device is set before init: NCCL binds its communicator to the current
    device, and every rank would otherwise create a context on GPU 0.
    """
    # Before init, not after. torch.distributed.nn.functional binds `group=group.WORLD` as
    # default arguments when it is imported; imported while a group exists (torch._dynamo
    # imports it, and DDP's and torch.optim's constructors import torch._dynamo), it
    # holds 10 references to the group that nothing releases (torch 2.13, counted with
    # sys.getrefcount: 10 -> 20). destroy_process_group then never frees the group, its gloo
    # worker threads live on into interpreter shutdown, and one that drops a tensor there
    # aborts the exit with "terminate called without an active exception". Imported first,
    # its defaults are None and the count stays at 10; and it costs a fraction of importing all of
    # torch._dynamo (docs/benchmark.md, start-up).
    import torch.distributed.nn.functional  # noqa: F401, PLC0415
    device = choose_device(launch)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        threads = cpu_threads(launch)
        if threads is not None:
            torch.set_num_threads(threads)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    try:
        met_first = launch.environment is not None and launch.environment.met_first
        dist.init_process_group(
            backend,
            # Where the ranks first met rank 0 at its host (rendezvous.learn_rank0_address), that
            # store's server serves the group too, on every rank the same way (the keys' prefix).
            **({"init_method": launch.init_method} if met_first else {"store": rendezvous_store(launch, timeout_s)}),
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
        confirm_secret(launch, timeout_s)
    except dist.DistBackendError as e:  # before the generic case: it is a RuntimeError too
        raise BackendFailed(
            f"rank {launch.rank}: the {backend} backend could not start on {device} ({_first_line(e)}); the "
            "rendezvous was not the problem: check the GPU (nvidia-smi) and NCCL's report (NCCL_DEBUG=INFO)"
        ) from None
    except (RuntimeError, ValueError, OSError) as e:
        first_line = _first_line(e)
        raise JoinFailed(
            f"rank {launch.rank} could not meet the others at {launch.master_addr}:{launch.master_port} "
            f"within {timeout_s:g}s ({first_line}); check that rank 0's address is reachable "
            "(MASTER_ADDR / --interface) and that all ranks started"
        ) from None
    return device


def rendezvous_store(launch: Launch, timeout_s: float) -> dist.TCPStore:
    """Rank 0's TCPStore, listening on the address the ranks dial (launch.master_addr: the
    interface IFNAME or the rendezvous chose, 127.0.0.1 on one host) and no other: torch's own
    listens on every interface (seen: `ss -ltn` showed *:PORT). A socket bound here is handed to
    it (master_listen_fd). The other ranks' clients of it. This narrows who can connect; it does
    not stop a user of the same host or network (docs/security.md)."""
    wait = timedelta(seconds=timeout_s)
    if launch.rank != 0:
        return dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size, False, wait)
    family = socket.AF_INET6 if ":" in launch.master_addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((launch.master_addr, launch.master_port))
    listener.listen(max(128, launch.world_size))
    # detach(): the store's server owns the descriptor from here (the Python object would close it)
    return dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size, True, wait,
                         wait_for_workers=False, master_listen_fd=listener.detach())


def confirm_secret(launch: Launch, timeout_s: float) -> None:
    """Ranks that fetched the job's secret from a file (no MPI) check that it is this job's:
    rank 0 signs a value in the store, each rank checks it (an earlier job's file would not)."""
    if launch.mpi or launch.world_size == 1:
        return
    from .signing import Signer, job_secret  # noqa: PLC0415

    store, key = dist.distributed_c10d._get_default_store(), "ddp_abci/secret-check"
    try:
        signer = Signer(job_secret(launch, timeout_s), f"{launch.master_addr}:{launch.master_port}")
    except PermissionError as e:
        raise JoinFailed(str(e)) from None
    if launch.rank == 0:
        store.set(key, signer.sign(key, "rank 0's", 0))
        return
    store.wait([key], timedelta(seconds=timeout_s))
    if signer.verify(key, store.get(key)) is None:
        raise JoinFailed(f"rank {launch.rank}'s copy of the job's secret is not rank 0's (an earlier job's file, "
                         "or another home): every rank must see the same home, or DDP_ABCI_SECRETS_DIR")


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def close_process_group() -> None:
    """Leave the process group. Must run before the interpreter exits, after everything
    that holds the group (DDP) is freed: gloo joins its worker threads only when the last
    reference goes, and a worker still alive at interpreter shutdown aborts the exit with
    'terminate called without an active exception'."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(launch: Launch, *, timeout_s: float = 120.0, backend: str | None = None) -> Iterator[torch.device]:
    """`with distributed(launch) as device:` opens the process group and closes it on any exit.

    (Not named process_group: that is this module's name, and `from ddp_abci import
    process_group` would then return the module.)"""
    device = open_process_group(launch, timeout_s=timeout_s, backend=backend)
    try:
        yield device
    finally:
        close_process_group()
        secret_file = launch.environment.secret_path if launch.environment is not None else None
        if secret_file is not None:  # rank 0's file of the job's secret (no MPI): read by now, or never
            with contextlib.suppress(OSError):
                os.unlink(secret_file)
