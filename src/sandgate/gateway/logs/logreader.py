"""NFLOG packets → events. Pure: a packet and the ruleset's sites in, an event out.

The prefix of each log line names a ``Site`` of the compiled ruleset (net/compile.py), which
carries its ``Decision`` (guest, verdict, reason, rule). The policy tells a decision made for a
whole range which address it met (``at_address``): a drop at the special-ranges site becomes
``deny.private``, ``deny.metadata``, ...
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from sandgate.events.schema import Event, FlowKey, Kind, category_of
from sandgate.net.compile import Site
from sandgate.net.nflog import NflogPacket
from sandgate.policy.decide import at_address
from sandgate.policy.model import IPAddress, Protocol

PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 58: "ipv6-icmp", 132: "sctp"}
ICMP_ECHO = 8
_PROTOCOLS = {p.value for p in Protocol}


def proto_name(number: int | None) -> str | None:
    if number is None:
        return None
    return PROTO_NAMES.get(number, str(number))


def flow_key(guest: str, pkt: NflogPacket) -> FlowKey:
    proto = proto_name(pkt.proto) or "?"
    if proto == "icmp":
        # ICMP has no ports: name the flow by type, so an echo request matches its twin.
        return (guest, proto, pkt.icmp_type, pkt.dst or "?", pkt.icmp_code)
    return (guest, proto, pkt.sport, pkt.dst or "?", pkt.dport)


def gateway_event(
    pkt: NflogPacket,
    site: Site,
    guest_of: Callable[[str | None], tuple[str, str | None] | None],
    session_of: Callable[[str], str | None] | None = None,
    pinned: Callable[[str, str], Iterable[str]] | None = None,
) -> tuple[FlowKey | None, Event]:
    """An event for a packet the gateway logged at ``site``.

    ``guest_of(src)`` maps a source address to (guest link name, session) for sites that are
    not guest-specific (DNS redirect, invalid packets). At a guest's own site the link names
    the sender, not the source address: a frame spoofing another guest's address is the
    spoofer's attempt (``session_of(link)``), never the victim's. ``pinned(link, address)``:
    the rule tags the resolver pinned the address under, for a pin group's site to name its
    rule (policy/pins.py).
    """
    guest = site.guest.split("/")[0] if site.guest else None
    session = None
    found = guest_of(pkt.src)
    if found is not None and (guest is None or found[0] == guest):
        guest = guest or found[0]
        session = found[1]
    elif guest is not None and session_of is not None:
        session = session_of(guest)
    proto = proto_name(pkt.proto)
    port = pkt.dport if proto in ("tcp", "udp") else None
    decision = at_address(site.decision, _address(pkt.dst), site.group)
    if site.pins is not None and pinned is not None and guest is not None and pkt.dst:
        protocol = Protocol(proto) if proto in _PROTOCOLS else None
        decision = site.pins.at(decision, pinned(guest, pkt.dst), port, protocol)
    details: dict[str, object] = {"site": site.prefix}
    if pkt.sport is not None:
        details["sport"] = pkt.sport
    if pkt.icmp_type is not None:
        details["icmp_type"] = pkt.icmp_type
    if pkt.tcp_flags is not None:
        details["tcp_flags"] = pkt.tcp_flags
    if pkt.family == 3:  # ARP
        proto = "arp"
    elif pkt.family == 10 or (pkt.dst is not None and ":" in pkt.dst):
        proto = "ipv6-icmp" if pkt.proto == 58 else (proto or "ipv6")
    event = Event.attempt(
        Kind.CONN,
        decision,
        ts=pkt.timestamp or 0.0,
        session=session,
        guest=guest,
        category=category_of(proto, port).value
        if site.guest is None or "/l2" not in site.guest
        else "L2",
        src=pkt.src,
        dst=pkt.dst,
        port=port,
        protocol=proto,
        details=details,
    )
    key = flow_key(guest, pkt) if guest is not None and pkt.dst is not None else None
    return key, event


def guest_flow(guest: str, pkt: NflogPacket) -> tuple[FlowKey, int | None]:
    """The guest-side record of a new outbound flow: its key and sending uid."""
    return flow_key(guest, pkt), pkt.uid


def _address(text: str | None) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text) if text is not None else None
    except ValueError:
        return None
