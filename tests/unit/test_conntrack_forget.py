"""The pure half of ``conntrack.forget``: which dumped flows are a leaving guest's, and the
delete request that names one (the kernel half: tests/kernel/test_address_reuse.py)."""

from __future__ import annotations

import socket

from sandgate.net import conntrack
from sandgate.net.netlink import NFGENMSG, NLA_F_NESTED, NLMSGHDR, nl_attrs, pack_attr

GUEST = socket.inet_pton(socket.AF_INET, "10.201.0.6")
GUEST6 = socket.inet_pton(socket.AF_INET6, "fd53:4700:0:1::2")


def _body(family: int, src: str, dst: str, zone: int | None = None) -> tuple[bytes, bytes]:
    v = {socket.AF_INET: (1, 2), socket.AF_INET6: (3, 4)}[family]
    ip = pack_attr(v[0], socket.inet_pton(family, src)) + pack_attr(
        v[1], socket.inet_pton(family, dst)
    )
    proto = pack_attr(1, b"\x11") + pack_attr(2, b"\xb7\x99") + pack_attr(3, b"\x00\x35")
    orig = pack_attr(1 | NLA_F_NESTED, ip) + pack_attr(2 | NLA_F_NESTED, proto)
    extra = pack_attr(18, zone.to_bytes(2, "big")) if zone is not None else b""
    return NFGENMSG.pack(family, 0, 0) + pack_attr(1 | NLA_F_NESTED, orig) + extra, orig


def test_a_guests_flows_are_found_by_either_end() -> None:
    wanted = {GUEST, GUEST6}
    body, orig = _body(socket.AF_INET, "10.201.0.6", "203.0.113.30")
    assert conntrack.matching_tuple(body, wanted) == (socket.AF_INET, orig, b"")
    body, orig = _body(socket.AF_INET, "203.0.113.30", "10.201.0.6")  # towards the guest
    assert conntrack.matching_tuple(body, wanted) == (socket.AF_INET, orig, b"")
    body, orig = _body(socket.AF_INET6, "fd53:4700:0:1::2", "2001:db8::1")
    assert conntrack.matching_tuple(body, wanted) == (socket.AF_INET6, orig, b"")
    other, _ = _body(socket.AF_INET, "10.201.0.10", "203.0.113.30")  # the next guest's
    assert conntrack.matching_tuple(other, wanted) is None
    assert conntrack.matching_tuple(b"", wanted) is None


def test_the_delete_names_the_tuple_as_sent_and_its_zone() -> None:
    body, orig = _body(socket.AF_INET, "10.201.0.6", "203.0.113.30", zone=7)
    match = conntrack.matching_tuple(body, {GUEST})
    assert match is not None
    family, tup, zone = match
    request = conntrack.delete_request(family, tup, zone, 5)
    length, mtype, flags, seq, _ = NLMSGHDR.unpack_from(request)
    assert (length, mtype, seq) == (len(request), (1 << 8) | 2, 5) and flags & 0x4  # an ack
    attrs = nl_attrs(request, NLMSGHDR.size + NFGENMSG.size, len(request))
    assert attrs[1] == orig and attrs[18] == (7).to_bytes(2, "big")
    assert request[NLMSGHDR.size] == socket.AF_INET
