"""nftables through libnftables' own JSON interface (ctypes; no shelling out to ``nft``).

A libnftables context opens its netlink socket when it is created, so a ``Nft`` belongs to the
namespace of the thread that made it. Use ``Nft.on(worker)`` with an ``NsThread`` to make and
use one inside a given namespace; every call runs on that worker.

A batch (``{"nftables": [...]}``) is one kernel transaction: if any command in it is rejected,
none is applied and the previous ruleset stays in force. That is how sandgate replaces rules.

libnftables is not thread-safe across contexts either: its interface cache (names to indexes,
filled by ``meta iif "lo"`` and its listing) is one list for the whole process, released at the
end of every run and by every free. Two contexts on two threads freed it twice: the gateway died
of "double free or corruption" in CI, and a run could fail with "Interface does not exist"
(three threads, 300 rounds: an abort in 5 runs of 6, 2026-12-07). So every call into the
library holds ``_calls``; the slow part of a free, the socket's close, is done outside it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from sandgate.errors import RulesetRejected, SetupError
from sandgate.net import lowfd
from sandgate.net.netlink import (
    NFGENMSG,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NetfilterSocket,
    NetlinkError,
    NetlinkParseError,
    nl_attrs,
    nl_error_code,
    nl_messages,
    pack_attr,
    pack_nfmsg,
)
from sandgate.net.ns import NsThread

_OUTPUT_STATELESS = 1 << 2
_OUTPUT_HANDLE = 1 << 3
_OUTPUT_JSON = 1 << 4
_OUTPUT_TERSE = 1 << 11
_OUTPUT_NUMERIC_ALL = (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10)

Json = dict[str, Any]


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("nftables") or "libnftables.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise SetupError(
            "libnftables is missing", "install the Debian package 'nftables' (apt install nftables)"
        ) from exc
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


_lib_lock = threading.Lock()
# Held by every call into libnftables, for any context (the module's docstring says why).
_calls = threading.Lock()
_AF_NETLINK, _NETLINK_NETFILTER = 16, 12


@functools.cache
def _libnftables() -> ctypes.CDLL:
    with _lib_lock:
        lowfd.reserve()  # early: the first context is made while numbers are low
        return _load()


class Nft:
    """One libnftables context. Not thread-safe; create and use it on one thread."""

    def __init__(self) -> None:
        self._lib = _libnftables()
        self._ctx = self._new_context()
        # JSON input is only parsed when JSON output is on (nft 1.0.6).
        self._lib.nft_ctx_output_set_flags(self._ctx, _OUTPUT_JSON | _OUTPUT_HANDLE)
        self._lib.nft_ctx_buffer_output(self._ctx)
        self._lib.nft_ctx_buffer_error(self._ctx)

    def _new_context(self) -> Any:
        """A context whose socket select() can take (net/lowfd.py): one that landed at 1,024
        or above is freed before it is used, and made again."""
        for _ in range(3):
            with lowfd.below_fd_setsize() as high, _calls:
                ctx = self._lib.nft_ctx_new(0)
            if not ctx:
                raise SetupError("libnftables could not create a context")
            if not high:
                return ctx
            with _calls:
                self._lib.nft_ctx_free(ctx)
        raise SetupError(
            f"no descriptor below {lowfd.FD_SETSIZE} was free for libnftables, which select()s "
            f"on its socket ({len(lowfd.open_fds())} are open in this process)",
            "fewer guests on this gateway, or another gateway instance beside it",
        )

    def run(self, command: Json | str) -> Json | None:
        """Run a JSON batch (or a text command); return the JSON output, if any."""
        text = command if isinstance(command, str) else json.dumps(command)
        with _calls:
            rc = self._lib.nft_run_cmd_from_buffer(self._ctx, text.encode())
            out = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
            err = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""
        if rc != 0:
            raise RulesetRejected(
                "nftables rejected the change: " + err.decode(errors="replace").strip(),
                "nothing was applied; the previous ruleset is still in force",
            )
        return json.loads(out) if out.strip() else None

    def list_text(self, command: str) -> str | None:
        """A text ``list`` command's output without counts or handles (the same rules always
        print the same text), or None if the object does not exist. ``terse`` leaves out the
        elements of named sets; list a set by itself to see them."""
        with _calls:
            self._lib.nft_ctx_output_set_flags(self._ctx, _OUTPUT_STATELESS | _OUTPUT_TERSE)
            try:
                rc = self._lib.nft_run_cmd_from_buffer(self._ctx, command.encode())
                out = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
                self._lib.nft_ctx_get_error_buffer(self._ctx)  # drained: the next call's own
            finally:
                self._lib.nft_ctx_output_set_flags(self._ctx, _OUTPUT_JSON | _OUTPUT_HANDLE)
        return out.decode(errors="replace") if rc == 0 else None

    def list_table(self, family: str, table: str) -> list[Json]:
        result = self.run({"nftables": [{"list": {"table": {"family": family, "name": table}}}]})
        return list((result or {}).get("nftables", []))

    def table_exists(self, family: str, table: str) -> bool:
        result = self.run({"nftables": [{"list": {"tables": {"family": family}}}]})
        for item in (result or {}).get("nftables", []):
            t = item.get("table")
            if t and t.get("name") == table and t.get("family") == family:
                return True
        return False

    def close(self) -> None:
        """Free the context; its socket's close (an RCU grace period once it has committed,
        13 ms median in a guest namespace, 2026-12-07) waits outside ``_calls``."""
        spare = self._free()
        if spare is not None:
            spare.close()

    def close_soon(self) -> None:
        """``close`` with the socket closed on a thread of its own: no caller needs to wait
        for it. Unusable from now on."""
        spare = self._free()
        if spare is not None:
            threading.Thread(target=spare.close, name="nft-free", daemon=True).start()

    def _free(self) -> socket.socket | None:
        """Free the context (10 µs) while a copy of its socket keeps that open; the copy, to
        be closed. Where the copy cannot be had, the whole free holds ``_calls``."""
        ctx, self._ctx = self._ctx, None
        if not ctx:
            return None
        with _calls:
            spare = _socket_copy(ctx)
            self._lib.nft_ctx_free(ctx)
        return spare

    @staticmethod
    def on(worker: NsThread) -> NftIn:
        return NftIn(worker)


def _socket_copy(ctx: int) -> socket.socket | None:
    """A second descriptor of a context's netlink socket, or None if what its first member
    points at is not one. A ``struct nft_ctx`` begins with its ``struct mnl_socket *`` in every
    libnftables since the library began (nftables.h), and libmnl gives that one's descriptor;
    the copy is checked to be a netfilter netlink socket before it is trusted."""
    sock = ctypes.c_void_p.from_address(ctx).value
    if not sock:
        return None
    try:
        fd = os.dup(_libmnl().mnl_socket_get_fd(sock))
    except (OSError, AttributeError):  # no libmnl, no such descriptor
        return None
    try:
        copy = socket.socket(fileno=fd)
    except OSError:  # not a socket
        os.close(fd)
        return None
    with contextlib.suppress(OSError):
        if (copy.family, copy.proto) == (_AF_NETLINK, _NETLINK_NETFILTER):
            return copy
    copy.close()  # only the copy: whatever that number was, it stays open
    return None


@functools.cache
def _libmnl() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("mnl") or "libmnl.so.0")
    lib.mnl_socket_get_fd.restype = ctypes.c_int
    lib.mnl_socket_get_fd.argtypes = [ctypes.c_void_p]
    return lib


class NftIn:
    """An ``Nft`` that lives on an ``NsThread``: every call runs inside that namespace."""

    def __init__(self, worker: NsThread) -> None:
        self._worker = worker
        self._nft: Nft = worker.call(Nft)

    def run(self, command: Json | str) -> Json | None:
        return self._worker.call(lambda: self._nft.run(command))

    def list_text(self, command: str) -> str | None:
        return self._worker.call(lambda: self._nft.list_text(command))

    def list_table(self, family: str, table: str) -> list[Json]:
        return self._worker.call(lambda: self._nft.list_table(family, table))

    def table_exists(self, family: str, table: str) -> bool:
        return self._worker.call(lambda: self._nft.table_exists(family, table))

    def close(self) -> None:
        self._worker.call(self._nft.close)


def batch(*commands: Json) -> Json:
    return {"nftables": list(commands)}


# The kernel's note of every committed nftables transaction (include/uapi/linux/netfilter/
# nf_tables.h): NFT_MSG_NEWGEN on NFNLGRP_NFTABLES, with the committing task's pid and name.
NFNLGRP_NFTABLES = 7
_NEWGEN = (10 << 8) | 15  # NFNL_SUBSYS_NFTABLES, NFT_MSG_NEWGEN
_GEN_PROC_PID, _GEN_PROC_NAME = 2, 3


@dataclass(frozen=True, slots=True)
class Commit:
    """One transaction committed in the namespace: by which task (a thread's id) and name,
    and the objects it changed ("rule in inet sandgate forward", at most ``TOUCHED_MAX``)."""

    pid: int
    name: str
    touched: tuple[str, ...] = ()


# Each change's notification (NFT_MSG_*): what it did, and the attributes naming its table and
# object (nf_tables.h: every object's table is attribute 1; then its own name's number).
_CHANGES: dict[int, tuple[str, str, int]] = {
    0: ("table", "added", 0),
    2: ("table", "deleted", 0),
    3: ("chain", "added", 3),
    5: ("chain", "deleted", 3),
    6: ("rule in chain", "added", 2),
    8: ("rule in chain", "deleted", 2),
    9: ("set", "added", 2),
    11: ("set", "deleted", 2),
    12: ("elements of set", "added", 2),
    14: ("elements of set", "deleted", 2),
    18: ("object", "added", 2),
    20: ("object", "deleted", 2),
    22: ("flowtable", "added", 2),
    24: ("flowtable", "deleted", 2),
}
_FAMILIES = {1: "inet", 2: "ip", 3: "arp", 5: "netdev", 7: "bridge", 10: "ip6"}
TOUCHED_MAX = 32


def touched(mtype: int, family: int, attrs: dict[int, bytes]) -> str | None:
    """One change notification as text ("rule in chain inet sandgate forward: added"), or
    None for a message that changes nothing (NEWGEN, a GET's answer)."""
    if mtype >> 8 != 10 or (change := _CHANGES.get(mtype & 0xFF)) is None:
        return None
    what, how, name_attr = change

    def text(attr: int) -> str:
        return attrs.get(attr, b"?").rstrip(b"\0").decode(errors="replace")

    where = f"{_FAMILIES.get(family, str(family))} {text(1)}"
    return f"{what} {where}{' ' + text(name_attr) if name_attr else ''}: {how}"


class CommitMonitor:
    """Who commits nftables changes in this (the calling thread's) namespace.

    One message per transaction, whatever its size, so a watcher learns "something else
    changed the rules" without listing them. ``overruns`` says when notifications were lost
    (then nothing can be vouched for)."""

    def __init__(self) -> None:
        # The group carries every change, one message per set element: a 100,000-rule guest
        # (33,334 elements) queues ~5 MiB before its commit's one NEWGEN, while the committer
        # (our own loop) cannot drain. 4 MiB overran now and then, and lost notifications
        # count as another's commit (gateway/selfcheck.py). Memory is taken only as queued.
        self._sock = NetfilterSocket(groups=1 << (NFNLGRP_NFTABLES - 1), rcvbuf=32 << 20)
        self._changes: dict[str, None] = {}  # the transaction being notified, so far

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def overruns(self) -> int:
        return self._sock.overruns

    def read(self) -> list[Commit]:
        """The commits notified so far; never blocks."""
        out: list[Commit] = []
        for dgram in self._sock.recv_datagrams():
            try:
                for mtype, _flags, _seq, start, end in nl_messages(dgram):
                    if mtype != _NEWGEN:
                        # A transaction's changes come before its NEWGEN, in order.
                        if len(self._changes) < TOUCHED_MAX:
                            attrs = nl_attrs(dgram, start + NFGENMSG.size, end)
                            change = touched(mtype, dgram[start], attrs)
                            if change is not None:
                                self._changes.setdefault(change)
                        continue
                    attrs = nl_attrs(dgram, start + NFGENMSG.size, end)
                    raw_pid = attrs.get(_GEN_PROC_PID, b"")
                    pid = int.from_bytes(raw_pid, "big") if len(raw_pid) == 4 else -1
                    name = attrs.get(_GEN_PROC_NAME, b"").rstrip(b"\0").decode(errors="replace")
                    out.append(Commit(pid, name, tuple(self._changes)))
                    self._changes.clear()
            except NetlinkParseError:
                out.append(Commit(-1, "(unreadable notification)"))
        return out

    def close(self) -> None:
        self._sock.close()


# Named counters read straight from the kernel (include/uapi/linux/netfilter/nf_tables.h):
# one NFT_MSG_GETOBJ per name, all in one datagram; each is answered by NFT_MSG_NEWOBJ or an
# error. libnftables fetches its whole cache (tables, sets, objects) for any listing: 1.2 ms
# at one guest and growing with every guest, where a guest's few names cost ~0.1 ms here.
_GETOBJ = (10 << 8) | 19  # NFNL_SUBSYS_NFTABLES, NFT_MSG_GETOBJ
_NEWOBJ = (10 << 8) | 18
_OBJ_TABLE, _OBJ_NAME, _OBJ_TYPE, _OBJ_DATA = 1, 2, 3, 4
_OBJECT_COUNTER = 1
_COUNTER_BYTES, _COUNTER_PACKETS = 1, 2
FAMILIES = {"inet": 1, "netdev": 5}  # NFPROTO_*
_FAMILY_NAMES = {v: k for k, v in FAMILIES.items()}


def pack_counter_gets(table: str, names: list[tuple[str, str]], first_seq: int) -> bytes:
    """One GETOBJ request per (family, counter name), with sequence numbers from
    ``first_seq`` on, as one buffer."""
    out = []
    for i, (family, name) in enumerate(names):
        attrs = (
            pack_attr(_OBJ_TABLE, table.encode() + b"\0")
            + pack_attr(_OBJ_NAME, name.encode() + b"\0")
            + pack_attr(_OBJ_TYPE, _OBJECT_COUNTER.to_bytes(4, "big"))
        )
        fam = FAMILIES[family]
        out.append(
            pack_nfmsg(_GETOBJ, NLM_F_REQUEST, first_seq + i, family=fam, res_id=0, attrs=attrs)
        )
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class CounterReply:
    """One request's answer: a counter's packets and bytes, or the kernel's error code."""

    seq: int
    family: str | None = None
    name: str | None = None
    packets: int = 0
    bytes: int = 0
    error: int = 0  # a negative errno (-ENOENT: no such counter)


def parse_counter_replies(dgram: bytes) -> list[CounterReply]:
    """The answers in one datagram; raises ``NetlinkParseError`` on malformed netlink."""
    out: list[CounterReply] = []
    for mtype, _flags, seq, start, end in nl_messages(dgram):
        if mtype == NLMSG_ERROR:
            out.append(CounterReply(seq, error=nl_error_code(dgram, start, end)))
            continue
        if mtype != _NEWOBJ or end - start < NFGENMSG.size:
            continue
        family = _FAMILY_NAMES.get(dgram[start])
        attrs = nl_attrs(dgram, start + NFGENMSG.size, end)
        data = attrs.get(_OBJ_DATA, b"")
        inner = nl_attrs(data, 0, len(data))
        out.append(
            CounterReply(
                seq,
                family,
                attrs.get(_OBJ_NAME, b"").rstrip(b"\0").decode(errors="replace"),
                int.from_bytes(inner.get(_COUNTER_PACKETS, b""), "big"),
                int.from_bytes(inner.get(_COUNTER_BYTES, b""), "big"),
            )
        )
    return out


class CounterReader:
    """Named counters of one table, read by name (the calling thread's namespace)."""

    def __init__(self) -> None:
        self._sock = NetfilterSocket(rcvbuf=1 << 20)
        self._seq = 1

    def packets(
        self, table: str, names: list[tuple[str, str]], timeout: float = 1.0
    ) -> dict[tuple[str, str], int]:
        """Packets per (family, name) asked; a name the kernel does not have is left out.
        Raises ``OSError`` (``NetlinkError``: no answer in ``timeout``) so the caller can
        fall back to a listing."""
        if not names:
            return {}
        first, self._seq = self._seq, self._seq + len(names)
        waiting = set(range(first, first + len(names)))
        self._sock.send(pack_counter_gets(table, names, first))
        out: dict[tuple[str, str], int] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            if not self._sock.wait(deadline - time.monotonic()):
                raise NetlinkError(errno.ETIMEDOUT, f"{len(waiting)} counter(s) not answered")
            for dgram in self._sock.recv_datagrams():
                for reply in parse_counter_replies(dgram):
                    if reply.seq not in waiting:
                        continue  # an answer to an earlier call that gave up
                    waiting.discard(reply.seq)
                    if reply.error == 0:
                        out[names[reply.seq - first]] = reply.packets
                    elif reply.error != -errno.ENOENT:
                        raise NetlinkError(-reply.error, os.strerror(-reply.error))
        return out

    def close(self) -> None:
        self._sock.close()
