"""Address classification: every registry row at its edges, every embedded form."""

from __future__ import annotations

import re
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    collapse_addresses,
    ip_address,
    ip_network,
)

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.policy.classify import (
    BLOCKS,
    AddressClass,
    Block,
    Embedding,
    classify,
    decode_embedded,
    special_networks,
    teredo_endpoints,
)

C = AddressClass
E = Embedding

# The IANA IPv4 and IPv6 Special-Purpose Address Registries (2025), plus the blocks they leave out
# that the table must still hold. Every one must be a row of BLOCKS.
REGISTRY = [
    "0.0.0.0/8",
    "0.0.0.0/32",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.0.0/29",
    "192.0.0.8/32",
    "192.0.0.9/32",
    "192.0.0.10/32",
    "192.0.0.170/31",
    "192.0.2.0/24",
    "192.31.196.0/24",
    "192.52.193.0/24",
    "192.88.99.0/24",
    "192.88.99.2/32",
    "192.168.0.0/16",
    "192.175.48.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "224.0.0.0/4",
    "::1/128",
    "::/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "100:0:0:1::/64",
    "2001::/23",
    "2001::/32",
    "2001:1::1/128",
    "2001:1::2/128",
    "2001:1::3/128",
    "2001:2::/48",
    "2001:3::/32",
    "2001:4:112::/48",
    "2001:10::/28",
    "2001:20::/28",
    "2001:30::/28",
    "2001:db8::/32",
    "2002::/16",
    "2620:4f:8000::/48",
    "3fff::/20",
    "5f00::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
    "::/96",
]

METADATA = [
    "169.254.169.254",
    "169.254.170.2",
    "169.254.170.23",
    "169.254.169.253",
    "169.254.169.123",
    "169.254.0.23",
    "169.254.42.42",
    "100.100.100.200",
    "192.0.0.192",
    "168.63.129.16",
    "fd00:ec2::254",
    "fd00:ec2::23",
    "fd00:ec2::253",
    "fd00:ec2::123",
    "fd20:ce::254",
    "fd00:c1::a9fe:a9fe",
    "fd00:42::42",
    "fd00:a9fe:a9fe::1",
    "fe80::a9fe:a9fe",
]


def p(address: str, cls: AddressClass, note: str = "") -> object:
    return pytest.param(address, cls, id=f"{address} {note}".strip())


# Like smokescreen's TestClassifyAddr: each block's inside and its just-outside neighbours.
EDGES = [
    p("0.0.0.0", C.UNSPECIFIED),
    p("0.0.0.1", C.THIS_NETWORK),
    p("0.255.255.255", C.THIS_NETWORK),
    p("1.0.0.0", C.PUBLIC, "just above 0/8"),
    p("9.255.255.255", C.PUBLIC, "just below 10/8"),
    p("10.0.0.0", C.PRIVATE),
    p("10.255.255.255", C.PRIVATE),
    p("11.0.0.0", C.PUBLIC, "just above 10/8"),
    p("100.63.255.255", C.PUBLIC, "just below CGNAT"),
    p("100.64.0.0", C.SHARED),
    p("100.127.255.255", C.SHARED),
    p("100.128.0.0", C.PUBLIC, "just above CGNAT"),
    p("100.100.100.199", C.SHARED, "next to Alibaba metadata"),
    p("100.100.100.200", C.METADATA, "Alibaba"),
    p("126.255.255.255", C.PUBLIC),
    p("127.0.0.0", C.LOOPBACK),
    p("127.0.0.1", C.LOOPBACK),
    p("127.255.255.255", C.LOOPBACK),
    p("128.0.0.0", C.PUBLIC),
    p("169.253.255.255", C.PUBLIC),
    p("169.254.0.0", C.LINK_LOCAL),
    p("169.254.169.253", C.METADATA, "AWS DNS"),
    p("169.254.169.254", C.METADATA),
    p("169.254.169.255", C.LINK_LOCAL, "just above IMDS"),
    p("169.254.170.2", C.METADATA, "ECS"),
    p("169.254.170.3", C.LINK_LOCAL),
    p("169.254.255.255", C.LINK_LOCAL),
    p("169.255.0.0", C.PUBLIC),
    p("172.15.255.255", C.PUBLIC),
    p("172.16.0.0", C.PRIVATE),
    p("172.31.255.255", C.PRIVATE),
    p("172.32.0.0", C.PUBLIC),
    p("191.255.255.255", C.PUBLIC),
    p("192.0.0.0", C.IETF_PROTOCOL, "DS-Lite /29"),
    p("192.0.0.7", C.IETF_PROTOCOL),
    p("192.0.0.8", C.DUMMY),
    p("192.0.0.9", C.ANYCAST_SERVICE, "PCP"),
    p("192.0.0.10", C.ANYCAST_SERVICE, "TURN"),
    p("192.0.0.11", C.IETF_PROTOCOL),
    p("192.0.0.169", C.IETF_PROTOCOL),
    p("192.0.0.170", C.IETF_PROTOCOL, "NAT64 discovery"),
    p("192.0.0.171", C.IETF_PROTOCOL, "NAT64 discovery"),
    p("192.0.0.192", C.METADATA, "Oracle"),
    p("192.0.0.255", C.IETF_PROTOCOL),
    p("192.0.1.0", C.PUBLIC),
    p("192.0.2.0", C.DOCUMENTATION),
    p("192.0.2.255", C.DOCUMENTATION),
    p("192.0.3.0", C.PUBLIC),
    p("192.31.195.255", C.PUBLIC),
    p("192.31.196.1", C.ANYCAST_SERVICE, "AS112"),
    p("192.31.197.0", C.PUBLIC),
    p("192.52.193.1", C.ANYCAST_SERVICE, "AMT"),
    p("192.52.194.0", C.PUBLIC),
    p("192.88.98.255", C.PUBLIC),
    p("192.88.99.1", C.ANYCAST_SERVICE, "6to4 relay"),
    p("192.88.99.2", C.ANYCAST_SERVICE, "6a44"),
    p("192.88.100.0", C.PUBLIC),
    p("192.167.255.255", C.PUBLIC),
    p("192.168.0.0", C.PRIVATE),
    p("192.168.255.255", C.PRIVATE),
    p("192.169.0.0", C.PUBLIC),
    p("192.175.48.1", C.ANYCAST_SERVICE),
    p("192.175.49.0", C.PUBLIC),
    p("198.17.255.255", C.PUBLIC),
    p("198.18.0.0", C.BENCHMARKING),
    p("198.19.255.255", C.BENCHMARKING),
    p("198.20.0.0", C.PUBLIC),
    p("198.51.99.255", C.PUBLIC),
    p("198.51.100.1", C.DOCUMENTATION),
    p("198.51.101.0", C.PUBLIC),
    p("203.0.112.255", C.PUBLIC),
    p("203.0.113.10", C.DOCUMENTATION),
    p("203.0.114.0", C.PUBLIC),
    p("223.255.255.255", C.PUBLIC),
    p("224.0.0.1", C.MULTICAST),
    p("233.252.0.1", C.DOCUMENTATION, "MCAST-TEST-NET"),
    p("239.255.255.255", C.MULTICAST),
    p("240.0.0.0", C.RESERVED),
    p("255.255.255.254", C.RESERVED),
    p("255.255.255.255", C.BROADCAST),
    p("168.63.129.16", C.METADATA, "Azure WireServer"),
    p("168.63.129.17", C.PUBLIC),
    p("8.8.8.8", C.PUBLIC),
    # IPv6
    p("::", C.UNSPECIFIED),
    p("::1", C.LOOPBACK),
    p("::1:0:0:0", C.RESERVED, "in ::/8, outside ::/96"),
    p("100::", C.DISCARD),
    p("100::ffff:ffff:ffff:ffff", C.DISCARD),
    p("100:0:0:1::1", C.DUMMY),
    p("100:0:0:2::", C.RESERVED),
    p("1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", C.RESERVED, "just below 2000::/3"),
    p("2000::", C.PUBLIC),
    p("2001:1::", C.IETF_PROTOCOL),
    p("2001:1::1", C.ANYCAST_SERVICE),
    p("2001:1::2", C.ANYCAST_SERVICE),
    p("2001:1::3", C.ANYCAST_SERVICE),
    p("2001:1::4", C.IETF_PROTOCOL),
    p("2001:2::1", C.BENCHMARKING),
    p("2001:2:1::", C.IETF_PROTOCOL),
    p("2001:3::1", C.ANYCAST_SERVICE, "AMT"),
    p("2001:4:112::1", C.ANYCAST_SERVICE, "AS112"),
    p("2001:4:113::", C.IETF_PROTOCOL),
    p("2001:10::1", C.IDENTIFIER, "ORCHID"),
    p("2001:20::1", C.IDENTIFIER, "ORCHIDv2"),
    p("2001:30::1", C.IDENTIFIER, "DET"),
    p("2001:40::", C.IETF_PROTOCOL),
    p("2001:1ff:ffff:ffff::", C.IETF_PROTOCOL, "top of 2001::/23"),
    p("2001:200::", C.PUBLIC, "just above 2001::/23"),
    p("2001:db7:ffff::", C.PUBLIC),
    p("2001:db8::1", C.DOCUMENTATION),
    p("2001:db9::", C.PUBLIC),
    p("2620:4f:8000::1", C.ANYCAST_SERVICE),
    p("2620:4f:8001::", C.PUBLIC),
    p("2606:4700::1111", C.PUBLIC),
    p("3ffe:ffff::", C.PUBLIC),
    p("3fff::1", C.DOCUMENTATION),
    p("3fff:fff::", C.DOCUMENTATION),
    p("3fff:1000::", C.PUBLIC),
    p("4000::1", C.RESERVED),
    p("5f00::1", C.SEGMENT_ROUTING),
    p("fbff:ffff::", C.RESERVED),
    p("fc00::1", C.ULA),
    p("fdff:ffff::", C.ULA),
    p("fd00:ec2::254", C.METADATA),
    p("fd00:ec2::255", C.ULA),
    p("fe00::", C.RESERVED),
    p("fe80::1", C.LINK_LOCAL),
    p("fe80::a9fe:a9fe", C.METADATA, "OpenStack"),
    p("febf:ffff::", C.LINK_LOCAL),
    p("fec0::1", C.SITE_LOCAL),
    p("ff02::1", C.MULTICAST),
]


@pytest.mark.parametrize(("address", "cls"), EDGES)
def test_edges(address: str, cls: AddressClass) -> None:
    result = classify(ip_address(address))
    assert result.cls is cls
    assert result.special is (cls is not C.PUBLIC)
    assert (result.block is None) is (cls is C.PUBLIC)


@pytest.mark.parametrize("network", REGISTRY)
def test_every_registry_entry_is_a_row(network: str) -> None:
    assert ip_network(network) in {b.network for b in BLOCKS}


@pytest.mark.parametrize("address", METADATA)
def test_metadata_endpoints(address: str) -> None:
    result = classify(ip_address(address))
    assert result.cls is C.METADATA
    assert result.block is not None
    assert result.block.network.num_addresses == 1


def _reference(address: IPv4Address | IPv6Address) -> Block | None:
    """The longest-prefix block, by brute force."""
    inside = [b for b in BLOCKS if b.network.version == address.version and address in b.network]
    return max(inside, key=lambda b: b.network.prefixlen, default=None)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: str(b.network))
def test_every_row_judges_its_own_edges(block: Block) -> None:
    net = block.network
    for address in (net.network_address, net.broadcast_address):
        if address.version == 6 and decode_embedded(IPv6Address(int(address))) is not None:
            continue  # embedded forms are judged by their IPv4; tested below
        assert classify(address).block == _reference(address)
        if _reference(address) is block:
            assert classify(address).cls is block.cls


@given(st.ip_addresses(v=4))
def test_v4_matches_brute_force(address: IPv4Address) -> None:
    assert classify(address).block == _reference(address)


@given(st.ip_addresses(v=6))
def test_v6_matches_brute_force_outside_embeddings(address: IPv6Address) -> None:
    if decode_embedded(address) is None:
        assert classify(address).block == _reference(address)


def test_table_is_well_formed() -> None:
    networks = [b.network for b in BLOCKS]
    assert len(networks) == len(set(networks)), "a network is listed twice"
    for block in BLOCKS:
        assert block.cls is not C.PUBLIC
        assert block.source and block.note
    # Everything outside 2000::/3 is in some IPv6 row: nothing there classifies as public.
    v6 = [n for n in networks if isinstance(n, IPv6Network)]
    assert list(collapse_addresses([*v6, IPv6Network("2000::/3")])) == [IPv6Network("::/0")]


def test_enum_keys_and_labels() -> None:
    for member in [*AddressClass, *Embedding]:
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", member.value), member
        assert member.label
    assert len({m.label for m in AddressClass}) == len(AddressClass)


def test_scope_id_is_ignored() -> None:
    assert classify(IPv6Address("fe80::1%eth0")).cls is C.LINK_LOCAL
    assert classify(IPv6Address("fe80::a9fe:a9fe%2")).cls is C.METADATA


# ---- embedded IPv4 forms -------------------------------------------------------------


def mapped(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(0xFFFF << 32 | int(v4))


def compatible(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(int(v4))


def nat64(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(int(IPv6Address("64:ff9b::")) | int(v4))


def nat64_local(v4: IPv4Address) -> IPv6Address:
    """RFC 6052 /48 format: two bytes before the u octet, two after."""
    b = v4.packed
    return IPv6Address(IPv6Address("64:ff9b:1::").packed[:6] + b[:2] + b"\0" + b[2:] + bytes(5))


def six_to_four(v4: IPv4Address) -> IPv6Address:
    return IPv6Address(0x2002 << 112 | int(v4) << 80 | 1)


def teredo(server: IPv4Address, client: IPv4Address, port: int = 40000) -> IPv6Address:
    value = 0x20010000 << 96 | int(server) << 64 | 0x8000 << 48
    return IPv6Address(value | (port ^ 0xFFFF) << 32 | int(client) ^ 0xFFFFFFFF)


FORMS = [
    pytest.param(mapped, E.IPV4_MAPPED, id="mapped"),
    pytest.param(compatible, E.IPV4_COMPATIBLE, id="compatible"),
    pytest.param(nat64, E.NAT64, id="nat64"),
    pytest.param(nat64_local, E.NAT64_LOCAL, id="nat64-local"),
    pytest.param(six_to_four, E.SIX_TO_FOUR, id="6to4"),
    pytest.param(lambda v4: teredo(IPv4Address("65.54.227.120"), v4), E.TEREDO, id="teredo"),
]
INNER = [
    ("10.0.0.1", C.PRIVATE),
    ("192.168.1.1", C.PRIVATE),
    ("127.0.0.1", C.LOOPBACK),
    ("169.254.169.254", C.METADATA),
    ("100.100.100.200", C.METADATA),
    ("100.64.0.1", C.SHARED),
    ("0.0.0.0", C.UNSPECIFIED),
    ("8.8.8.8", C.PUBLIC),
    ("1.1.1.1", C.PUBLIC),
]


@pytest.mark.parametrize(("form", "via"), FORMS)
@pytest.mark.parametrize(("inner", "cls"), INNER)
def test_embedded_forms(form: object, via: Embedding, inner: str, cls: AddressClass) -> None:
    v4 = IPv4Address(inner)
    address = form(v4)  # type: ignore[operator]
    result = classify(address)
    if via is E.IPV4_COMPATIBLE and int(v4) <= 1:  # :: and ::1 are IPv6's own addresses
        assert (result.cls, result.via) == (C.UNSPECIFIED, None)
        return
    assert (result.cls, result.embedded, result.via) == (cls, v4, via)
    assert result.block == classify(v4).block
    assert result.outer is not None and result.outer.cls is C.IPV4_EMBEDDED


@pytest.mark.parametrize(
    ("text", "cls", "embedded", "via"),
    [
        ("::ffff:169.254.169.254", C.METADATA, "169.254.169.254", E.IPV4_MAPPED),
        ("::ffff:a9fe:a9fe", C.METADATA, "169.254.169.254", E.IPV4_MAPPED),
        ("::ffff:7f00:1", C.LOOPBACK, "127.0.0.1", E.IPV4_MAPPED),
        ("0:0:0:0:0:ffff:8.8.8.8", C.PUBLIC, "8.8.8.8", E.IPV4_MAPPED),
        ("::127.0.0.1", C.LOOPBACK, "127.0.0.1", E.IPV4_COMPATIBLE),
        ("::2", C.THIS_NETWORK, "0.0.0.2", E.IPV4_COMPATIBLE),
        ("::ffff:ffff", C.BROADCAST, "255.255.255.255", E.IPV4_COMPATIBLE),
        ("64:ff9b::a9fe:a9fe", C.METADATA, "169.254.169.254", E.NAT64),
        ("64:ff9b::192.168.0.1", C.PRIVATE, "192.168.0.1", E.NAT64),
        ("64:ff9b:1:a9fe:a9:fe00::", C.METADATA, "169.254.169.254", E.NAT64_LOCAL),
        ("2002:a9fe:a9fe::1", C.METADATA, "169.254.169.254", E.SIX_TO_FOUR),
        ("2002:7f00:1::", C.LOOPBACK, "127.0.0.1", E.SIX_TO_FOUR),
        ("2002:808:808::1", C.PUBLIC, "8.8.8.8", E.SIX_TO_FOUR),
        # RFC 4380's example: server 65.54.227.120, client 192.0.2.45 (documentation).
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", C.DOCUMENTATION, "192.0.2.45", E.TEREDO),
    ],
)
def test_embedded_examples(text: str, cls: AddressClass, embedded: str, via: Embedding) -> None:
    result = classify(IPv6Address(text))
    assert (result.cls, str(result.embedded), result.via) == (cls, embedded, via)


def test_not_embedded() -> None:
    for text in ("::", "::1", "2001:db8::1", "fe80::1", "2606:4700::1111"):
        result = classify(IPv6Address(text))
        assert result.via is None and result.embedded is None
        assert decode_embedded(IPv6Address(text)) is None


def test_teredo_endpoints() -> None:
    address = IPv6Address("2001:0:4136:e378:8000:63bf:3fff:fdd2")
    assert teredo_endpoints(address) == (IPv4Address("65.54.227.120"), IPv4Address("192.0.2.45"))
    assert teredo_endpoints(IPv6Address("2001:db8::1")) is None


@pytest.mark.parametrize(
    ("server", "client", "cls", "judged_by"),
    [
        ("65.54.227.120", "10.0.0.1", C.PRIVATE, "client"),
        ("169.254.169.254", "8.8.8.8", C.METADATA, "server"),
        ("127.0.0.1", "10.0.0.1", C.PRIVATE, "client"),  # both special: the client's class
        ("65.54.227.120", "8.8.8.8", C.PUBLIC, "client"),
    ],
)
def test_teredo_worse_of_server_and_client(
    server: str, client: str, cls: AddressClass, judged_by: str
) -> None:
    result = classify(teredo(IPv4Address(server), IPv4Address(client)))
    assert result.cls is cls and result.via is E.TEREDO
    assert str(result.embedded) == (client if judged_by == "client" else server)


@pytest.mark.parametrize(
    ("text", "cls", "embedded"),
    [
        # /48 format (RFC 6052 2.2): two bytes, the zero u octet, two bytes, zero suffix.
        ("64:ff9b:1:808:8:800::", C.PUBLIC, "8.8.8.8"),
        ("64:ff9b:1:7f00:0:100::", C.LOOPBACK, "127.0.0.1"),
        # A /96 prefix inside the local-use /48: the /48 reading is zero padding.
        ("64:ff9b:1::a9fe:a9fe", C.METADATA, "169.254.169.254"),
        # A /96 prefix whose operator bits make the /48 reading public (1.0.0.0).
        ("64:ff9b:1:100::a9fe:a9fe", C.METADATA, "169.254.169.254"),
        # u octet set: only the /96 reading is an RFC 6052 address.
        ("64:ff9b:1:808:ff08:808:a9fe:a9fe", C.METADATA, "169.254.169.254"),
        ("64:ff9b:1:808:ff08:808:808:808", C.PUBLIC, "8.8.8.8"),
        ("64:ff9b:1::", C.UNSPECIFIED, "0.0.0.0"),
        ("64:ff9b:1:800:8:800::", C.PUBLIC, "8.0.8.8"),  # the /56 reading 0.8.8.0 is padding
    ],
)
def test_nat64_local_readings(text: str, cls: AddressClass, embedded: str) -> None:
    result = classify(IPv6Address(text))
    assert (result.cls, str(result.embedded), result.via) == (cls, embedded, E.NAT64_LOCAL)


@given(st.ip_addresses(v=4))
def test_mapped_is_judged_like_plain_v4(v4: IPv4Address) -> None:
    plain = classify(v4)
    result = classify(mapped(v4))
    assert (result.cls, result.block, result.embedded) == (plain.cls, plain.block, v4)


@given(st.ip_addresses(v=4))
def test_other_forms_are_judged_like_plain_v4(v4: IPv4Address) -> None:
    expected = classify(v4).cls
    for form in (nat64, six_to_four):
        assert classify(form(v4)).cls is expected
    if int(v4) > 1:
        assert classify(compatible(v4)).cls is expected
    local = classify(nat64_local(v4))
    if int(v4) >> 24 == 0:
        pass  # 0.0.0.0/8 readings are taken as padding in the local-use prefix
    elif expected is not C.PUBLIC:
        assert local.cls is expected
    else:  # a public /48 reading loses only to a special /56 or /64 reading
        assert local.cls is C.PUBLIC or local.embedded != v4


@given(st.ip_addresses(v=4), st.ip_addresses(v=4), st.integers(0, 65535))
def test_teredo_property(server: IPv4Address, client: IPv4Address, port: int) -> None:
    result = classify(teredo(server, client, port))
    client_cls, server_cls = classify(client).cls, classify(server).cls
    assert result.cls is (client_cls if client_cls is not C.PUBLIC else server_cls)
    assert teredo_endpoints(result.address) == (server, client)  # type: ignore[arg-type]


@given(st.ip_addresses(v=6))
def test_embedded_verdict_is_its_ipv4s(address: IPv6Address) -> None:
    result = classify(address)
    if result.embedded is not None:
        assert classify(result.embedded).cls is result.cls


# ---- the nftables view ---------------------------------------------------------------


@given(st.ip_addresses(v=4))
def test_special_networks_v4_agree_with_classify(address: IPv4Address) -> None:
    inside = any(address in net for net in special_networks(4))
    assert inside is classify(address).special


def test_special_networks_are_collapsed_and_cover_every_row() -> None:
    v4 = [n for n in special_networks(4) if isinstance(n, IPv4Network)]
    v6 = [n for n in special_networks(6) if isinstance(n, IPv6Network)]
    assert (len(v4), len(v6)) == (len(special_networks(4)), len(special_networks(6)))
    assert list(collapse_addresses(v4)) == v4
    assert list(collapse_addresses(v6)) == v6
    for block in BLOCKS:
        net = block.network
        if isinstance(net, IPv4Network):
            assert any(net.subnet_of(n) for n in v4)
        else:
            assert any(net.subnet_of(n) for n in v6)
    # Packet filters cannot look inside: the embedding prefixes are dropped whole.
    for wrapper in ("::ffff:0:0/96", "64:ff9b::/96", "2002::/16", "2001::/32"):
        assert any(IPv6Network(wrapper).subnet_of(n) for n in v6)
    with pytest.raises(ValueError, match="4 or 6"):
        special_networks(5)
