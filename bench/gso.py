"""A link's GSO/GRO limits, IPv4's too (BIG TCP: segments above 64 KiB), set and read back.

Measured with bench/kpath.py's ``*-big`` variants and not set by sandgate on its links
(docs/NOTES.md, "BIG TCP measured, not on by default"). linux/if_link.h: pyroute2 0.9.7's
ifinfmsg stops at IFLA_ALLMULTI (61), before the IPv4 limits (6.3+), and iproute2 6.1 does not
know them, so the one request that needs them is built here.
"""

from __future__ import annotations

import os
import socket
import struct

from sandgate.errors import NetError
from sandgate.net.netlink import (
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NLMSGHDR,
    nl_attrs,
    nl_error_code,
    nl_messages,
    pack_attr,
)

GSO_ATTRS = {"gso": 41, "gro": 58, "gso_ipv4": 63, "gro_ipv4": 64}  # IFLA_{GSO,GRO}[_IPV4]_MAX_SIZE
RTM_NEWLINK, RTM_GETLINK = 16, 18
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change


def _link_request(mtype: int, flags: int, index: int, attrs: bytes = b"", seq: int = 1) -> bytes:
    body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), mtype, flags, seq, 0) + body


def gso_limits_request(index: int, size: int, seq: int = 1) -> bytes:
    """RTM_NEWLINK for link ``index``: its GSO and GRO limits, IPv6's and IPv4's, to ``size``."""
    value = struct.pack("=I", size)
    attrs = b"".join(pack_attr(a, value) for a in GSO_ATTRS.values())
    return _link_request(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, index, attrs, seq)


def read_gso_limits(reply: bytes) -> dict[str, int]:
    """The GSO/GRO limits in an RTM_NEWLINK message (a GETLINK's answer), by ``GSO_ATTRS`` name;
    a kernel without the IPv4 pair leaves those out."""
    for mtype, _flags, _seq, start, end in nl_messages(reply):
        if mtype == RTM_NEWLINK:
            attrs = nl_attrs(reply, start + IFINFOMSG.size, end)
            return {k: struct.unpack("=I", attrs[a])[0] for k, a in GSO_ATTRS.items() if a in attrs}
    raise NetError("no link in the kernel's answer")


def gso_limits(index: int) -> dict[str, int]:
    """Link ``index``'s GSO/GRO limits, in the calling thread's namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:
        s.send(_link_request(RTM_GETLINK, NLM_F_REQUEST, index))
        return read_gso_limits(s.recv(65536))


def set_gso_limits(index: int, size: int) -> None:
    """Set link ``index``'s GSO/GRO limits (in the calling thread's namespace); raise NetError
    with the kernel's errno if it refuses (above the device's tso_max_size, or a kernel before
    5.19 asked for more than 64 KiB; one before 6.3 ignores the IPv4 pair)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
        s.send(gso_limits_request(index, size))
        reply = s.recv(4096)
    for mtype, _flags, _seq, start, end in nl_messages(reply):
        if mtype == NLMSG_ERROR and (code := nl_error_code(reply, start, end)):
            raise NetError(f"link {index}: GSO limit {size}: {os.strerror(-code)}")
