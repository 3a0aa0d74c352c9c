"""Where the uplink has IPv6 (issue 14 part 5): the compiled IPv6 path is ``decide()`` too.

The same differential idea as test_compile_agrees.py, for IPv6 frames from a guest link: the
netdev ingress (the guest's own IPv6 source only), prerouting (web ports to the proxy), the
guest's ``fwd6``/``in6`` chains. A packet reaches its destination exactly when ``decide()``
allows the address-level attempt, and the site that refuses it logs the reason decide() gives
(``at_address`` names a special block's class, or ``deny.ipv6_embedding``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import replace
from ipaddress import IPv4Network, IPv6Address, IPv6Network

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.net.compile import (
    PROXY_PORTS,
    GuestLink,
    base_ruleset,
    guest_add,
    guest_remove,
    pin6_set,
)
from sandgate.policy.classify import BLOCKS
from sandgate.policy.decide import Attempt, Decision, at_address, decide
from sandgate.policy.load import parse_policy
from sandgate.policy.model import IPNetwork, Mode, Protocol
from sandgate.policy.pins import pinned_rules
from sandgate.policy.profile import GUEST_POOL6, Profile
from tests.nfteval import Nft, Packet, Sets

POOL = IPv4Network("10.201.0.0/16")
LINK = GuestLink.from_pool(POOL, 5, "02:00:00:00:00:05")
TEST_INTERNET: tuple[IPNetwork, ...] = (
    IPv4Network("203.0.113.0/24"),
    IPv4Network("198.51.100.0/24"),
    IPv6Network("2001:db8::/32"),
)

POLICY = parse_policy(
    b"""
[profiles.v6]
allow = [
  { domain = "pypi.org" },
  { domain = "*.github.com", port = 443 },
  { cidr = "2001:db8:5::/48", port = 443 },
  { host = "2606:4700:4700::1111", port = 53, protocol = "udp" },
  { cidr = "2000::/3", port = 9418 },
  { host = "fd00::5", port = 22 },
  { cidr = "fd00::/8", port = 8000 },
  { cidr = "fe80::/10" },
  { cidr = "64:ff9b::/96" },
  { cidr = "2001:db8:9::/48", protocol = "icmp" },
]
deny = [
  { cidr = "2001:db8:6::/48" },
  { domain = "gist.github.com", port = 22 },
  { cidr = "::/0", port = 25 },
]
""",
    "v6.toml",
)


def profile(mode: Mode, override: bool) -> Profile:
    p = POLICY.profile(
        "v6",
        mode=mode,
        public_override=TEST_INTERNET if override else (),
        gateway_address=LINK.gateway,
        guest_pool=POOL,
        uplink_ipv6=True,
    )
    return replace(p, uplink_ipv6=True)


PROFILES = {f"{m.value}{'-testworld' if o else ''}": profile(m, o) for m in Mode for o in (0, 1)}


def compiled(p: Profile, sets: Sets | None = None) -> Nft:
    base, base_sites = base_ruleset("up0", POOL, public_override=p.public_override, ipv6=True)
    guest, guest_sites = guest_add(LINK, p)
    return Nft(base + guest, {**base_sites, **guest_sites}, LINK, sets)


def edges6(net: IPNetwork) -> Iterator[IPv6Address]:
    if not isinstance(net, IPv6Network):
        return
    first, last = int(net.network_address), int(net.broadcast_address)
    for value in (first - 1, first, first + 1, last - 1, last, last + 1):
        if 0 <= value < 2**128:
            yield IPv6Address(value)


def addresses(p: Profile) -> list[IPv6Address]:
    nets: list[IPNetwork] = [b.network for b in BLOCKS]
    nets += [GUEST_POOL6, LINK.subnet6, *p.public_override]
    nets += [r.spec.network for r in p.rules() if r.spec.network is not None]
    found = {a for n in nets for a in edges6(n)}
    found |= {
        LINK.gateway6,
        IPv6Address("2606:4700:4700::1111"),
        IPv6Address("2001:db8:203::10"),
        IPv6Address("64:ff9b::a4d:a"),  # NAT64 of 10.77.0.10
        IPv6Address("64:ff9b::808:808"),  # NAT64 of a public IPv4
        IPv6Address("64:ff9b::a9fe:a9fe"),  # NAT64 of the metadata endpoint
        IPv6Address("2002:a00:1::1"),  # 6to4 of 10.0.0.1
        IPv6Address("2002:808:808::1"),  # 6to4 of a public IPv4
        IPv6Address("::808:808"),  # IPv4-compatible, public
        IPv6Address("fe80::a9fe:a9fe"),
        IPv6Address("fd00:ec2::254"),  # the AWS IPv6 metadata endpoint
    }
    return sorted(found)


PORTS = (22, 25, 53, 80, 123, 443, 853, 8000, 9418, *PROXY_PORTS)


def check(nft: Nft, p: Profile, pkt: Packet) -> None:
    if isinstance(pkt.daddr, IPv6Address) and pkt.daddr.ipv4_mapped is not None:
        return  # the guest's kernel sends those as IPv4 (test_compile_agrees.py)
    reached, verdict = nft.trace(pkt)
    port = pkt.dport if pkt.proto != "icmp" else None
    d: Decision = decide(p, Attempt(Protocol(pkt.proto), pkt.daddr, port))
    if verdict.kind == "proxy":  # web ports: the proxy judges with decide()
        assert reached, pkt
        return
    assert reached == d.allowed, (pkt, d.key, d.rule_ref, verdict)
    site = nft.site(verdict)
    if site is not None and not d.allowed:
        logged = at_address(site.decision, pkt.daddr)
        assert logged.key == d.key, (pkt, logged.key, d.key)


@pytest.mark.parametrize("name", ["open", "open-testworld", "allowlist-testworld", "locked"])
def test_ipv6_ruleset_agrees_with_decide_on_every_edge(name: str) -> None:
    p = PROFILES[name]
    nft = compiled(p)
    for address in addresses(p):
        check(nft, p, Packet.v6(address, "icmp", None))
        for proto in ("tcp", "udp"):
            for port in PORTS:
                check(nft, p, Packet.v6(address, proto, port))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(list(PROFILES.values())),
    st.ip_addresses(v=6),
    st.sampled_from(["tcp", "udp", "icmp"]),
    st.integers(1, 65535),
)
def test_ipv6_ruleset_agrees_with_decide_on_random_addresses(
    p: Profile, address: IPv6Address, proto: str, port: int
) -> None:
    check(compiled(p), p, Packet.v6(address, proto, None if proto == "icmp" else port))


def test_aaaa_pins_open_the_allowlist_for_their_rule_only() -> None:
    """An allowlisted name's AAAA address, pinned, is reachable on the rule's ports; the same
    address unpinned, or another port, is not (decide() with the name agrees)."""
    p = PROFILES["allowlist-testworld"]
    github = next(r for r in pinned_rules(p) if "github" in r.rule.label or "github" in str(r.rule))
    address = IPv6Address("2001:db8:203::30")
    pinned = {pin6_set(LINK.ifname, github.tag): [str(address)]}
    ssh = Packet.v6(address, "tcp", 22)
    assert compiled(p).evaluate(ssh) == ("deny", "deny.not_allowlisted")
    nft = compiled(p, pinned)
    # 443 goes to the proxy's TLS door (it judges the SNI); another port of a pinned
    # address is the pin's to open: *.github.com is for 443 only.
    assert nft.evaluate(Packet.v6(address, "tcp", 443)) == ("proxy", None)
    assert nft.evaluate(Packet.v6(address, "tcp", 8443)) == ("deny", "deny.not_allowlisted")
    pypi = next(r for r in pinned_rules(p) if "pypi" in str(r.rule))
    nft = compiled(p, {pin6_set(LINK.ifname, pypi.tag): [str(address)]})
    assert nft.evaluate(Packet.v6(address, "tcp", 8443)) == ("accept", "allow.pinned")
    assert decide(p, Attempt(Protocol.TCP, address, 8443, "pypi.org")).key == "allow.rule"


@pytest.mark.parametrize(
    ("pkt", "expected"),
    [
        pytest.param(Packet.v6(IPv6Address("2001:db8::1"), "tcp", 22), "accept", id="own"),
        pytest.param(
            Packet.v6(IPv6Address("2001:db8::1"), "tcp", 22, saddr=IPv6Address("fe80::1")),
            "deny.spoof_ip",
            id="link-local-source",
        ),
        pytest.param(
            Packet.v6(IPv6Address("2001:db8::1"), "tcp", 22, saddr=IPv6Address("::")),
            "deny.spoof_ip",
            id="unspecified-source",
        ),
        pytest.param(
            Packet.v6(IPv6Address("2001:db8::1"), "tcp", 22, saddr=LINK.subnet6[3]),
            "deny.spoof_ip",
            id="neighbour-in-own-64",
        ),
        pytest.param(
            Packet.v6(IPv6Address("2001:db8::1"), "tcp", 22, smac="02:00:00:00:00:99"),
            "deny.spoof_mac",
            id="other-mac",
        ),
    ],
)
def test_link_ingress_pins_the_guests_ipv6_source(pkt: Packet, expected: str) -> None:
    nft = compiled(PROFILES["open-testworld"])
    verdict = nft.ingress(pkt)
    if expected == "accept":
        assert verdict.kind == "accept"
    else:
        assert verdict.kind == "drop" and nft.sites[verdict.site or ""].reason == expected


def test_the_gateways_ipv6_address_serves_only_redirected_web_flows() -> None:
    """A guest's neighbour solicitation, or a dial to the gateway's own IPv6 address (its
    proxy ports included), meets deny.lateral; port 80 sent anywhere reaches the proxy."""
    p = PROFILES["open-testworld"]
    nft = compiled(p)
    for port in (22, 53, *PROXY_PORTS):
        assert nft.evaluate(Packet.v6(LINK.gateway6, "tcp", port))[0] == "deny", port
    solicit = Packet.v6(LINK.gateway6, "icmp", None, icmp_type="nd-neighbor-solicit")
    assert nft.evaluate(solicit) == ("deny", "deny.lateral")
    assert nft.evaluate(Packet.v6(IPv6Address("2001:db8:203::10"), "tcp", 80)) == ("proxy", None)


def test_no_ipv6_uplink_keeps_todays_ruleset() -> None:
    """Without ``uplink_ipv6`` nothing IPv6 is compiled: the link drops it whole."""
    p = replace(PROFILES["open-testworld"], uplink_ipv6=False)
    base, _ = base_ruleset("up0", POOL, public_override=p.public_override)
    guest, sites = guest_add(LINK, p)
    text = repr(base + guest)
    assert "fwd6_" not in text and "special6" not in text
    nft = Nft(base + guest, sites, LINK)
    assert nft.evaluate(Packet.v6(IPv6Address("2001:db8::1"), "tcp", 22)) == ("deny", "deny.ipv6")


def test_guest_remove_removes_the_ipv6_parts() -> None:
    p = PROFILES["allowlist-testworld"]
    cmds, sites = guest_add(LINK, p)
    made = {
        (kind, spec["name"])
        for c in cmds
        for kind, spec in c.get("add", {}).items()
        if kind in ("chain", "set") and ("6" in spec["name"])
    }
    gone = {
        (kind, spec["name"])
        for c in guest_remove(LINK, sites.values(), p)
        for kind, spec in c.get("delete", {}).items()
        if kind in ("chain", "set")
    }
    assert made and made <= gone, made - gone
    assert ipaddress.ip_address(LINK.guest6) in LINK.subnet6
