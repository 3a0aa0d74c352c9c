"""The nft JSON evaluator itself (tests/nfteval.py): pin sets, concatenations, ranges.

A profile's forward chain looks up one pin set per domain rule (policy/pins.py): ``@pin_g5_a0``
for allow[0] (allowlist mode, the rule's own ports), ``@pin_g5_d0`` for a port-scoped deny[0]
(every mode). These tests fill them the ways the resolver does (``pin_elements``) and the ways
a test may (plain elements); concatenations and ranges are tested on ``elem_has`` itself.
"""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from sandgate.net.compile import GuestLink, base_ruleset, guest_add, pin_elements
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Mode
from sandgate.policy.profile import Profile
from tests.nfteval import Nft, Packet, Unknown, elem_has, evaluate

POOL = IPv4Network("10.201.0.0/16")
LINK = GuestLink.from_pool(POOL, 5, "02:00:00:00:00:05")
PROFILE = parse_policy(
    b"""
[profiles.p]
internet = "allowlist"
allow = [ { domain = "pypi.org" }, { domain = "*.github.com", port = 443 } ]
deny = [ { domain = "gist.github.com", port = 22 } ]
""",
    "t.toml",
).profile("p", gateway_address=LINK.gateway)
PINNED = IPv4Address("151.101.0.223")
PINNED_PORTS = IPv4Address("140.82.112.4")
RANGED = {"concat": [str(PINNED_PORTS), "tcp", {"range": [9000, 9010]}]}


def compiled(profile: Profile = PROFILE) -> tuple[list[Any], dict[str, Any]]:
    base, base_sites = base_ruleset("up0", POOL)
    guest, guest_sites = guest_add(LINK, profile)
    return base + guest, {**base_sites, **guest_sites}


def tcp(address: IPv4Address, port: int) -> Packet:
    return Packet(address, "tcp", port)


def test_nothing_pinned_denies() -> None:
    cmds, sites = compiled()
    assert evaluate(cmds, {}, tcp(PINNED, 8443), sites=sites, link=LINK) == (
        "deny",
        "deny.not_allowlisted",
    )


def test_a_pinned_address_is_open_on_its_rules_ports() -> None:
    cmds, sites = compiled()
    nft = Nft(cmds, sites, LINK, {"pin_g5_a0": [str(PINNED)], "pin_g5_a1": [str(PINNED_PORTS)]})
    assert nft.evaluate(tcp(PINNED, 8443)) == ("accept", "allow.pinned")
    assert nft.evaluate(Packet(PINNED, "udp", 5000)) == ("accept", "allow.pinned")
    assert nft.evaluate(tcp(IPv4Address("151.101.0.224"), 8443)) == ("deny", "deny.not_allowlisted")
    # plain HTTP goes to the proxy whatever is pinned, TLS stays in the kernel (its
    # ClientHello held for the TLS gate), and QUIC stays refused before any pin
    assert nft.evaluate(tcp(PINNED, 80)) == ("proxy", None)
    assert nft.evaluate(tcp(PINNED, 443)) == ("accept", "allow.pinned")
    assert nft.evaluate(Packet(PINNED, "udp", 443)) == ("deny", "deny.quic")
    # *.github.com is allowed on 443 only: its address is open there and nowhere else
    assert nft.evaluate(tcp(PINNED_PORTS, 443)) == ("accept", "allow.pinned")
    assert nft.evaluate(tcp(PINNED_PORTS, 22)) == ("deny", "deny.not_allowlisted")
    assert nft.evaluate(Packet(PINNED_PORTS, "udp", 443)) == ("deny", "deny.quic")


def test_a_port_scoped_deny_pins_its_port_shut() -> None:
    cmds, sites = compiled()
    both = {"pin_g5_a1": [str(PINNED_PORTS)], "pin_g5_d0": [str(PINNED_PORTS)]}
    nft = Nft(cmds, sites, LINK, both)
    assert nft.evaluate(tcp(PINNED_PORTS, 22)) == ("deny", "deny.rule")
    assert nft.evaluate(tcp(PINNED_PORTS, 443)) == ("accept", "allow.pinned")
    opened = Nft(*compiled(replace(PROFILE, mode=Mode.OPEN)), LINK, {"pin_g5_d0": ["140.82.113.9"]})
    assert opened.evaluate(tcp(IPv4Address("140.82.113.9"), 22)) == ("deny", "deny.rule")
    assert opened.evaluate(tcp(IPv4Address("140.82.113.9"), 2222)) == ("accept", "allow.open")


def test_a_deny_pin_comes_before_the_address_allow_rules() -> None:
    """deny gist.github.com:22 with an allow for its whole network: decide() refuses :22 to
    the name first (deny wins), so the kernel must meet the deny pin before the cidr rule."""
    profile = parse_policy(
        b"""
[profiles.p]
internet = "locked"
allow = [ { cidr = "140.82.112.0/20" } ]
deny = [ { domain = "gist.github.com", port = 22 } ]
""",
        "t.toml",
    ).profile("p", gateway_address=LINK.gateway)
    nft = Nft(*compiled(profile), LINK, {"pin_g5_d0": ["140.82.113.9"]})
    assert nft.evaluate(tcp(IPv4Address("140.82.113.9"), 22)) == ("deny", "deny.rule")
    assert nft.evaluate(tcp(IPv4Address("140.82.113.9"), 443)) == ("accept", "allow.rule")
    assert nft.evaluate(tcp(IPv4Address("140.82.113.10"), 22)) == ("accept", "allow.rule")


@pytest.mark.parametrize(
    ("elem", "value", "expected"),
    [
        ({"concat": [str(PINNED_PORTS), "tcp", 8443]}, (PINNED_PORTS, "tcp", 8443), True),
        ({"concat": [str(PINNED_PORTS), "tcp", 8443]}, (PINNED_PORTS, "tcp", 8444), False),
        ({"concat": [str(PINNED_PORTS), "tcp", 8443]}, (PINNED_PORTS, "udp", 8443), False),
        ({"concat": [str(PINNED_PORTS), 6, 8443]}, (PINNED_PORTS, "tcp", 8443), True),
        (RANGED, (PINNED_PORTS, "tcp", 9000), True),
        (RANGED, (PINNED_PORTS, "tcp", 9010), True),
        (RANGED, (PINNED_PORTS, "tcp", 8999), False),
        (RANGED, (PINNED_PORTS, "tcp", 9011), False),
        (
            {"concat": [{"prefix": {"addr": "140.82.112.0", "len": 20}}, "tcp", 22]},
            (IPv4Address("140.82.127.255"), "tcp", 22),
            True,
        ),
        (
            {"concat": [{"range": ["140.82.112.1", "140.82.112.9"]}, "tcp", 22]},
            (IPv4Address("140.82.112.10"), "tcp", 22),
            False,
        ),
    ],
)
def test_concatenations_match_whole(elem: Any, value: Any, expected: bool) -> None:
    assert elem_has(elem, value) is expected


def test_pinned_but_special_is_refused_before_the_pins() -> None:
    cmds, sites = compiled()
    nft = Nft(cmds, sites, LINK, {"pin_g5_a0": ["10.0.0.5"]})
    assert nft.evaluate(tcp(IPv4Address("10.0.0.5"), 8443)) == ("deny", "deny.special")


def test_the_resolvers_own_pin_commands() -> None:
    """pin_elements' commands, applied after the ruleset, are read with their timeouts."""
    cmds, sites = compiled()
    cmds += pin_elements(LINK, [str(PINNED)], 300, ["a0"])
    cmds += pin_elements(LINK, [str(PINNED_PORTS)], 300, ["a1", "d0"])
    nft = Nft(cmds, sites, LINK)
    assert nft.evaluate(tcp(PINNED, 22)) == ("accept", "allow.pinned")
    assert nft.evaluate(tcp(PINNED_PORTS, 443)) == ("accept", "allow.pinned")
    assert nft.evaluate(tcp(PINNED_PORTS, 22)) == ("deny", "deny.rule")
    assert nft.evaluate(tcp(PINNED_PORTS, 8443)) == ("deny", "deny.not_allowlisted")


def test_the_gateways_own_services_and_spoofing() -> None:
    cmds, sites = compiled()
    nft = Nft(cmds, sites, LINK)
    assert nft.evaluate(Packet(LINK.gateway, "udp", 53)) == ("accept", "allow.gateway_dns")
    assert nft.evaluate(tcp(LINK.gateway, 3128)) == ("accept", "allow.gateway_proxy")
    assert nft.evaluate(Packet(LINK.gateway, "udp", 3128)) == ("deny", "deny.gateway")
    assert nft.evaluate(Packet(IPv4Address("8.8.8.8"), "udp", 53)) == ("deny", "deny.dns_redirect")
    spoofed = Packet(PINNED, "tcp", 8443, saddr=LINK.gateway)
    assert Nft(cmds, sites, LINK, {"pin_g5_a0": [str(PINNED)]}).evaluate(spoofed) == (
        "deny",
        "deny.spoof_ip",
    )


def test_the_evaluator_refuses_what_it_does_not_know() -> None:
    cmds, sites = compiled()
    with pytest.raises(Unknown, match="no set named"):
        Nft(cmds, sites, LINK, {"pin_g9_a0": ["1.2.3.4"]})
    with pytest.raises(Unknown):
        elem_has({"concat": ["1.2.3.4", "tcp"]}, (PINNED, "tcp", 443))  # wrong arity
    with pytest.raises(Unknown):
        elem_has(3.5, PINNED)
    locked = Nft(*compiled(replace(PROFILE, mode=Mode.LOCKED)), LINK)
    assert "pin_g5_a0" not in locked.inet.sets  # allow pins exist in allowlist mode only
    assert "pin_g5_d0" in locked.inet.sets  # deny pins in every mode
