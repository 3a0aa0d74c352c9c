"""Moving a plain HTTP body from one socket to another inside the kernel (splice through a pipe).

A plain HTTP response whose head was judged and whose body nobody needs to read (no secret to
redact: http1.py decides) is moved with ``os.splice``: socket → pipe → socket, no byte copied
into Python. ``move`` moves exactly ``count`` bytes, or fewer when the source ends, fails or
stays silent for ``idle`` seconds; the caller compares what it got with what it wanted.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket

PIPE = 1 << 20  # bytes the pipe holds (asked of F_SETPIPE_SZ; the kernel may give less)
STEP = 1 << 20  # bytes asked of one splice() call
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)


class Moved:
    """What ``move`` did: bytes delivered, and why it stopped early (None: it did not)."""

    __slots__ = ("count", "ended")

    def __init__(self, count: int, ended: str | None) -> None:
        self.count = count
        self.ended = ended


def move(src: socket.socket, dst: socket.socket, count: int, idle: float) -> Moved:
    """Move ``count`` bytes from ``src`` to ``dst``. ``ended``: "eof" (the source closed
    early), "idle" (nothing for ``idle`` seconds), or an error's text."""
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        room = fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE)
    except OSError:  # above pipe-max-size: the default
        room = fcntl.fcntl(w, _F_GETPIPE_SZ)
    src_fd, dst_fd = src.fileno(), dst.fileno()
    moved = held = 0  # delivered to dst; sitting in the pipe
    ended: str | None = None
    poller = select.poll()
    try:
        while moved < count:
            progress = False
            want_in = want_out = False
            if moved + held < count and ended is None:
                try:
                    n = os.splice(src_fd, w, min(STEP, count - moved - held), flags=_FLAGS)
                except BlockingIOError:
                    want_in = True  # the source has nothing (or the pipe is full)
                except OSError as exc:
                    ended = exc.strerror or str(exc)
                else:
                    if n == 0:
                        ended = "eof"
                    held += n
                    progress = progress or n > 0
            if held:
                try:
                    n = os.splice(r, dst_fd, held, flags=_FLAGS)
                except BlockingIOError:
                    want_out = True
                except OSError as exc:
                    return Moved(moved, exc.strerror or str(exc))
                else:
                    moved += n
                    held -= n
                    progress = progress or n > 0
            if ended is not None and not held:
                break
            if progress:
                continue
            events = []
            if want_in and held < room:
                events.append((src_fd, select.POLLIN))
            if want_out or held:
                events.append((dst_fd, select.POLLOUT))
            for fd, mask in events:
                poller.register(fd, mask)
            try:
                ready = poller.poll(idle * 1000)
            finally:
                for fd, _ in events:
                    poller.unregister(fd)
            if not ready:
                return Moved(moved, "idle")
            for _, mask in ready:
                if mask & (select.POLLERR | select.POLLNVAL):
                    return Moved(moved, "socket error")
        return Moved(moved, ended if moved < count else None)
    finally:
        os.close(r)
        os.close(w)
