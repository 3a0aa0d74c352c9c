"""Minimal netlink plumbing shared by the NFLOG, NFQUEUE and sock_diag readers.

Two halves, kept apart:

* pure helpers over ``bytes`` (``nl_messages``, ``nl_attrs``, ``pack_*``) that the parsers use;
* ``NetfilterSocket``, a non-blocking ``AF_NETLINK``/``NETLINK_NETFILTER`` socket, and
  ``run_in_netns``, which creates it inside another network namespace.

Constants are from the kernel's uapi headers (linux/netlink.h, linux/netfilter/nfnetlink.h).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = [
    "NETLINK_NETFILTER",
    "NLMSG_DONE",
    "NLMSG_ERROR",
    "NLM_F_ACK",
    "NLM_F_MULTI",
    "NLM_F_REQUEST",
    "NetfilterSocket",
    "NetlinkError",
    "NetlinkParseError",
    "nl_attrs",
    "nl_error_code",
    "nl_messages",
    "pack_attr",
    "pack_nfmsg",
    "run_in_netns",
]

T = TypeVar("T")

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
SO_RCVBUFFORCE = 33
SO_MEMINFO = 55
SK_MEMINFO_DROPS = 8
CLONE_NEWNET = 0x40000000

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLA_F_NESTED = 0x8000
NLA_F_NET_BYTEORDER = 0x4000
NLA_TYPE_MASK = 0x3FFF

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
NLATTR = struct.Struct("=HH")  # len, type (host order)
NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (res_id is big-endian)
_I32 = struct.Struct("=i")

_RECV_SIZE = 1 << 18  # the kernel caps NFLOG batches at 128 KiB; leave room


class NetlinkParseError(ValueError):
    """A datagram does not hold well-formed netlink: lengths overrun or underrun."""


class NetlinkError(OSError):
    """The kernel refused a request (an ``NLMSG_ERROR`` with a negative code)."""


def _align4(n: int) -> int:
    return (n + 3) & ~3


def nl_messages(buf: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield ``(type, flags, seq, start, end)`` per message; ``buf[start:end]`` is its body.

    A datagram may hold many messages (the kernel batches NFLOG), so this walks all of them.
    Raises ``NetlinkParseError`` when a header's length does not fit the buffer.
    """
    off = 0
    size = len(buf)
    while off < size:
        if size - off < NLMSGHDR.size:
            raise NetlinkParseError(f"{size - off} trailing bytes at {off}, short of a header")
        length, mtype, flags, seq, _pid = NLMSGHDR.unpack_from(buf, off)
        if length < NLMSGHDR.size or off + length > size:
            raise NetlinkParseError(f"message at {off} claims {length} bytes of {size - off}")
        yield mtype, flags, seq, off + NLMSGHDR.size, off + length
        off += _align4(length)


def nl_attrs(buf: bytes, start: int, end: int) -> dict[int, bytes]:
    """Map attribute type (flags masked off) to payload for the TLVs in ``buf[start:end]``.

    A repeated type keeps the last value: NFLOG does not repeat the types read here.
    """
    out: dict[int, bytes] = {}
    off = start
    while off + NLATTR.size <= end:
        length, atype = NLATTR.unpack_from(buf, off)
        if length < NLATTR.size or off + length > end:
            raise NetlinkParseError(f"attribute at {off} claims {length} bytes of {end - off}")
        out[atype & NLA_TYPE_MASK] = buf[off + NLATTR.size : off + length]
        off += (length + 3) & ~3  # _align4 inlined: this loop runs per attribute per event
    return out


def nl_error_code(buf: bytes, start: int, end: int) -> int:
    """The (negative errno or zero) code of an ``NLMSG_ERROR`` body."""
    if end - start < _I32.size:
        raise NetlinkParseError("NLMSG_ERROR body too short")
    code: int = _I32.unpack_from(buf, start)[0]
    return code


def pack_attr(atype: int, data: bytes) -> bytes:
    """One TLV, padded to 4 bytes."""
    length = NLATTR.size + len(data)
    return NLATTR.pack(length, atype) + data + b"\0" * (_align4(length) - length)


def pack_nfmsg(
    mtype: int, flags: int, seq: int, *, family: int, res_id: int, attrs: bytes = b""
) -> bytes:
    """An nfnetlink request: nlmsghdr + nfgenmsg (version 0) + attributes."""
    body = NFGENMSG.pack(family, 0, res_id) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), mtype, flags, seq, 0) + body


_libc: ctypes.CDLL | None = None


def _setns(fd: int) -> None:
    global _libc  # noqa: PLW0603 - loaded once, lazily, so importing costs nothing
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc.setns.restype = ctypes.c_int
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def run_in_netns(netns_path: str, fn: Callable[[], T]) -> T:
    """Call ``fn`` on a short-lived thread that first joins the network namespace at ``netns_path``.

    The namespace is per thread, and a socket keeps the namespace it was created in, so sockets
    made by ``fn`` live in ``netns_path`` while the caller's thread never moves. ``fn`` must not
    start threads (they would inherit the namespace) and must return promptly.
    """
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread below
            failure.append(exc)

    worker = threading.Thread(target=target, name="sandgate-setns", daemon=True)
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result[0]


class NetfilterSocket:
    """A non-blocking ``NETLINK_NETFILTER`` socket: requests with acks, drained receives.

    Counters, so loss is visible rather than silent:
    ``overruns`` counts ``ENOBUFS`` (the receive buffer was full and the kernel dropped datagrams);
    ``kernel_drops()`` reads the exact number of datagrams dropped (``SO_MEMINFO``).
    """

    def __init__(self, *, groups: int = 0, rcvbuf: int = 4 << 20) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self._set_rcvbuf(rcvbuf)
            self._sock.bind((0, groups))
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._seq = itertools.count(1)
        # Anonymous memory, not a bytearray: bytearray(n) zeroes (touches) every page, 256 KiB
        # of RSS per socket, and a gateway holds two per guest (uid log, process hold); the
        # kernel backs these pages only as datagrams are written into them.
        self._buf = mmap.mmap(-1, _RECV_SIZE)
        self._view = memoryview(self._buf)
        self._pending: list[bytes] = []  # datagrams that arrived while waiting for an ack
        self.overruns = 0

    def _set_rcvbuf(self, size: int) -> None:
        # FORCE ignores net.core.rmem_max, which is 208 KiB by default: too small for a burst.
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
        except PermissionError:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()

    def kernel_drops(self) -> int:
        """Datagrams the kernel could not queue to this socket since it was created."""
        raw = self._sock.getsockopt(socket.SOL_SOCKET, SO_MEMINFO, 4 * (SK_MEMINFO_DROPS + 1))
        drops: int = struct.unpack_from("=I", raw, 4 * SK_MEMINFO_DROPS)[0]
        return drops

    def request(
        self, mtype: int, *, family: int, res_id: int, attrs: bytes, timeout: float = 2.0
    ) -> None:
        """Send one request and wait for its ack; raise ``NetlinkError`` if the kernel refuses."""
        seq = next(self._seq)
        msg = pack_nfmsg(
            mtype, NLM_F_REQUEST | NLM_F_ACK, seq, family=family, res_id=res_id, attrs=attrs
        )
        self._sock.send(msg)
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(int(left * 1000) + 1):
                raise NetlinkError(errno.ETIMEDOUT, f"no ack for netlink request {mtype:#x}")
            for dgram in self._recv_some():
                code = _ack_code(dgram, seq)
                if code is None:
                    self._pending.append(dgram)
                elif code < 0:
                    raise NetlinkError(-code, f"netlink request {mtype:#x}: {os.strerror(-code)}")
                else:
                    return

    def send(self, data: bytes) -> None:
        """Requests (one or more messages) whose answers ``recv_datagrams`` reads."""
        self._sock.send(data)

    def wait(self, timeout: float) -> bool:
        """Whether something is queued to read within ``timeout`` seconds."""
        if self._pending:
            return True
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000) + 1 if timeout > 0 else 0))

    def _recv_some(self, limit: int = 1 << 30) -> Iterator[bytes]:
        for _ in range(limit):
            try:
                n = self._sock.recv_into(self._buf, _RECV_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1  # reported once per congestion; keep reading what is queued
                continue
            yield bytes(self._view[:n])

    def recv_datagrams(self, limit: int = 1024) -> list[bytes]:
        """Up to ``limit`` queued datagrams without blocking; ``[]`` when nothing is waiting.

        The limit keeps one call bounded under a flood, so an event loop is never starved.
        """
        out = self._pending[:limit]
        del self._pending[:limit]
        out.extend(self._recv_some(limit - len(out)))
        return out


def _ack_code(dgram: bytes, seq: int) -> int | None:
    """The error code if ``dgram`` is the ack for request ``seq``, else ``None``."""
    for mtype, _flags, mseq, start, end in nl_messages(dgram):
        if mtype == NLMSG_ERROR and mseq == seq:
            return nl_error_code(dgram, start, end)
    return None
