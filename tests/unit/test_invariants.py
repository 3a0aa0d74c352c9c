"""prove's never-rules: a table of attempts that no policy may allow, and the session checks."""

from __future__ import annotations

import ipaddress

import pytest

from sandgate.prove.invariants import Wiring, foreign_sources, leaked_names, never, probe_target

W = Wiring(
    guest_pool=ipaddress.ip_network("10.202.0.0/16"),
    gateway=ipaddress.ip_address("10.202.0.5"),
    host_addresses=(ipaddress.ip_address("192.0.2.7"),),
    named_exactly=(ipaddress.ip_address("169.254.170.2"),),
)


@pytest.mark.parametrize(
    ("address", "port", "broken"),
    [
        ("10.202.0.6", 8080, "never.lateral"),  # the guest's own /30, the far end
        ("10.202.9.2", 22, "never.lateral"),  # another guest
        ("::ffff:10.202.9.2", 22, "never.lateral"),  # the same, IPv4-mapped
        ("10.202.0.5", 22, "never.gateway_port"),
        ("10.202.0.5", 8080, "never.gateway_port"),
        ("10.202.0.5", 53, None),  # its resolver
        ("10.202.0.5", 3128, None),  # its proxy
        ("10.202.0.5", 15443, None),
        ("192.0.2.7", 22, "never.host"),
        ("169.254.169.254", 80, "never.metadata"),
        ("169.254.170.2", 80, None),  # an allow rule names exactly this one
        ("10.201.0.2", 80, None),  # outside this pool: the policy decides
        ("203.0.113.10", 443, None),
        (None, 443, None),  # a name: judged when it resolves
    ],
)
def test_never_rules(address: str | None, port: int, broken: str | None) -> None:
    ip = ipaddress.ip_address(address) if address else None
    assert never(W, ip, port) == broken


@pytest.mark.parametrize(
    ("port", "protocol", "broken"),
    [(53, "udp", None), (3128, "udp", "never.gateway_port"), (None, "icmp", "never.gateway_port")],
)
def test_the_gateways_services_are_tcp_proxy_and_dns(
    port: int | None, protocol: str, broken: str | None
) -> None:
    assert never(W, W.gateway, port, protocol) == broken


def test_probe_targets() -> None:
    assert probe_target({"address": "10.0.0.1", "port": 9}) == (ipaddress.ip_address("10.0.0.1"), 9)
    assert probe_target({"url": "http://169.254.169.254/latest/"}) == (
        ipaddress.ip_address("169.254.169.254"),
        80,
    )
    assert probe_target({"url": "https://pypi.org/simple/"}) == (None, None)


def test_session_checks() -> None:
    seen = [{"src": "10.77.0.2"}, {"src": "10.202.0.6"}, {"other": 1}]
    assert foreign_sources(seen, "10.77.0.2") == [{"src": "10.202.0.6"}]
    upstream = [{"qname": "pypi.org."}, {"qname": "Secret.Evil.Example."}]
    assert leaked_names(["secret.evil.example", "gist.github.com"], upstream) == [
        "secret.evil.example"
    ]
