"""A small evaluator of the part of Cilium's egress semantics sandgate's export uses: test code,
standing in for a cluster.

- An attempt from a selected pod is refused if any ``egressDeny`` entry matches it (deny beats
  allow), else allowed if any ``egress`` entry matches, else refused (default deny, which the
  export switches on for egress).
- ``toCIDRSet``: the address is in ``cidr`` and in none of its ``except``; CIDR selectors match
  outside-the-cluster addresses only (every address here is outside).
- ``toPorts``: any PortRule's ports (port..endPort, protocol TCP/UDP/ANY) matches; ``icmps``
  matches ICMP (the attempts are echo requests, type 8); neither: every port and protocol.
- ``serverNames``: the TLS name (the name the client meant) must be listed.
- DNS visibility: a name is answered only if a ``rules.dns`` selector of an entry to kube-dns
  matches it; a ``toFQDNs`` selector learns the address of a name only from such an answer.
- Cilium 1.16 patterns: ``*`` alone matches every name; otherwise ``*`` stands for any run of
  label characters (never a dot), so ``*.example.com`` is one label deep and never the apex.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Try:
    protocol: str  # "tcp", "udp", "icmp"
    address: IPAddress | None = None
    port: int | None = None
    name: str | None = None  # the name resolved first (and the TLS name on 443)


def pattern_matches(selector: Json, name: str) -> bool:
    if "matchName" in selector:
        return name == selector["matchName"].rstrip(".").lower()
    pattern = selector["matchPattern"].rstrip(".").lower()
    if pattern == "*":
        return True
    regex = "".join("[-a-z0-9_]*" if c == "*" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name) is not None


def _cidr_matches(entry: Json, address: IPAddress) -> bool:
    for item in entry.get("toCIDRSet", []):
        net = ipaddress.ip_network(item["cidr"])
        if address.version == net.version and address in net:
            holes = [ipaddress.ip_network(h) for h in item.get("except", [])]
            if not any(address.version == h.version and address in h for h in holes):
                return True
    return any(
        address.version == ipaddress.ip_network(c).version and address in ipaddress.ip_network(c)
        for c in entry.get("toCIDR", [])
    )


def _l4_matches(entry: Json, attempt: Try) -> bool:
    if "toPorts" not in entry and "icmps" not in entry:
        return True
    if attempt.protocol == "icmp":
        return any(
            f["type"] == 8 and f.get("family", "IPv4") == "IPv4"
            for rule in entry.get("icmps", [])
            for f in rule["fields"]
        )
    for rule in entry.get("toPorts", []):
        for p in rule["ports"]:
            lo = int(p["port"])
            hi = p.get("endPort", lo)
            proto = p.get("protocol", "ANY")
            if proto in ("ANY", attempt.protocol.upper()) and (
                lo == 0 or (attempt.port is not None and lo <= attempt.port <= hi)
            ):
                names = rule.get("serverNames")
                if names and (attempt.name is None or attempt.name not in names):
                    continue
                return True
    return False


def resolves(policy: Json, name: str) -> bool:
    """Does the DNS proxy answer a question for ``name``?"""
    for entry in policy["spec"].get("egress", []):
        if "toEndpoints" not in entry:
            continue
        for rule in entry.get("toPorts", []):
            for sel in rule.get("rules", {}).get("dns", []):
                if pattern_matches(sel, name):
                    return True
    return False


def verdict(policy: Json, attempt: Try) -> tuple[bool, int | None]:
    """(allowed, index of the egress entry that allowed it). A DNS question has no address."""
    spec = policy["spec"]
    if attempt.address is None:
        assert attempt.name is not None
        return resolves(policy, attempt.name), None
    address = attempt.address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # the socket sends IPv4
    if attempt.name is not None and not resolves(policy, attempt.name):
        return False, None  # no answer, so no address to go to
    for entry in spec.get("egressDeny", []):
        if _cidr_matches(entry, address) and _l4_matches(entry, attempt):
            return False, None
    for i, entry in enumerate(spec.get("egress", [])):
        if "toFQDNs" in entry:
            if attempt.name is None or not any(
                pattern_matches(s, attempt.name) for s in entry["toFQDNs"]
            ):
                continue
        elif not _cidr_matches(entry, address):
            continue
        if _l4_matches(entry, attempt):
            return True, i
    return False, None
