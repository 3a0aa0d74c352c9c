"""Address classes as data: which special-purpose block an IP address falls in.

``BLOCKS`` is the single table (network, class, source, note). It holds every
entry of the IANA IPv4 and IPv6 Special-Purpose Address Registries, the
multicast and deprecated blocks those registries leave out, the parts of the
IPv6 space IANA keeps "Reserved by IETF", and the cloud metadata endpoints,
which get their own class because they hand out credentials. The most specific
block containing an address wins, so 169.254.169.254/32 beats 169.254.0.0/16.

IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4,
Teredo) are decoded and judged by the IPv4 inside: a client that can make the
kernel or a translator reach ::ffff:127.0.0.1 has reached 127.0.0.1.
``Classification.via`` still records the form when that IPv4 is public, so a
later layer can refuse transition forms as such.

Pure: no sockets, no DNS.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    collapse_addresses,
    ip_network,
)

__all__ = [
    "BLOCKS",
    "AddressClass",
    "Block",
    "Classification",
    "Embedding",
    "classify",
    "decode_embedded",
    "special_networks",
    "teredo_endpoints",
]


class AddressClass(enum.Enum):
    """What kind of destination an address is. The value is a stable key for logs and
    metrics; ``label`` is the human wording."""

    PUBLIC = "public"
    PRIVATE = "private"
    LOOPBACK = "loopback"
    LINK_LOCAL = "link_local"
    METADATA = "metadata"
    SHARED = "shared_cgnat"
    THIS_NETWORK = "this_network"
    UNSPECIFIED = "unspecified"
    IETF_PROTOCOL = "ietf_protocol"
    DOCUMENTATION = "documentation"
    BENCHMARKING = "benchmarking"
    MULTICAST = "multicast"
    RESERVED = "reserved"
    BROADCAST = "broadcast"
    ANYCAST_SERVICE = "anycast_service"
    ULA = "unique_local"
    SITE_LOCAL = "site_local"
    DISCARD = "discard"
    DUMMY = "dummy"
    IDENTIFIER = "identifier"
    SEGMENT_ROUTING = "segment_routing"
    IPV4_EMBEDDED = "ipv4_embedded"

    @property
    def label(self) -> str:
        return _CLASS_LABELS[self]


_CLASS_LABELS: dict[AddressClass, str] = {
    AddressClass.PUBLIC: "Public address",
    AddressClass.PRIVATE: "Private-use network",
    AddressClass.LOOPBACK: "Loopback",
    AddressClass.LINK_LOCAL: "Link-local",
    AddressClass.METADATA: "Cloud metadata or platform endpoint",
    AddressClass.SHARED: "Shared address space (CGNAT)",
    AddressClass.THIS_NETWORK: "This network (0.0.0.0/8)",
    AddressClass.UNSPECIFIED: "Unspecified address",
    AddressClass.IETF_PROTOCOL: "IETF protocol assignment",
    AddressClass.DOCUMENTATION: "Documentation range",
    AddressClass.BENCHMARKING: "Benchmarking range",
    AddressClass.MULTICAST: "Multicast",
    AddressClass.RESERVED: "Reserved",
    AddressClass.BROADCAST: "Limited broadcast",
    AddressClass.ANYCAST_SERVICE: "Special anycast service",
    AddressClass.ULA: "Unique local (IPv6 private)",
    AddressClass.SITE_LOCAL: "Site-local (deprecated)",
    AddressClass.DISCARD: "Discard-only prefix",
    AddressClass.DUMMY: "Dummy address or prefix",
    AddressClass.IDENTIFIER: "Identifier prefix, not a locator",
    AddressClass.SEGMENT_ROUTING: "SRv6 segment identifier",
    AddressClass.IPV4_EMBEDDED: "IPv6 form carrying an IPv4 address",
}


class Embedding(enum.Enum):
    """An IPv6 form that carries an IPv4 address."""

    IPV4_MAPPED = "ipv4_mapped"
    IPV4_COMPATIBLE = "ipv4_compatible"
    NAT64 = "nat64"
    NAT64_LOCAL = "nat64_local"
    SIX_TO_FOUR = "six_to_four"
    TEREDO = "teredo"

    @property
    def label(self) -> str:
        return _EMBEDDING_LABELS[self]


_EMBEDDING_LABELS: dict[Embedding, str] = {
    Embedding.IPV4_MAPPED: "IPv4-mapped IPv6 (::ffff:a.b.c.d)",
    Embedding.IPV4_COMPATIBLE: "IPv4-compatible IPv6, deprecated (::a.b.c.d)",
    Embedding.NAT64: "NAT64 well-known prefix (64:ff9b::/96)",
    Embedding.NAT64_LOCAL: "NAT64 local-use prefix (64:ff9b:1::/48)",
    Embedding.SIX_TO_FOUR: "6to4 (2002::/16)",
    Embedding.TEREDO: "Teredo (2001::/32)",
}


@dataclass(frozen=True)
class Block:
    """One row of the table."""

    network: IPv4Network | IPv6Network
    cls: AddressClass
    source: str  # where the row comes from: "RFC 1918", "AWS docs"
    note: str


@dataclass(frozen=True)
class Classification:
    """The verdict on one address.

    For embedded forms, ``cls`` and ``block`` are those of ``embedded`` (the IPv4
    that judged it) and ``outer`` is the IPv6 row of the wrapper itself (e.g. the
    2002::/16 6to4 row).
    """

    address: IPv4Address | IPv6Address
    cls: AddressClass
    block: Block | None
    embedded: IPv4Address | None = None
    via: Embedding | None = None
    outer: Block | None = None

    @property
    def special(self) -> bool:
        return self.cls is not AddressClass.PUBLIC


_C = AddressClass

# (network, class, source, note). Order is irrelevant: lookup takes the longest prefix.
_ROWS: tuple[tuple[str, AddressClass, str, str], ...] = (
    # IANA IPv4 Special-Purpose Address Registry
    ("0.0.0.0/8", _C.THIS_NETWORK, "RFC 791", '"this network"; Linux routes 0.x to the host'),
    ("0.0.0.0/32", _C.UNSPECIFIED, "RFC 1122", '"this host"; connect() to it reaches the host'),
    ("10.0.0.0/8", _C.PRIVATE, "RFC 1918", "private-use"),
    ("100.64.0.0/10", _C.SHARED, "RFC 6598", "shared address space (carrier NAT, Tailscale)"),
    ("127.0.0.0/8", _C.LOOPBACK, "RFC 1122", "loopback"),
    ("169.254.0.0/16", _C.LINK_LOCAL, "RFC 3927", "link-local; most metadata services live here"),
    ("172.16.0.0/12", _C.PRIVATE, "RFC 1918", "private-use"),
    ("192.0.0.0/24", _C.IETF_PROTOCOL, "RFC 6890", "IETF protocol assignments"),
    ("192.0.0.0/29", _C.IETF_PROTOCOL, "RFC 7335", "IPv4 service continuity prefix (DS-Lite)"),
    ("192.0.0.8/32", _C.DUMMY, "RFC 7600", "IPv4 dummy address"),
    ("192.0.0.9/32", _C.ANYCAST_SERVICE, "RFC 7723", "Port Control Protocol anycast"),
    ("192.0.0.10/32", _C.ANYCAST_SERVICE, "RFC 8155", "TURN anycast"),
    ("192.0.0.170/31", _C.IETF_PROTOCOL, "RFC 8880", "NAT64/DNS64 discovery (ipv4only.arpa)"),
    ("192.0.2.0/24", _C.DOCUMENTATION, "RFC 5737", "TEST-NET-1"),
    ("192.31.196.0/24", _C.ANYCAST_SERVICE, "RFC 7535", "AS112-v4"),
    ("192.52.193.0/24", _C.ANYCAST_SERVICE, "RFC 7450", "AMT relay anycast"),
    ("192.88.99.0/24", _C.ANYCAST_SERVICE, "RFC 7526", "6to4 relay anycast, deprecated"),
    ("192.88.99.2/32", _C.ANYCAST_SERVICE, "RFC 6751", "6a44 relay anycast"),
    ("192.168.0.0/16", _C.PRIVATE, "RFC 1918", "private-use"),
    ("192.175.48.0/24", _C.ANYCAST_SERVICE, "RFC 7534", "AS112 direct delegation"),
    ("198.18.0.0/15", _C.BENCHMARKING, "RFC 2544", "benchmarking"),
    ("198.51.100.0/24", _C.DOCUMENTATION, "RFC 5737", "TEST-NET-2"),
    ("203.0.113.0/24", _C.DOCUMENTATION, "RFC 5737", "TEST-NET-3"),
    ("240.0.0.0/4", _C.RESERVED, "RFC 1112", "reserved (former class E)"),
    ("255.255.255.255/32", _C.BROADCAST, "RFC 8190", "limited broadcast"),
    # IPv4 blocks outside that registry
    ("224.0.0.0/4", _C.MULTICAST, "RFC 5771", "multicast"),
    ("233.252.0.0/24", _C.DOCUMENTATION, "RFC 6676", "MCAST-TEST-NET"),
    # IANA IPv6 Special-Purpose Address Registry
    ("::/128", _C.UNSPECIFIED, "RFC 4291", "unspecified; connect() to it reaches the host"),
    ("::1/128", _C.LOOPBACK, "RFC 4291", "loopback"),
    ("::ffff:0:0/96", _C.IPV4_EMBEDDED, "RFC 4291", "IPv4-mapped"),
    ("64:ff9b::/96", _C.IPV4_EMBEDDED, "RFC 6052", "NAT64 well-known prefix"),
    ("64:ff9b:1::/48", _C.IPV4_EMBEDDED, "RFC 8215", "NAT64 local-use prefix"),
    ("100::/64", _C.DISCARD, "RFC 6666", "discard-only (remote triggered blackhole)"),
    ("100:0:0:1::/64", _C.DUMMY, "RFC 9780", "dummy IPv6 prefix"),
    ("2001::/23", _C.IETF_PROTOCOL, "RFC 2928", "IETF protocol assignments"),
    ("2001::/32", _C.IPV4_EMBEDDED, "RFC 4380", "Teredo"),
    ("2001:1::1/128", _C.ANYCAST_SERVICE, "RFC 7723", "Port Control Protocol anycast"),
    ("2001:1::2/128", _C.ANYCAST_SERVICE, "RFC 8155", "TURN anycast"),
    ("2001:1::3/128", _C.ANYCAST_SERVICE, "RFC 9665", "DNS-SD service registration anycast"),
    ("2001:2::/48", _C.BENCHMARKING, "RFC 5180", "benchmarking"),
    ("2001:3::/32", _C.ANYCAST_SERVICE, "RFC 7450", "AMT"),
    ("2001:4:112::/48", _C.ANYCAST_SERVICE, "RFC 7535", "AS112-v6"),
    ("2001:10::/28", _C.IDENTIFIER, "RFC 4843", "ORCHID, deprecated"),
    ("2001:20::/28", _C.IDENTIFIER, "RFC 7343", "ORCHIDv2"),
    ("2001:30::/28", _C.IDENTIFIER, "RFC 9374", "drone remote ID entity tags (DET)"),
    ("2001:db8::/32", _C.DOCUMENTATION, "RFC 3849", "documentation"),
    ("2002::/16", _C.IPV4_EMBEDDED, "RFC 3056", "6to4"),
    ("2620:4f:8000::/48", _C.ANYCAST_SERVICE, "RFC 7534", "AS112 direct delegation"),
    ("3fff::/20", _C.DOCUMENTATION, "RFC 9637", "documentation"),
    ("5f00::/16", _C.SEGMENT_ROUTING, "RFC 9602", "SRv6 SIDs"),
    ("fc00::/7", _C.ULA, "RFC 4193", "unique local"),
    ("fe80::/10", _C.LINK_LOCAL, "RFC 4291", "link-local unicast"),
    # IPv6 blocks outside that registry
    ("::/96", _C.IPV4_EMBEDDED, "RFC 4291", "IPv4-compatible, deprecated"),
    ("fec0::/10", _C.SITE_LOCAL, "RFC 3879", "site-local, deprecated"),
    ("ff00::/8", _C.MULTICAST, "RFC 4291", "multicast"),
    # The IANA IPv6 Address Space registry's "Reserved by IETF" rows: everything outside
    # 2000::/3 and the unicast/multicast blocks above. Nothing an agent needs lives there.
    ("::/8", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("100::/8", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("200::/7", _C.RESERVED, "RFC 4048", "reserved by IETF (former NSAP)"),
    ("400::/6", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("800::/5", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("1000::/4", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("4000::/3", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("6000::/3", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("8000::/3", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("a000::/3", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("c000::/3", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("e000::/4", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("f000::/5", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("f800::/6", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    ("fe00::/9", _C.RESERVED, "RFC 4291", "reserved by IETF"),
    # Cloud metadata and platform endpoints: credentials and instance secrets.
    ("169.254.169.254/32", _C.METADATA, "provider docs", "IMDS: AWS, GCP, Azure, OCI, OpenStack"),
    ("169.254.169.253/32", _C.METADATA, "AWS docs", "Amazon VPC DNS resolver"),
    ("169.254.169.123/32", _C.METADATA, "AWS docs", "Amazon Time Sync (NTP)"),
    ("169.254.170.2/32", _C.METADATA, "AWS docs", "ECS task metadata and credentials"),
    ("169.254.170.23/32", _C.METADATA, "AWS docs", "EKS Pod Identity agent"),
    ("169.254.0.23/32", _C.METADATA, "Tencent Cloud docs", "Tencent Cloud metadata"),
    ("169.254.42.42/32", _C.METADATA, "Scaleway docs", "Scaleway metadata"),
    ("100.100.100.200/32", _C.METADATA, "Alibaba Cloud docs", "Alibaba Cloud metadata"),
    ("192.0.0.192/32", _C.METADATA, "Oracle docs", "Oracle Cloud metadata (classic)"),
    ("168.63.129.16/32", _C.METADATA, "Azure docs", "WireServer; public address, platform use"),
    ("fd00:ec2::254/128", _C.METADATA, "AWS docs", "EC2 instance metadata over IPv6"),
    ("fd00:ec2::253/128", _C.METADATA, "AWS docs", "Amazon VPC DNS resolver over IPv6"),
    ("fd00:ec2::123/128", _C.METADATA, "AWS docs", "Amazon Time Sync over IPv6"),
    ("fd00:ec2::23/128", _C.METADATA, "AWS docs", "EKS Pod Identity agent over IPv6"),
    ("fd20:ce::254/128", _C.METADATA, "GCP docs", "GCE metadata server over IPv6"),
    ("fd00:c1::a9fe:a9fe/128", _C.METADATA, "Oracle docs", "OCI instance metadata over IPv6"),
    ("fd00:42::42/128", _C.METADATA, "Scaleway docs", "Scaleway metadata over IPv6"),
    ("fd00:a9fe:a9fe::1/128", _C.METADATA, "Linode docs", "Akamai/Linode metadata over IPv6"),
    ("fe80::a9fe:a9fe/128", _C.METADATA, "OpenStack docs", "OpenStack metadata over IPv6"),
)

BLOCKS: tuple[Block, ...] = tuple(
    Block(ip_network(net), cls, source, note) for net, cls, source, note in _ROWS
)


def _index(version: int) -> tuple[tuple[int, int, Block], ...]:
    """(network int, mask int, block), longest prefix first, so the first hit is the
    most specific block."""
    rows = sorted(
        (b for b in BLOCKS if b.network.version == version),
        key=lambda b: b.network.prefixlen,
        reverse=True,
    )
    return tuple((int(b.network.network_address), int(b.network.netmask), b) for b in rows)


_INDEX = {4: _index(4), 6: _index(6)}


def _lookup(address: IPv4Address | IPv6Address) -> Block | None:
    value = int(address)  # ignores an IPv6 scope id, which doesn't change the class
    for network, mask, block in _INDEX[address.version]:
        if value & mask == network:
            return block
    return None


# RFC 6052 section 2.2: for each prefix length, the bytes of the IPv6 address that
# hold the IPv4 address. Byte 8 (bits 64-71, the "u" octet) is always skipped.
_RFC6052_BYTES: dict[int, tuple[int, int, int, int]] = {
    32: (4, 5, 6, 7),
    40: (5, 6, 7, 9),
    48: (6, 7, 9, 10),
    56: (7, 9, 10, 11),
    64: (9, 10, 11, 12),
    96: (12, 13, 14, 15),
}


def _rfc6052(packed: bytes, prefix_len: int) -> IPv4Address | None:
    if prefix_len < 96 and packed[8] != 0:
        return None  # u octet must be zero; otherwise it is not this format
    return IPv4Address(bytes(packed[i] for i in _RFC6052_BYTES[prefix_len]))


_NAT64 = IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = IPv6Network("64:ff9b:1::/48")
_SIX_TO_FOUR = IPv6Network("2002::/16")
_TEREDO = IPv6Network("2001::/32")
_V4_MAX = 1 << 32


def teredo_endpoints(address: IPv6Address) -> tuple[IPv4Address, IPv4Address] | None:
    """(server, client) of a Teredo address (RFC 4380 section 4): the server's IPv4 in
    bits 32-63, the client's in bits 96-127 with every bit inverted."""
    if address not in _TEREDO:
        return None
    value = int(address)
    server = IPv4Address((value >> 64) & 0xFFFFFFFF)
    client = IPv4Address((value & 0xFFFFFFFF) ^ 0xFFFFFFFF)
    return server, client


def _candidates(address: IPv6Address) -> tuple[Embedding, tuple[IPv4Address, ...]] | None:
    """The IPv4 addresses an IPv6 address may stand for, most likely reading first.

    More than one reading where the form is ambiguous: Teredo names two hosts, and
    an operator may use any RFC 6052 prefix length inside 64:ff9b:1::/48 (/48, /56,
    /64 or /96), which we cannot know, so each is a reading, the /48 format first.
    """
    mapped = address.ipv4_mapped
    if mapped is not None:
        return Embedding.IPV4_MAPPED, (mapped,)
    value = int(address)
    if 1 < value < _V4_MAX:  # :: and ::1 are IPv6's own unspecified and loopback
        return Embedding.IPV4_COMPATIBLE, (IPv4Address(value),)
    packed = address.packed
    if address in _NAT64:
        return Embedding.NAT64, (IPv4Address(packed[12:]),)
    if address in _NAT64_LOCAL:
        valid = [_rfc6052(packed, length) for length in (48, 56, 64, 96)]
        readings = tuple(r for r in valid if r is not None)
        # A reading in 0.0.0.0/8 is mostly the zero padding of another format (the /96
        # reading of a /48-format address is 0.0.0.0, and vice versa), and no translator
        # forwards to 0/8; counting it would make every local-use address special.
        meaningful = tuple(r for r in readings if int(r) >> 24)
        return Embedding.NAT64_LOCAL, meaningful or readings
    if address in _SIX_TO_FOUR:
        return Embedding.SIX_TO_FOUR, (IPv4Address(packed[2:6]),)
    endpoints = teredo_endpoints(address)
    if endpoints is not None:
        server, client = endpoints
        return Embedding.TEREDO, (client, server)
    return None


def decode_embedded(address: IPv6Address) -> tuple[Embedding, IPv4Address] | None:
    """The form and the primary IPv4 reading (Teredo: the client; NAT64 local-use:
    the /48 format if valid), or None for an IPv6 address carrying no IPv4."""
    found = _candidates(address)
    if found is None:
        return None
    form, readings = found
    return form, readings[0]


def classify(address: IPv4Address | IPv6Address) -> Classification:
    """Class of ``address``; embedded IPv4 forms are judged by the IPv4 inside."""
    if isinstance(address, IPv4Address):
        block = _lookup(address)
        return Classification(address, block.cls if block else AddressClass.PUBLIC, block)
    found = _candidates(address)
    if found is None:
        block = _lookup(address)
        return Classification(address, block.cls if block else AddressClass.PUBLIC, block)
    form, readings = found
    # Several readings: take the first special one, so an ambiguous address is judged
    # by its worst meaning; if all are public, the primary reading stands.
    judged = [(v4, _lookup(v4)) for v4 in readings]
    v4, block = next(((a, b) for a, b in judged if b is not None), judged[0])
    return Classification(
        address=address,
        cls=block.cls if block else AddressClass.PUBLIC,
        block=block,
        embedded=v4,
        via=form,
        outer=_lookup(address),
    )


@functools.cache
def special_networks(version: int) -> tuple[IPv4Network | IPv6Network, ...]:
    """Every special block of one IP version, collapsed: the interval set for nftables.

    For IPv6 this includes the embedding prefixes whole (::ffff:0:0/96, 64:ff9b::/96,
    2002::/16, 2001::/32...), which packet filters cannot judge by the IPv4 inside.
    """
    if version == 4:
        v4 = [b.network for b in BLOCKS if isinstance(b.network, IPv4Network)]
        return tuple(collapse_addresses(v4))
    if version == 6:
        v6 = [b.network for b in BLOCKS if isinstance(b.network, IPv6Network)]
        return tuple(collapse_addresses(v6))
    raise ValueError(f"IP version must be 4 or 6, not {version!r}")
