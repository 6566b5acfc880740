"""Where the master address and port are chosen.

Rank 0 picks them here; under mpirun with mpi4py it broadcasts its choice over MPI
(environments/mpi.py). Everything in this module runs on rank 0's host only, but for
learn_rank0_address, which the other ranks call to learn rank 0's choice without MPI.
"""
from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct

from ..errors import UsageError, one_line

_SIOCGIFADDR = 0x8915  # Linux ioctl: IPv4 address of a named interface


class AddressUnusable(UsageError):
    """Before any rank waits: the master address or port cannot be used on rank 0's host.
    (process_group.JoinFailed is the later failure: a rank could not meet the others.)"""


def interface_address(name: str) -> str:
    """IPv4 address of network interface `name` (e.g. 'bond0' on ABCI 3.0, 'ib0')."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            known = ", ".join(n for _, n in socket.if_nameindex())
            raise AddressUnusable(
                f"interface {name!r} has no IPv4 address ({e.strerror}); name one of: {known}"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def routable_address() -> str:
    """An address of this host that other hosts can reach: never a loopback one.

    The host name is tried first because cluster DNS or /etc/hosts maps it to the
    address the scheduler uses; if it resolves to loopback (common on laptops and
    some images), the first interface with a non-loopback IPv4 address is used.
    """
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if not _is_loopback(addr):
            return addr
    except OSError:
        pass
    for _, name in sorted(socket.if_nameindex()):
        try:
            addr = interface_address(name)
        except AddressUnusable:
            continue
        if not _is_loopback(addr):
            return addr
    raise AddressUnusable(
        "no non-loopback IPv4 address found on rank 0's host; "
        "set MASTER_ADDR or pass --interface NAME"
    )


def choose_master_addr(*, spans_hosts: bool, addr: str | None = None, interface: str | None = None) -> str:
    """The rendezvous address, in order: an explicit address, an interface's address,
    a routable address when the job spans hosts, else loopback."""
    if addr:
        return addr
    if interface:
        return interface_address(interface)
    return routable_address() if spans_hosts else "127.0.0.1"


def check_bindable(addr: str, port: int) -> None:
    """Fail early, naming the fix, if rank 0 could not listen on addr:port.

    Binding is the cheapest proof that `addr` belongs to this host and that `port`
    is free; otherwise the other ranks would wait out the whole timeout first.
    """
    try:
        family, *_, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise AddressUnusable(f"master address {addr!r} does not resolve ({e.strerror}); "
                              "set MASTER_ADDR to rank 0's host") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR ignores TIME_WAIT leftovers of an earlier job but still refuses
        # a port that another process is listening on.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise AddressUnusable(
                    f"rendezvous port {port} on {addr} is already in use; "
                    "unset MASTER_PORT to let rank 0 pick a free one, or choose another"
                ) from None
            raise AddressUnusable(
                f"master address {addr} is not an address of rank 0's host {socket.gethostname()} "
                f"({e.strerror}); set MASTER_ADDR or --interface to one of its own"
            ) from None


def free_port(addr: str) -> int:
    """A port that is free on `addr` now: asked of the kernel, never a fixed number
    that two jobs sharing a node would fight over."""
    try:
        family, *_, sockaddr = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(sockaddr)
            return s.getsockname()[1]
    except OSError as e:  # socket.gaierror too: a name that does not resolve
        raise AddressUnusable(f"master address {addr} cannot be used on this host ({e.strerror or e}); "
                              "set MASTER_ADDR or --master-addr to this host's address, or use --interface") from None


RANK0_ADDRESS_KEY = "ddp_abci/rank0_address"


def learn_rank0_address(ranks, host: str, port: int, interface: str, timeout_s: float) -> tuple[str, object]:
    """Rank 0's address on `interface`, on every rank, without MPI: only rank 0 can read its
    own interface, so every rank first meets it at `host` (what the launcher or scheduler
    names; rank 0's store listens on all its addresses) and reads its answer there.

    Returns the address and, on rank 0, the store, which the caller keeps until the process
    group is open. Its server stays up and the group's store on the same port shares it
    (multi_tenant, as init_process_group's tcp:// store is): were it closed and the port bound
    again, a rank arriving between the two met the closing server and waited out the whole
    timeout (rank 0 held up 2 s there, as under load: the group's meeting failed after 30 s)."""
    from datetime import timedelta  # noqa: PLC0415

    import torch.distributed as dist  # noqa: PLC0415  (the launch's light path loads no torch)

    wait = timedelta(seconds=timeout_s)
    if ranks.rank == 0:
        addr = interface_address(interface)
        store = dist.TCPStore(host, port, ranks.world_size, True, wait, wait_for_workers=False, multi_tenant=True)
        store.set(RANK0_ADDRESS_KEY, addr)
        return addr, store
    try:
        store = dist.TCPStore(host, port, ranks.world_size, False, wait)
        addr = store.get(RANK0_ADDRESS_KEY).decode()
    except Exception as e:  # DistStoreError, a timeout: the same "could not meet" as the group's
        raise AddressUnusable(f"rank {ranks.rank} could not learn rank 0's address on {interface} from its host "
                              f"{host}:{port} within {timeout_s:g}s ({one_line(e)}); check that {host} is rank 0's "
                              "host and reachable, or set MASTER_ADDR") from None
    del store
    return addr, None
