"""Which special-purpose space an allow rule opens, as networks the compiler can write down.

``decide()`` lifts a special-purpose block for an address only when an allow rule's network
lies inside the address's most specific block (policy/decide.py, ``_exempts``). Blocks are
nested or disjoint (they are CIDRs), so for the kernel that is: the rule's network minus the
special blocks strictly inside it. The test world's "internet" (``public_override``) is public.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable

from sandgate.policy.classify import BLOCKS, special_networks
from sandgate.policy.model import IPNetwork


def special4(public_override: Iterable[IPNetwork] = ()) -> list[ipaddress.IPv4Network]:
    """The IPv4 special-purpose space, minus what the test world declares public."""
    nets = [n for n in special_networks(4) if isinstance(n, ipaddress.IPv4Network)]
    return subtract(nets, [o for o in public_override if isinstance(o, ipaddress.IPv4Network)])


def subtract(
    nets: list[ipaddress.IPv4Network], holes: list[ipaddress.IPv4Network]
) -> list[ipaddress.IPv4Network]:
    """``nets`` without ``holes``, collapsed."""
    for hole in holes:
        out: list[ipaddress.IPv4Network] = []
        for net in nets:
            if hole.subnet_of(net):
                out += list(net.address_exclude(hole))
            elif not net.subnet_of(hole):
                out.append(net)
        nets = out
    return sorted(ipaddress.collapse_addresses(nets))


def inner_special(
    net: IPNetwork, public_override: Iterable[IPNetwork] = ()
) -> list[ipaddress.IPv4Network]:
    """Special blocks strictly inside ``net``: an allow rule for ``net`` does not open them."""
    inner = [
        blk.network
        for blk in BLOCKS
        if isinstance(blk.network, ipaddress.IPv4Network)
        and isinstance(net, ipaddress.IPv4Network)
        and blk.network != net
        and blk.network.subnet_of(net)
    ]
    overrides = [o for o in public_override if isinstance(o, ipaddress.IPv4Network)]
    return subtract(sorted(ipaddress.collapse_addresses(inner)), overrides) if inner else []


def _union(spans: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Overlapping or touching spans merged: sorted, disjoint starts and ends."""
    starts: list[int] = []
    ends: list[int] = []
    for lo, hi in sorted(spans):
        if ends and lo <= ends[-1] + 1:
            ends[-1] = max(ends[-1], hi)
        else:
            starts.append(lo)
            ends.append(hi)
    return starts, ends


# The IPv4 special blocks as one sorted union, so a network's overlap is one bisection.
_STARTS4, _ENDS4 = _union(
    (int(b.network.network_address), int(b.network.broadcast_address))
    for b in BLOCKS
    if isinstance(b.network, ipaddress.IPv4Network)
)


def touches_special(net: IPNetwork) -> bool:
    """Does ``net`` overlap any special-purpose block? If not, it has no inner special block
    and is no exemption: the quick test that lets 100,000 rules skip the two above."""
    if not isinstance(net, ipaddress.IPv4Network):
        return True
    lo = int(net.network_address)
    hi = lo | ((1 << (32 - net.prefixlen)) - 1)  # broadcast_address, 10x faster
    i = bisect.bisect_left(_ENDS4, lo)  # the first span that ends at or after lo
    return i < len(_STARTS4) and _STARTS4[i] <= hi


def is_exemption(net: IPNetwork, public_override: Iterable[IPNetwork] = ()) -> bool:
    """Does an allow rule for ``net`` lift a special-purpose block (reason allow.exempt)?"""
    if any(net.version == o.version and net.subnet_of(o) for o in public_override):  # type: ignore[arg-type]
        return False  # the test world's "internet": public there
    return any(
        blk.network.version == net.version and net.subnet_of(blk.network)  # type: ignore[arg-type]
        for blk in BLOCKS
    )


__all__ = ["inner_special", "is_exemption", "special4", "subtract", "touches_special"]


# -- IPv6 (issue 14 part 5), where the uplink has IPv6 ----------------------------------------

# Prefixes no allow rule opens (decide(): ``_V6_UNROUTED``, and transition forms are judged by
# their IPv4, never exempted): the kernel refuses them whole, before the allow rules.
NEVER_EXEMPT6 = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/96",  # IPv4-compatible (and ::, ::1)
        "::ffff:0:0/96",  # IPv4-mapped: on the wire only from raw sockets
        "64:ff9b::/96",  # NAT64
        "64:ff9b:1::/48",  # NAT64 local use
        "2001::/32",  # Teredo
        "2002::/16",  # 6to4
        "fe80::/10",  # link-local
        "ff00::/8",  # multicast
    )
)


def _subtract6(
    nets: Iterable[ipaddress.IPv6Network], holes: Iterable[ipaddress.IPv6Network]
) -> list[ipaddress.IPv6Network]:
    out = list(nets)
    for hole in holes:
        nxt: list[ipaddress.IPv6Network] = []
        for net in out:
            if hole.subnet_of(net):
                nxt += list(net.address_exclude(hole))
            elif not net.subnet_of(hole):
                nxt.append(net)
        out = nxt
    return sorted(ipaddress.collapse_addresses(out))


def special6(public_override: Iterable[IPNetwork] = ()) -> list[ipaddress.IPv6Network]:
    """The IPv6 special-purpose space, minus what the test world declares public."""
    nets = [n for n in special_networks(6) if isinstance(n, ipaddress.IPv6Network)]
    return _subtract6(nets, [o for o in public_override if isinstance(o, ipaddress.IPv6Network)])


def inner_special6(
    net: ipaddress.IPv6Network, public_override: Iterable[IPNetwork] = ()
) -> list[ipaddress.IPv6Network]:
    """Special IPv6 blocks strictly inside ``net``: an allow rule for ``net`` does not open them."""
    inner = [
        blk.network
        for blk in BLOCKS
        if isinstance(blk.network, ipaddress.IPv6Network)
        and blk.network != net
        and blk.network.subnet_of(net)
    ]
    overrides = [o for o in public_override if isinstance(o, ipaddress.IPv6Network)]
    return _subtract6(sorted(ipaddress.collapse_addresses(inner)), overrides) if inner else []
