"""Raw byte relay between two connected sockets, through the kernel with splice(2).

Used where a flow cannot stay wholly in the kernel: explicit CONNECT tunnels, passed-through
TLS, and the host-loopback services. One thread (``Hub``) drives every tunnel from one epoll:
no thread per tunnel or per direction. Each direction moves socket -> pipe -> socket with
non-blocking splice, so the bytes never enter Python; the pipe is enlarged to ``PIPE_SIZE`` so
a bulk transfer costs fewer syscalls per megabyte, and it is also the direction's buffer: while
the destination cannot take more, the source is not read (backpressure, bounded memory).

Half-close is carried over (EOF one way shuts down the write side of the other); an error on
either side (a reset) resets both, so the other peer learns the stream was cut rather than
ended. A tunnel ends on EOF both ways, an idle timeout, a total timeout, or a byte cap.

``start`` hands the sockets to the hub and returns at once (the caller's thread is free; the
hub calls ``done`` with the result); ``relay`` is the same, waiting for the result.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

# Bytes a direction holds in flight (the kernel's default pipe is 64 KiB). Relay CPU per GB on
# loopback (bench/relayloop.py, two runs of 3, 2026-12-01): 64 KiB 0.30-0.49 s, 256 KiB
# 0.27-0.43, 1 MiB 0.25-0.33.
# A stalled reader fills the pipe too, but its sockets' autotuned buffers (tcp_rmem/tcp_wmem
# maxima, 6 + 4 MiB) already hold far more: the pipe adds a tenth to a tunnel's worst case.
PIPE_SIZE = 1 << 20
TICK = 0.5  # seconds between checks of the tunnels' deadlines
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_SPLICE = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK  # no SPLICE_F_MORE: it stalls request/response
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT


@dataclass
class RelayResult:
    up: int = 0  # client -> server bytes
    down: int = 0  # server -> client bytes
    seconds: float = 0.0
    ended: str = "eof"  # eof | idle | total | cap | error
    error: str | None = None


Done = Callable[[RelayResult], None]


class _Way:
    """One direction: ``src`` -> pipe -> ``dst``."""

    __slots__ = (
        "closed",
        "dst",
        "dst_sock",
        "eof",
        "moved",
        "pending",
        "room",
        "rpipe",
        "src",
        "wpipe",
    )  # fmt: skip

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst, self.dst_sock = src.fileno(), dst.fileno(), dst
        self.rpipe, self.wpipe = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            self.room = fcntl.fcntl(self.wpipe, _F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:  # above /proc/sys/fs/pipe-max-size for an unprivileged caller
            self.room = 1 << 16
        self.pending = 0  # bytes in the pipe
        self.eof = False  # src has sent FIN
        self.closed = False  # EOF carried over: dst's write side is shut
        self.moved = 0

    def wants_in(self) -> bool:
        return not self.eof and self.pending < self.room

    def close_pipe(self) -> None:
        for fd in (self.rpipe, self.wpipe):
            with contextlib.suppress(OSError):
                os.close(fd)


class _Tunnel:
    __slots__ = ("cap", "deadline", "done", "down", "idle", "last", "masks", "socks", "start", "up")

    def __init__(
        self,
        client: socket.socket,
        server: socket.socket,
        idle: float,
        total: float,
        cap: int | None,
        done: Done,
    ) -> None:
        self.socks = (client, server)
        self.up = _Way(client, server)
        try:
            self.down = _Way(server, client)
        except OSError:
            self.up.close_pipe()
            raise
        self.start = self.last = time.monotonic()
        self.idle, self.deadline, self.cap = idle, self.start + total, cap
        self.done = done
        self.masks = {client.fileno(): 0, server.fileno(): 0}  # what epoll watches now

    def ways_of(self, fd: int) -> tuple[_Way, _Way]:
        """(the direction reading ``fd``, the direction writing to it)."""
        return (self.up, self.down) if fd == self.up.src else (self.down, self.up)


class Hub:
    """One epoll thread for every tunnel. Thread-safe ``start``; the thread starts on first use."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._tunnels: dict[int, _Tunnel] = {}  # by each of its two fds
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._finished: list[tuple[_Tunnel, RelayResult]] = []  # done callbacks still to run

    def start(
        self,
        client: socket.socket,
        server: socket.socket,
        done: Done,
        *,
        idle: float = 300.0,
        total: float = 3600.0,
        cap: int | None = None,
    ) -> None:
        """Relay between the two sockets; ``done(result)`` runs on the hub's thread at the end.

        The hub works on duplicates of the sockets and closes those: the caller closes its own
        whenever it likes (the connection lives until both are closed)."""
        dups: list[socket.socket] = []
        try:
            dups += [client.dup(), server.dup()]
            c, s = dups
            c.setblocking(False)
            s.setblocking(False)
            tunnel = _Tunnel(c, s, idle, total, cap, done)
        except OSError as exc:  # out of descriptors (a pipe, a dup) or a socket already closed
            for sock in dups:
                sock.close()
            done(RelayResult(ended="error", error=exc.strerror or str(exc)))
            return
        with self._lock:  # the hub thread changes tunnels only while holding it
            self._tunnels[c.fileno()] = self._tunnels[s.fileno()] = tunnel
            # Bytes may already wait on either socket: level-triggered epoll reports them.
            for fd in tunnel.masks:
                self._epoll.register(fd, _IN)
                tunnel.masks[fd] = _IN
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="relay-hub", daemon=True)
                self._thread.start()

    def count(self) -> int:
        """Tunnels open now."""
        return len(self._tunnels) // 2

    # -- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        next_tick = time.monotonic() + TICK
        while True:
            try:
                events = self._epoll.poll(TICK)
            except InterruptedError:
                continue
            with self._lock:
                for fd, ev in events:
                    tunnel = self._tunnels.get(fd)
                    if tunnel is None:
                        continue
                    try:
                        self._step(tunnel, fd, ev)
                    except Exception:  # a bug must cost this tunnel, not the hub and every other
                        traceback.print_exc()
                        self._end(tunnel, "error")
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK
                    self._check_deadlines(now)
                finished, self._finished = self._finished, []
            for tunnel, result in finished:  # outside the lock: a callback may start a tunnel
                try:
                    tunnel.done(result)
                except Exception:  # a failing callback must not stop every other tunnel
                    traceback.print_exc()

    def _check_deadlines(self, now: float) -> None:
        for tunnel in set(self._tunnels.values()):
            if now > tunnel.deadline:
                self._end(tunnel, "total")
            elif now - tunnel.last > tunnel.idle:
                self._end(tunnel, "idle")

    def _step(self, tunnel: _Tunnel, fd: int, ev: int) -> None:
        reading, writing = tunnel.ways_of(fd)
        try:
            changed = False  # a change epoll must hear of: only then are the masks redone
            if ev & ~_IN and writing.pending:
                self._flush(writing)
                changed = True
            if ev & ~_OUT and reading.wants_in():
                if not self._pull(tunnel, reading):
                    return  # the cap ended it
                changed = changed or reading.pending > 0 or reading.eof
            if changed:
                self._rearm(tunnel)
        except OSError as exc:
            self._end(tunnel, "error", exc)

    def _pull(self, tunnel: _Tunnel, way: _Way) -> bool:
        want = way.room - way.pending
        if tunnel.cap is not None:
            left = tunnel.cap - tunnel.up.moved - tunnel.down.moved
            if left <= 0:
                self._end(tunnel, "cap")
                return False
            want = min(want, left)
        try:
            moved = os.splice(way.src, way.wpipe, want, flags=_SPLICE)
        except BlockingIOError:
            return True  # woken without data
        if moved == 0:
            way.eof = True
        else:
            way.pending += moved
            way.moved += moved
            tunnel.last = time.monotonic()
        self._flush(way)
        return True

    def _flush(self, way: _Way) -> None:
        while way.pending:
            try:
                way.pending -= os.splice(way.rpipe, way.dst, way.pending, flags=_SPLICE)
            except BlockingIOError:
                return  # dst is full: epoll says when it can take more
        if way.eof and not way.closed:
            way.closed = True
            with contextlib.suppress(OSError):  # the other side may be gone already
                way.dst_sock.shutdown(socket.SHUT_WR)

    def _rearm(self, tunnel: _Tunnel) -> None:
        if tunnel.up.closed and tunnel.down.closed:
            self._end(tunnel, "eof")
            return
        for fd, now in tunnel.masks.items():
            reading, writing = tunnel.ways_of(fd)
            mask = (_IN if reading.wants_in() else 0) | (_OUT if writing.pending else 0)
            if mask == now:
                continue
            # An fd with nothing to wait for leaves the epoll: HUP/ERR would wake it in a loop.
            if now == 0:
                self._epoll.register(fd, mask)
            elif mask == 0:
                self._epoll.unregister(fd)
            else:
                self._epoll.modify(fd, mask)
            tunnel.masks[fd] = mask

    def _end(self, tunnel: _Tunnel, why: str, exc: OSError | None = None) -> None:
        if self._tunnels.pop(tunnel.up.src, None) is None:
            return  # ended already
        self._tunnels.pop(tunnel.down.src, None)
        for fd, mask in tunnel.masks.items():
            if mask:
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
        tunnel.masks = {}
        for sock in tunnel.socks:
            with contextlib.suppress(OSError):
                if why == "error":  # carry the cut over as a reset, not as a clean end
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        tunnel.up.close_pipe()
        tunnel.down.close_pipe()
        result = RelayResult(
            up=tunnel.up.moved,
            down=tunnel.down.moved,
            seconds=time.monotonic() - tunnel.start,
            ended=why,
            error=None if exc is None else (exc.strerror or str(exc)),
        )
        self._finished.append((tunnel, result))


HUB = Hub()


def start(
    client: socket.socket,
    server: socket.socket,
    done: Done,
    *,
    idle: float = 300.0,
    total: float = 3600.0,
    cap: int | None = None,
) -> None:
    """Relay on the shared hub; returns at once, ``done(result)`` runs when the tunnel ends."""
    HUB.start(client, server, done, idle=idle, total=total, cap=cap)


def relay(
    client: socket.socket,
    server: socket.socket,
    *,
    idle: float = 300.0,
    total: float = 3600.0,
    cap: int | None = None,
) -> RelayResult:
    """Relay until both directions are closed or a limit is hit. Closes neither socket."""
    finished = threading.Event()
    out: list[RelayResult] = []

    def done(result: RelayResult) -> None:
        out.append(result)
        finished.set()

    HUB.start(client, server, done, idle=idle, total=total, cap=cap)
    finished.wait()
    return out[0]
