"""A profile's address-level verdicts over the IPv4 space, for engines without ``decide()``.

The export asks ``decide()`` itself, never re-derives it: the space is cut into CIDR "atoms" that
every network the verdict can depend on (special-purpose blocks, rule networks, the guest pool, the
host) either contains or misses, and the ports into segments that every rule's range either holds
or misses. One address and one port of each (atom, protocol, segment) then stand for all of them.
Each cell is allowed (an allow rule, an exemption, open mode), refused whatever the name (deny
rules, special-purpose space, QUIC, DNS-over-TLS, DNS elsewhere), or left to the names (allowlist
and locked modes: what ``decide()`` says with the name in hand).

Pure: no sockets. IPv6 is refused by ``decide()`` (the gateway routes IPv4 only), so it is one
cell: ``::/0``, refused.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sandgate.policy.classify import BLOCKS
from sandgate.policy.decide import Attempt, Reason, decide
from sandgate.policy.exemptions import special4, subtract
from sandgate.policy.model import Protocol, RuleSpec
from sandgate.policy.profile import Profile

Net4 = ipaddress.IPv4Network
# (protocol, low, high): an inclusive port range; ICMP has no ports and is (ICMP, 0, 0).
PortSet = frozenset[tuple[Protocol, int, int]]
ICMP_CELL = (Protocol.ICMP, 0, 0)
WORLD = ipaddress.IPv4Network("0.0.0.0/0")
# Ports decide() treats on their own whatever the rules say: DNS elsewhere, QUIC, DNS over TLS.
_FIXED_PORTS = (53, 443, 853)


class Cell(enum.Enum):
    ALLOW = "allow"  # by address: an allow rule, an exemption, or open mode
    DENY = "deny"  # whatever the name
    NAMES = "names"  # the names decide (allowlist); locked: nothing opens it


_LEFT_TO_NAMES = (Reason.NOT_ALLOWLISTED, Reason.LOCKED)


@dataclass(frozen=True)
class Plan:
    """Which networks get which ports allowed and refused, grouped by port set."""

    allow: dict[PortSet, list[Net4]]
    deny: dict[PortSet, list[Net4]]


def full_ports() -> PortSet:
    return frozenset({(Protocol.TCP, 1, 65535), (Protocol.UDP, 1, 65535), ICMP_CELL})


def rule_ports(spec: RuleSpec) -> PortSet:
    """The (protocol, range) cells a rule speaks to."""
    out: set[tuple[Protocol, int, int]] = set()
    for proto in spec.protocols:
        if proto is Protocol.ICMP:
            out.add(ICMP_CELL)
        else:
            out |= {(proto, lo, hi) for lo, hi in (spec.ports or ((1, 65535),))}
    return normalise(out)


def normalise(cells: Iterable[tuple[Protocol, int, int]]) -> PortSet:
    """Merge touching ranges per protocol, so equal sets compare equal."""
    out: set[tuple[Protocol, int, int]] = set()
    by_proto: dict[Protocol, list[tuple[int, int]]] = {}
    for proto, lo, hi in cells:
        if proto is Protocol.ICMP:
            out.add(ICMP_CELL)
        else:
            by_proto.setdefault(proto, []).append((lo, hi))
    for proto, ranges in by_proto.items():
        ranges.sort()
        merged = [ranges[0]]
        for lo, hi in ranges[1:]:
            if lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        out |= {(proto, lo, hi) for lo, hi in merged}
    return frozenset(out)


def minus(cells: PortSet, taken: PortSet) -> PortSet:
    """``cells`` without ``taken``."""
    out: list[tuple[Protocol, int, int]] = []
    for proto, lo, hi in cells:
        if proto is Protocol.ICMP:
            if ICMP_CELL not in taken:
                out.append(ICMP_CELL)
            continue
        pieces = [(lo, hi)]
        for tproto, tlo, thi in taken:
            if tproto is not proto:
                continue
            nxt = []
            for a, b in pieces:
                if thi < a or tlo > b:
                    nxt.append((a, b))
                    continue
                if a < tlo:
                    nxt.append((a, tlo - 1))
                if thi < b:
                    nxt.append((thi + 1, b))
            pieces = nxt
        out += [(proto, a, b) for a, b in pieces]
    return normalise(out) if out else frozenset()


def _boundaries(profile: Profile) -> list[Net4]:
    nets: set[Net4] = set(special4(profile.public_override))
    nets |= {b.network for b in BLOCKS if isinstance(b.network, Net4)}
    nets |= {r.spec.network for r in profile.rules() if isinstance(r.spec.network, Net4)}
    nets |= {o for o in profile.public_override if isinstance(o, Net4)}
    if isinstance(profile.guest_pool, Net4):
        nets.add(profile.guest_pool)
    extra = [*profile.host_addresses, profile.gateway_address]
    nets |= {Net4((a, 32)) for a in extra if isinstance(a, ipaddress.IPv4Address)}
    return sorted(nets)


def atoms(boundaries: list[Net4]) -> Iterator[Net4]:
    """The coarsest CIDRs that each boundary network contains or misses whole."""
    work = [WORLD]
    while work:
        net = work.pop()
        if any(b != net and b.subnet_of(net) for b in boundaries):
            work += list(net.subnets())
        else:
            yield net


def _segments(profile: Profile) -> list[tuple[int, int]]:
    points = {1, 65536}
    for rule in profile.rules():
        for lo, hi in rule.spec.ports:
            points |= {lo, hi + 1}
    for port in _FIXED_PORTS:
        points |= {port, port + 1}
    ordered = sorted(points)
    return list(zip(ordered, [p - 1 for p in ordered[1:]], strict=False))


def cell(
    profile: Profile, address: ipaddress.IPv4Address, proto: Protocol, port: int | None
) -> Cell:
    decision = decide(profile, Attempt(proto, address, port))
    if decision.allowed:
        return Cell.ALLOW
    return Cell.NAMES if decision.reason in _LEFT_TO_NAMES else Cell.DENY


def plan(profile: Profile) -> Plan:
    """Every IPv4 atom's allowed and refused port cells, grouped by those sets."""
    segments = _segments(profile)
    allow: dict[PortSet, list[Net4]] = {}
    deny: dict[PortSet, list[Net4]] = {}
    for atom in atoms(_boundaries(profile)):
        addr = atom.network_address
        got: dict[Cell, list[tuple[Protocol, int, int]]] = {c: [] for c in Cell}
        for proto in (Protocol.TCP, Protocol.UDP):
            for lo, hi in segments:
                got[cell(profile, addr, proto, lo)].append((proto, lo, hi))
        got[cell(profile, addr, Protocol.ICMP, None)].append(ICMP_CELL)
        if got[Cell.ALLOW]:
            allow.setdefault(normalise(got[Cell.ALLOW]), []).append(atom)
        if got[Cell.DENY]:
            deny.setdefault(normalise(got[Cell.DENY]), []).append(atom)
    return Plan(
        {k: list(ipaddress.collapse_addresses(v)) for k, v in allow.items()},
        {k: list(ipaddress.collapse_addresses(v)) for k, v in deny.items()},
    )


def cidr_rules(
    nets: list[Net4], public_override: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network] = ()
) -> list[tuple[Net4, list[Net4]]]:
    """A short way to write ``nets`` as (cidr, except) pairs: the whole space less holes when
    that is most of it, a special block less its holes, or the networks themselves."""
    nets = sorted(ipaddress.collapse_addresses(nets))
    if sum(n.num_addresses for n in nets) > WORLD.num_addresses // 2:
        return [(WORLD, subtract([WORLD], nets))]
    out: list[tuple[Net4, list[Net4]]] = []
    rest = list(nets)
    for block in special4(public_override):
        inside = [n for n in rest if n.subnet_of(block)]
        if len(inside) > 1:
            holes = subtract([block], inside)
            if len(holes) < len(inside):
                out.append((block, holes))
                rest = [n for n in rest if n not in inside]
    return out + [(n, []) for n in rest]


__all__ = [
    "ICMP_CELL", "WORLD", "Cell", "Plan", "PortSet", "atoms", "cell", "cidr_rules",
    "full_ports", "minus", "normalise", "plan", "rule_ports",
]  # fmt: skip
