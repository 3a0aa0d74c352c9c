"""The kernel's socket table, asked one socket at a time: ``sock_diag`` (``inet_diag``) netlink.

``pack_diag_request`` builds an exact 5-tuple lookup, ``parse_diag_reply`` reads its answer;
both are pure. ``open_socket`` opens the netlink socket in the calling thread's namespace (use
``netlink.run_in_netns`` for another one). Process attribution (gateway/logs/procattr.py) asks
it which socket sent a guest's new flow.
"""

from __future__ import annotations

import socket
import struct

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


def open_socket() -> socket.socket:
    """A ``NETLINK_SOCK_DIAG`` socket of the current namespace, with a 1 s timeout."""
    kind = socket.SOCK_RAW | socket.SOCK_CLOEXEC
    sock = socket.socket(socket.AF_NETLINK, kind, NETLINK_SOCK_DIAG)
    sock.settimeout(1.0)
    return sock
