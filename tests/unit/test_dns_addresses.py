"""One reader for the addresses of an upstream answer (issue 13): ``dnslogic.read_addresses``
replaces the resolver's ``a_records``/``nodata`` and the proxy's ``addresses_and_ttl``, which
parsed the same reply two or three times. Differential: for generated replies (A, AAAA, CNAME
and TXT records, IN and CH classes, TTLs past 2^31, every rcode, cut and flipped bytes) the one
reader gives what the three readers it replaces gave."""

from __future__ import annotations

import ipaddress
import struct

import dns.exception
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.gateway.dns.dnslogic import read_addresses

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# -- the readers this one replaces, as they were ---------------------------------------------


def old_a_records(wire: bytes) -> list[ipaddress.IPv4Address]:
    try:
        msg = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError):
        return []
    return [
        ipaddress.IPv4Address(r.address)
        for rrset in msg.answer
        if rrset.rdtype == dns.rdatatype.A and rrset.rdclass == dns.rdataclass.IN
        for r in rrset
    ]


def old_nodata(wire: bytes) -> bool:
    try:
        return dns.message.from_wire(wire).rcode() == dns.rcode.NOERROR
    except (dns.exception.DNSException, ValueError):
        return False


def old_addresses_and_ttl(wire: bytes) -> tuple[list[Address], float]:
    try:
        msg = dns.message.from_wire(wire)
    except (dns.exception.DNSException, ValueError):
        return [], 0.0
    found: list[Address] = []
    ttls: list[int] = []
    for rrset in msg.answer:
        ttls.append(rrset.ttl)
        if rrset.rdclass != dns.rdataclass.IN:
            continue
        if rrset.rdtype == dns.rdatatype.A:
            found.extend(ipaddress.IPv4Address(r.address) for r in rrset)
        elif rrset.rdtype == dns.rdatatype.AAAA:
            found.extend(ipaddress.IPv6Address(r.address) for r in rrset)
    return found, float(min(ttls)) if found else 0.0


# -- generated replies ---------------------------------------------------------------------------

OWNERS = (b"\x01a\x07example\x00", b"\x04edge\x01a\x07example\x00", b"\xc0\x0c")


def _rdata(rtype: int, n: int) -> bytes:
    if rtype == 1:
        return bytes([203, 0, 113, n])
    if rtype == 28:
        return bytes.fromhex("20010db8") + bytes(11) + bytes([n])
    if rtype == 5:
        return OWNERS[1]
    return b"\x03txt"


RECORD = st.tuples(
    st.sampled_from(OWNERS),
    st.sampled_from((1, 28, 5, 16)),  # A, AAAA, CNAME, TXT
    st.sampled_from((1, 1, 1, 3, 4)),  # IN mostly, CH, HS (whose A is opaque data)
    st.one_of(st.integers(0, 86400), st.integers(0x7FFFFFF0, 0xFFFFFFFF)),
    st.integers(1, 4),
)


def reply(records: list[tuple[bytes, int, int, int, int]], rcode: int, qtype: int) -> bytes:
    head = struct.pack("!HHHHHH", 7, 0x8180 | rcode, 1, len(records), 0, 0)
    out = head + OWNERS[0] + struct.pack("!HH", qtype, 1)
    for owner, rtype, rclass, ttl, n in records:
        data = _rdata(rtype, n)
        out += owner + struct.pack("!HHIH", rtype, rclass, ttl, len(data)) + data
    return out


@settings(max_examples=400, deadline=None)
@given(
    st.lists(RECORD, max_size=6),
    st.sampled_from((0, 0, 2, 3, 5)),
    st.sampled_from((1, 28)),
    st.one_of(st.none(), st.tuples(st.integers(0, 200), st.integers(0, 255))),
    st.booleans(),
)
def test_one_read_gives_what_the_three_readers_gave(
    records: list[tuple[bytes, int, int, int, int]],
    rcode: int,
    qtype: int,
    flip: tuple[int, int] | None,
    cut: bool,
) -> None:
    wire = reply(records, rcode, qtype)
    if flip is not None and flip[0] < len(wire):  # a damaged reply
        wire = wire[: flip[0]] + bytes([flip[1]]) + wire[flip[0] + 1 :]
    if cut:
        wire = wire[: len(wire) * 2 // 3]
    got = read_addresses(wire)
    found, ttl = old_addresses_and_ttl(wire)
    # The proxy keeps what it was handed for that TTL.
    mine = (list(got.found), float(got.ttl)) if got is not None else ([], 0.0)
    assert mine == (found, ttl)
    # The resolver asks again for AAAA exactly when it did.
    assert (got is not None and got.nodata) == (not old_a_records(wire) and old_nodata(wire))


def test_a_cname_bounds_the_ttl_and_other_classes_are_not_addresses() -> None:
    records = [(OWNERS[0], 5, 1, 5, 1), (OWNERS[1], 1, 1, 600, 9), (OWNERS[1], 1, 4, 60, 8)]
    wire = reply(records, 0, 1)
    got = read_addresses(wire)
    assert got is not None
    assert (
        got.found == (ipaddress.IPv4Address("203.0.113.9"),) and got.ttl == 5
    )  # HS A: not an address
    assert not got.nodata
