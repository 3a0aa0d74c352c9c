"""Descriptors below FD_SETSIZE, kept for the C library that still select()s on its own.

libnftables (1.0.6, Debian 12) waits for a batch's acknowledgements with select(), and glibc
aborts the whole process when a descriptor of 1,024 or more goes into an fd_set ("bit out of
range 0 - FD_SETSIZE on fd_set"). A context's netlink socket is opened with the context, at the
lowest free number. A gateway with ~55 guests has more than 1,024 descriptors open (sockets,
listeners, pipes), so the context a join made for the guest's own table could get a number
select() cannot take, and its first commit killed the daemon (issue 11's 100-guest run).

So a process that makes contexts keeps a few low numbers reserved (``/dev/null`` opened while
its numbers are still low) and frees them all just before a context opens its socket, which
then takes one of them. Other threads may open descriptors meanwhile; they take the lowest
free numbers too, so a context lands high only if more than ``RESERVE`` others open at that
instant. ``below_fd_setsize`` checks, and the caller retries or refuses.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["FD_SETSIZE", "RESERVE", "below_fd_setsize", "open_fds", "reserve"]

FD_SETSIZE = 1024
RESERVE = 16
# Below this many open descriptors some number under FD_SETSIZE is free by counting alone,
# with room for other threads opening their own meanwhile: no reserve needed.
_PLENTY = FD_SETSIZE - 4 * RESERVE

_lock = threading.Lock()
_held: list[int] = []


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


def reserve() -> None:
    """Hold ``RESERVE`` low numbers (idempotent; call early, while numbers are low). Only
    numbers below FD_SETSIZE are kept: a reserve of high ones would be no use."""
    with _lock:
        _refill()


def _refill() -> None:
    while len(_held) < RESERVE:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        if fd >= FD_SETSIZE:
            os.close(fd)
            return
        _held.append(fd)


@contextlib.contextmanager
def below_fd_setsize() -> Iterator[set[int]]:
    """Around opening a descriptor that a C library will select() on: the reserve is freed
    for it and taken again after. Yields a set that, after the block, holds every descriptor
    opened meanwhile (by this thread or another) at FD_SETSIZE or above: empty when none
    could be the one opened here. One block at a time."""
    high: set[int] = set()
    with _lock:
        before = open_fds()
        if len(before) < _PLENTY:
            yield high
            return
        for fd in _held:
            os.close(fd)
        before.difference_update(_held)
        _held.clear()
        try:
            yield high
        finally:
            high.update(fd for fd in open_fds() - before if fd >= FD_SETSIZE)
            _refill()
