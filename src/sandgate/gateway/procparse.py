"""The pure half of process attribution: /proc and sock_diag formats, parsed; chains classified.

No I/O here (procattr.py reads the files and sockets and calls these).
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Any

from sandgate.net.netlink import (
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NetlinkParseError,
    nl_error_code,
    nl_messages,
)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
_NOCOOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_DIAG_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_DIAG_PORTS = struct.Struct(">HH")  # sport, dport (network order)
_DIAG_TAIL = struct.Struct("=III")  # if, cookie[2]
_DIAG_MSG_HEAD = struct.Struct("=BBBB")  # family, state, timer, retrans
_DIAG_MSG_IDS = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode (after the sockid)
_SOCKID_LEN = 48
_NLMSGHDR = struct.Struct("=IHHII")
_V4_MAPPED = b"\0" * 10 + b"\xff\xff"
PROTOCOLS = {"tcp": socket.IPPROTO_TCP, "udp": socket.IPPROTO_UDP}

# Programs that only set a sandbox up (sandbox/bwrap.py's argv): never the framework.
LAUNCHERS = frozenset({"nsenter", "setpriv", "bwrap", "unshare"})
MAX_DEPTH = 64
_MAX_SOCKETS = 65536


class Role(enum.StrEnum):
    FRAMEWORK = "framework"  # the sandbox's top command (or one of its threads)
    TOOL = "tool"  # a process the framework started, at any depth
    LAUNCHER = "launcher"  # nsenter, setpriv or bwrap above the top command
    OUTSIDE = "outside"  # in the guest's namespace, but not under the sandbox's root


# --- pure parsers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SockEntry:
    """One line of ``/proc/net/{tcp,tcp6,udp,udp6}``. Addresses are unmapped (``::ffff:a.b.c.d``
    becomes ``a.b.c.d``); ``state`` is the kernel's TCP state number (UDP: 7 unconnected, 1
    connected); ``inode`` 0 means no socket file (TIME_WAIT, a half-open request)."""

    proto: str  # "tcp" | "udp"
    local: str
    lport: int
    remote: str
    rport: int
    state: int
    uid: int
    inode: int


def parse_hex_address(text: str) -> tuple[str, int]:
    """``0100007F:0050`` -> ("127.0.0.1", 80). The address is 32-bit words in host order."""
    addr, _, port = text.partition(":")
    if len(addr) not in (8, 32) or not port:
        raise ValueError(f"not an address:port in /proc/net format: {text!r}")
    raw = b"".join(struct.pack("=I", int(addr[i : i + 8], 16)) for i in range(0, len(addr), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped), int(port, 16)
    return str(ip), int(port, 16)


def parse_proc_net(text: str, proto: str) -> list[SockEntry]:
    """The sockets in one ``/proc/PID/net/`` table; ``proto`` is the file's name (``tcp6``...).

    Lines that do not parse are skipped: the table is read while it changes.
    """
    base = proto.removesuffix("6")
    if base not in PROTOCOLS:
        raise ValueError(f"unknown table {proto!r}: tcp, tcp6, udp or udp6")
    out: list[SockEntry] = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        try:
            local, lport = parse_hex_address(cols[1])
            remote, rport = parse_hex_address(cols[2])
            out.append(
                SockEntry(
                    base, local, lport, remote, rport, int(cols[3], 16), int(cols[7]), int(cols[9])
                )
            )
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What ``/proc/PID/stat`` says that we use. ``start`` is in clock ticks since boot."""

    pid: int
    comm: str
    state: str
    ppid: int
    start: int


def parse_stat(text: str) -> ProcStat:
    """``/proc/PID/stat``. The name sits in parentheses and may hold spaces and ``)``."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError("no (comm) in /proc/PID/stat")
    rest = text[close_at + 1 :].split()
    if len(rest) < 20:
        raise ValueError("/proc/PID/stat too short")
    return ProcStat(
        int(text[:open_at]), text[open_at + 1 : close_at], rest[0], int(rest[1]), int(rest[19])
    )


def parse_status_ppid(text: str) -> int:
    """The ``PPid:`` line of ``/proc/PID/status``."""
    for line in text.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise ValueError("no PPid line in /proc/PID/status")


def parse_cmdline(raw: bytes) -> list[str]:
    """``/proc/PID/cmdline``: NUL-separated, NUL-terminated; bytes that are not UTF-8 escaped."""
    if not raw:
        return []
    return [a.decode("utf-8", "backslashreplace") for a in raw.removesuffix(b"\0").split(b"\0")]


def parse_socket_link(target: str) -> int | None:
    """``socket:[123]`` (a ``/proc/PID/fd`` link) -> 123; anything else -> None."""
    if target.startswith("socket:[") and target.endswith("]"):
        with contextlib.suppress(ValueError):
            return int(target[8:-1])
    return None


def pack_diag_request(
    proto: str, src: str, sport: int, dst: str, dport: int, seq: int = 1
) -> bytes:
    """A ``SOCK_DIAG_BY_FAMILY`` exact lookup for the socket that sent ``src:sport -> dst:dport``.

    TCP looks the socket up as its own (local first); UDP looks it up as the receiver of the
    reply would be found (remote first), so an unconnected socket bound to any address matches.
    """
    if proto not in PROTOCOLS:
        raise ValueError(f"sock_diag lookups are for tcp or udp, not {proto!r}")
    a, b = _packed(src), _packed(dst)
    if len(a) != len(b):  # one v4, one v6: ask as v6 with the v4 one mapped
        a, b = (x if len(x) == 16 else _V4_MAPPED + x for x in (a, b))
    family = socket.AF_INET if len(a) == 4 else socket.AF_INET6
    (addr1, port1), (addr2, port2) = ((a, sport), (b, dport))[:: 1 if proto == "tcp" else -1]
    body = b"".join(
        (
            _DIAG_REQ.pack(family, PROTOCOLS[proto], 0, 0, _ALL_STATES),
            _DIAG_PORTS.pack(port1, port2),
            addr1.ljust(16, b"\0"),
            addr2.ljust(16, b"\0"),
            _DIAG_TAIL.pack(0, _NOCOOKIE, _NOCOOKIE),
        )
    )
    head = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0)
    return head + body


def _packed(address: str) -> bytes:
    """An address in network order; ``inet_pton`` costs a tenth of ``ipaddress``."""
    try:
        return socket.inet_pton(socket.AF_INET, address)
    except OSError:
        try:
            return socket.inet_pton(socket.AF_INET6, address)
        except OSError:
            raise ValueError(f"not an IP address: {address!r}") from None


def parse_diag_reply(buf: bytes, seq: int | None = None) -> tuple[int, int, int] | int | None:
    """``(inode, uid, state)`` of the one socket an exact lookup found, or a negative errno
    (``-ENOENT``: no such socket, e.g. its process is gone), or None when the datagram holds
    no answer to ``seq`` (a late reply to an earlier question). Malformed: ``NetlinkParseError``.
    """
    for mtype, _flags, mseq, start, end in nl_messages(buf):
        if seq is not None and mseq != seq:
            continue
        if mtype == NLMSG_ERROR:
            return nl_error_code(buf, start, end)
        if mtype == SOCK_DIAG_BY_FAMILY:
            ids_at = start + _DIAG_MSG_HEAD.size + _SOCKID_LEN
            if end - ids_at < _DIAG_MSG_IDS.size:
                raise NetlinkParseError("inet_diag_msg too short")
            _fam, state, _timer, _retrans = _DIAG_MSG_HEAD.unpack_from(buf, start)
            *_, uid, inode = _DIAG_MSG_IDS.unpack_from(buf, ids_at)
            return inode, uid, state
    return None


def classify_chain(exes: list[str | None], reached_root: bool) -> Role:
    """The role of ``exes[0]`` (the socket's holder), given the programs (base names) of its
    chain up to the sandbox's root, ``exes[-1]``. The top command is the first one below the
    launchers at the root's end; a chain that never reached the root is ``outside``."""
    if not reached_root or not exes:
        return Role.OUTSIDE
    top = len(exes) - 1
    while top >= 0 and exes[top] in LAUNCHERS:
        top -= 1
    if top < 0:
        return Role.LAUNCHER
    return Role.FRAMEWORK if top == 0 else Role.TOOL


# --- the lookup ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcInfo:
    """The process that held a flow's socket. ``chain`` runs from it up to the sandbox's root,
    ``(pid, comm)`` each. ``exe`` is None when the process left before it could be read."""

    pid: int
    exe: str | None
    cmdline: list[str]
    chain: list[tuple[int, str]]
    role: str
    inode: int = 0
    uid: int | None = None

    def details(self) -> dict[str, Any]:
        """For an event's ``details`` (JSON types only)."""
        return {
            "pid": self.pid,
            "exe": self.exe,
            "cmdline": self.cmdline,
            "chain": [[pid, comm] for pid, comm in self.chain],
            "role": self.role,
        }
