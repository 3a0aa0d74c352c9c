"""The IP layer of a packet copied by the kernel (NFLOG, NFQUEUE): addresses, protocol, and
where the transport header starts. Pure; shared by both readers, which parse the transport
header each for what it needs.

A copy may be cut short (``copy_range``), so nothing here raises on short input: what cannot
be read is ``None``. IPv6 extension headers are walked to the transport header; a non-first
fragment (IPv4 or IPv6) has no transport header, only payload.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

_U16 = struct.Struct("!H")
_V6_EXT_8 = frozenset({0, 43, 60})  # hop-by-hop, routing, destination options: (len+1)*8
_V6_AH = 51  # (len+2)*4
_V6_FRAG = 44  # fixed 8 bytes


class IpHead(NamedTuple):
    proto: int | None  # the transport protocol (None: the IPv6 header chain was cut off)
    src: str | None  # None: the IP header itself is not in the copy
    dst: str | None
    l4: int | None  # offset of the transport header; None: there is none in this copy
    end: int  # the packet's length per its IP header (the copy's length when unreadable)


def ipv4(p: bytes) -> IpHead:
    if len(p) < 20:
        return IpHead(None, None, None, None, len(p))
    ihl = (p[0] & 0x0F) * 4
    first = _U16.unpack_from(p, 6)[0] & 0x1FFF == 0  # later fragments hold no L4 header
    src = socket.inet_ntop(socket.AF_INET, p[12:16])
    dst = socket.inet_ntop(socket.AF_INET, p[16:20])
    l4 = ihl if first and ihl >= 20 else None
    return IpHead(p[9], src, dst, l4, _U16.unpack_from(p, 2)[0])


def ipv6(p: bytes) -> IpHead:
    if len(p) < 40:
        return IpHead(None, None, None, None, len(p))
    end = 40 + _U16.unpack_from(p, 4)[0]
    src = socket.inet_ntop(socket.AF_INET6, p[8:24])
    dst = socket.inet_ntop(socket.AF_INET6, p[24:40])
    proto, off = p[6], 40
    while True:  # every step advances at least 8 bytes, so this ends at the copy's end
        if proto in _V6_EXT_8 and off + 2 <= len(p):
            proto, off = p[off], off + (p[off + 1] + 1) * 8
        elif proto == _V6_AH and off + 2 <= len(p):
            proto, off = p[off], off + (p[off + 1] + 2) * 4
        elif proto == _V6_FRAG and off + 8 <= len(p):
            later = _U16.unpack_from(p, off + 2)[0] & 0xFFF8 != 0
            proto, off = p[off], off + 8
            if later:
                return IpHead(proto, src, dst, None, end)
        elif proto in _V6_EXT_8 or proto in (_V6_AH, _V6_FRAG):
            return IpHead(None, src, dst, None, end)  # chain cut off by copy_range
        else:
            return IpHead(proto, src, dst, off, end)
