"""Never-rules: what holds for *every* policy, prove's second oracle beside ``decide()``.

A probe's expectation comes from ``decide()``; a bug there would hide behind an enforcer that
shares it (expected allow, observed allow, PASS). These rules do not read the policy's verdict
at all, only the guest's wiring, so a probe that ``decide()`` expects to be allowed but that
breaks one fails loudly ("policy and invariant disagree"):

* a guest never reaches another guest (an address in the guest pool);
* a guest never reaches its gateway's own ports other than the resolver, the proxy and the
  ports the gateway was started to relay to the host's loopback (host_loopback);
* a guest never reaches the host it runs on;
* a guest never reaches a cloud metadata address unless an allow rule names exactly it.

Two more are checked over the whole session rather than per probe (runner.py): no packet
reaches the outside with a source other than the gateway's uplink address, and no name the
resolver refused reaches the upstream resolver.

Pure: judges data, sends nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from sandgate.policy.classify import AddressClass, classify
from sandgate.policy.decide import GATEWAY_PROXY_PORTS
from sandgate.policy.model import IPAddress, IPNetwork

RESOLVER_PORT = 53


@dataclass(frozen=True)
class Wiring:
    """What the never-rules need to know of the guest: nothing from the policy's verdicts."""

    guest_pool: IPNetwork
    gateway: IPAddress
    host_addresses: tuple[IPAddress, ...] = ()
    named_exactly: tuple[IPAddress, ...] = ()  # single addresses an allow rule names
    relayed: tuple[int, ...] = ()  # host-loopback ports the gateway relays for this guest


def never(
    wiring: Wiring, address: IPAddress | None, port: int | None, protocol: str = "tcp"
) -> str | None:
    """The never-rule an attempt to ``address:port`` would break if it were allowed, or None."""
    if address is None:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address == wiring.gateway:
        if port == RESOLVER_PORT and protocol in ("tcp", "udp"):
            return None
        if port in (*GATEWAY_PROXY_PORTS, *wiring.relayed) and protocol == "tcp":
            return None
        return "never.gateway_port"
    if address.version == wiring.guest_pool.version and address in wiring.guest_pool:
        return "never.lateral"
    if address in wiring.host_addresses:
        return "never.host"
    if classify(address).cls is AddressClass.METADATA and address not in wiring.named_exactly:
        return "never.metadata"
    return None


def probe_target(args: dict[str, object]) -> tuple[IPAddress | None, int | None]:
    """The address and port a probe aims at, when it names an address (not a name).
    (Its protocol is the probe's action: ``tcp``, ``udp``, ``icmp``, or http over tcp.)"""
    address, port = args.get("address"), args.get("port")
    url = args.get("url")
    if address is None and isinstance(url, str):
        parts = urlsplit(url)
        address, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    try:
        ip = ipaddress.ip_address(str(address)) if address is not None else None
    except ValueError:
        return None, None  # a name: the resolver's answer is judged by the rules above
    return ip, int(port) if isinstance(port, int | str) and str(port).isdigit() else None


def foreign_sources(seen: Iterable[dict[str, object]], uplink: str) -> list[dict[str, object]]:
    """Entries of the outside world's logs whose source is not the gateway's uplink address."""
    return [x for x in seen if x.get("src") not in (None, uplink)]


def leaked_names(denied: Iterable[str], upstream: Iterable[dict[str, object]]) -> list[str]:
    """Names the resolver refused that the upstream resolver was asked anyway."""
    asked = {str(x.get("qname", "")).rstrip(".").lower() for x in upstream}
    return sorted({n for n in denied if n.rstrip(".").lower() in asked})


__all__ = ["Wiring", "foreign_sources", "leaked_names", "never", "probe_target"]
