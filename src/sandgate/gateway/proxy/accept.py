"""One thread that accepts on every guest's proxy doors (epoll), not a thread per door.

A thread per listening socket, each waking twice a second to look at its stop flag, was 300 of
the daemon's 409 threads at 100 guests, and their wake-ups cost CPU on a gateway with nothing to
do (issue 11). Here each listener is registered with one epoll set; a ready listener is accepted
until it has nothing more, and each connection goes to ``on_conn`` (the proxy starts the
connection's own thread there, as before). Adding and removing a listener are epoll_ctl calls,
effective at once from any thread, so the acceptor never needs waking.
"""

from __future__ import annotations

import contextlib
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Acceptor"]

ACCEPT_BURST = 64  # connections taken from one ready listener before the others get a turn
_BACKOFF = 0.05  # after an accept error other than "none waiting" (EMFILE): not a busy loop

OnConn = Callable[[socket.socket, tuple[str, int], Any], None]


class Acceptor:
    def __init__(self, on_conn: OnConn) -> None:
        self._on_conn = on_conn
        self._epoll = select.epoll()
        self._doors: dict[int, tuple[socket.socket, Any]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, listener: socket.socket, door: Any) -> None:
        """Accept on ``listener`` from now on; ``door`` goes to ``on_conn`` with each
        connection."""
        listener.setblocking(False)
        with self._lock:
            self._doors[listener.fileno()] = (listener, door)
            self._epoll.register(listener.fileno(), select.EPOLLIN)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="proxy-accept", daemon=True)
                self._thread.start()

    def remove(self, listener: socket.socket) -> None:
        """No more connections from ``listener`` (call before closing it)."""
        with self._lock:
            fd = listener.fileno()
            if fd >= 0 and self._doors.get(fd, (None,))[0] is listener:
                del self._doors[fd]
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def serves(self, listener: socket.socket) -> bool:
        fd = listener.fileno()
        alive = self._thread is not None and self._thread.is_alive()
        return alive and fd >= 0 and self._doors.get(fd, (None,))[0] is listener

    def _run(self) -> None:
        while True:
            try:
                ready = self._epoll.poll(-1, ACCEPT_BURST)
            except InterruptedError:
                continue
            for fd, _events in ready:
                entry = self._doors.get(fd)
                if entry is not None:
                    self._drain(*entry)

    def _drain(self, listener: socket.socket, door: Any) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # closed under us (removed meanwhile), or out of descriptors
                if listener.fileno() >= 0:
                    sys.stderr.write(f"sandgate proxy: accept: {exc}\n")
                    time.sleep(_BACKOFF)
                return
            try:
                self._on_conn(conn, peer, door)
            except Exception as exc:  # one connection must never stop every door
                sys.stderr.write(f"sandgate proxy: a connection was dropped: {exc}\n")
                with contextlib.suppress(OSError):
                    conn.close()
