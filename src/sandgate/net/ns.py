"""Network namespaces: create, remove, and run code inside one without leaking out of it.

The network namespace is per *thread* in Linux, and new threads inherit it from their creator.
Anything that opens a socket (netlink, libnftables, a listener) must do so on a thread that is
in the intended namespace, at the moment the socket is created. Two tools here:

- ``NsThread``: a long-lived worker thread that enters one namespace and runs submitted calls
  there (libnftables contexts, sysctl writes, raw sockets are made and used on it).
- ``iproute(name)``: a pyroute2 handle whose netlink socket pyroute2 itself creates inside the
  namespace; we verify that with the socket's namespace cookie before handing it out, because
  a handle opened in the wrong namespace would change the host's real network.

Only namespaces named ``sg-…``/``sandgate…`` may be created or removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue

from sandgate import TYPE_CHECKING
from sandgate.errors import NetError

if TYPE_CHECKING:  # made on first use: concurrent.futures brings logging (~12 ms a run)
    from concurrent.futures import Future
    from typing import Any, TypeVar

    T = TypeVar("T")


NETNS_DIR = Path("/run/netns")
OUR_PREFIXES = ("sg-", "sandgate")
CLONE_NEWNET = 0x40000000
MS_BIND, MS_REC, MS_SHARED, MNT_DETACH = 0x1000, 0x4000, 0x100000, 2
SO_NETNS_COOKIE = 71  # Linux >= 5.14

_libc = ctypes.CDLL(None, use_errno=True)


def check_ours(name: str) -> None:
    if name.startswith("/proc/") and name.endswith("/ns/net"):
        return  # a process's namespace: the caller got the pid from our own state files
    if name.startswith(str(NETNS_DIR) + "/"):
        name = name[len(str(NETNS_DIR)) + 1 :]
    if not name.startswith(OUR_PREFIXES) or "/" in name:
        raise NetError(f"refusing to touch {name!r}: sandgate only manages objects named sg-*")


def path(name: str) -> str:
    """``name`` under /run/netns, or ``name`` itself when it is already a path
    (e.g. /proc/PID/ns/net for the gateway, whose namespace has no name)."""
    return name if name.startswith("/") else str(NETNS_DIR / name)


def exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def create(name: str) -> None:
    """Create a named namespace, bind-mounted under /run/netns as ``ip netns add`` does
    (iproute2's netns.c), without its fork and exec: a thread of ours unshares and the new
    namespace is bind-mounted from /proc/thread-self (6.9 → ~1 ms of a session's start-up,
    2026-12-01). Not pyroute2's netns helpers: those fork children that, when a send fails in
    the child, run on as a copy of the parent and SIGTERM its process group."""
    check_ours(name)
    if exists(name):
        raise NetError(f"namespace {name} already exists", "run `sandgate cleanup`")
    _shared_run_dir()
    target = NETNS_DIR / name
    try:
        os.close(os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0))
    except FileExistsError as exc:
        raise NetError(f"namespace {name} already exists", "run `sandgate cleanup`") from exc
    except OSError as exc:
        raise NetError(f"cannot create {target}: {exc.strerror}") from exc
    failed: list[str] = []

    def make() -> None:  # on a thread that ends in the new namespace: nothing else runs there
        if _libc.unshare(CLONE_NEWNET) != 0:
            failed.append(f"unshare: {os.strerror(ctypes.get_errno())}")
        elif _mount(b"/proc/thread-self/ns/net", bytes(target), MS_BIND) != 0:
            failed.append(f"bind mount: {os.strerror(ctypes.get_errno())}")

    worker = threading.Thread(target=make, name=f"netns-add-{name}")
    worker.start()
    worker.join()
    if failed:
        with contextlib.suppress(OSError):
            target.unlink()
        raise NetError(f"cannot create namespace {name}: {failed[0]}", "run as root")


def remove(name: str) -> None:
    """Remove a namespace; the kernel deletes the links in it once nothing holds it (a
    process, an open handle). Missing is not an error. As ``ip netns delete``: a lazy unmount
    of its bind mount, then the file."""
    check_ours(name)
    if not exists(name):
        return
    target = NETNS_DIR / name
    if _libc.umount2(bytes(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # EINVAL: not mounted (a half-made one): the file still goes
            raise NetError(f"cannot remove namespace {name}: umount: {os.strerror(err)}")
    try:
        target.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise NetError(f"cannot remove namespace {name}: {exc.strerror}") from exc


def _mount(source: bytes, target: bytes, flags: int) -> int:
    return int(_libc.mount(source, target, b"none", ctypes.c_ulong(flags), None))


def _shared_run_dir() -> None:
    """/run/netns a shared mount point, as iproute2 makes it: a namespace mounted there later
    shows in every mount namespace that copied it (a sandbox's bwrap among them)."""
    NETNS_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    run_dir = bytes(NETNS_DIR)
    if _mount(b"", run_dir, MS_SHARED | MS_REC) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: not a mount point yet
        raise NetError(f"cannot make {NETNS_DIR} shared: {os.strerror(ctypes.get_errno())}")
    if (
        _mount(run_dir, run_dir, MS_BIND | MS_REC) != 0
        or _mount(b"", run_dir, MS_SHARED | MS_REC) != 0
    ):
        raise NetError(f"cannot mount {NETNS_DIR}: {os.strerror(ctypes.get_errno())}")


def list_ours() -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(OUR_PREFIXES))


def enter(name: str) -> None:
    """Move the *calling thread* into namespace ``name`` (and everything it starts later)."""
    fd = os.open(path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetError(f"setns({name}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in(name: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a fresh thread inside ``name``; the caller's namespace is untouched."""
    with NsThread(name) as worker:
        return worker.call(fn)


class NsThread:
    """A worker thread living in one network namespace; ``call`` runs a function there."""

    def __init__(self, name: str) -> None:
        self.name = name
        from concurrent.futures import Future

        self._queue: SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = SimpleQueue()
        ready: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name=f"ns-{name}", daemon=True
        )
        self._thread.start()
        ready.result()

    def _main(self, ready: Future[None]) -> None:
        try:
            enter(self.name)
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while (item := self._queue.get()) is not None:
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T]) -> T:
        from concurrent.futures import Future

        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> NsThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def socket_cookie(fd: int) -> int:
    """The namespace cookie of the socket behind ``fd``."""
    sock = socket.socket(fileno=os.dup(fd))
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8)
    finally:
        sock.close()
    return int(struct.unpack("Q", raw)[0])


def netns_cookie(name: str | None) -> int:
    """The cookie of namespace ``name`` (None: the namespace of the calling thread)."""

    def probe() -> int:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:
            return socket_cookie(s.fileno())

    return probe() if name is None else run_in(name, probe)


def iproute(name: str | None) -> Any:
    """A pyroute2 IPRoute bound to namespace ``name``, verified to really be in it.

    ``name=None`` means the calling thread's own namespace (the gateway daemon, which lives
    wholly in its namespace, uses that)."""
    from pyroute2 import IPRoute

    if name is None:
        want = netns_cookie(None)
        ipr = IPRoute()
    else:
        check_ours(name)
        # Our own socket, made on a thread inside the namespace: pyroute2's netns mode forks.
        sock = run_in(
            name, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, socket.NETLINK_ROUTE)
        )
        want = socket_cookie(sock.fileno())
        if want == netns_cookie(None) and name != "/proc/1/ns/net":
            sock.close()
            raise NetError(f"the socket for {name} landed in our own namespace; refusing to use it")
        ipr = IPRoute(use_socket=sock)
    try:
        got = socket_cookie(ipr.fileno())
    except OSError as exc:
        ipr.close()
        raise NetError(f"cannot verify the netlink socket for {name}: {exc}") from exc
    if got != want:
        ipr.close()
        raise NetError(f"netlink socket for {name} is in another namespace; refusing to use it")
    return ipr


def nsenter_argv(name: str) -> list[str]:
    """Prefix that runs a command in namespace ``name`` (network namespace only)."""
    return ["nsenter", f"--net={path(name)}", "--"]


def write_sysctls(values: dict[str, str]) -> None:
    """Write /proc/sys entries for the calling thread's namespace (run it inside one)."""
    for key, value in values.items():
        target = Path("/proc/sys") / key.replace(".", "/")
        target.write_text(value)
