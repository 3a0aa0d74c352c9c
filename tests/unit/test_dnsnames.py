"""policy.dnsnames: what a question may ask and where an alias may lead, as tables."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.policy import dnsnames as N
from sandgate.policy.classify import classify
from sandgate.policy.decide import Reason, decide_name
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Mode
from sandgate.policy.profile import Profile

POLICY = parse_policy(
    b"""
[profiles.agent]
internet = "open"
allow = [
  { domain = "pypi.org" },
  { domain = "printer.home.arpa", name = "the homelab printer" },
]
deny = [
  { domain = "gist.github.com", name = "no pastebins" },
]
""",
    "policy.toml",
)


def agent(mode: Mode = Mode.OPEN) -> Profile:
    return POLICY.profile("agent", mode=mode)


A, AAAA, PTR, ANY, AXFR, IXFR, TXT, TSIG, MAILA, OPT = 1, 28, 12, 255, 252, 251, 16, 250, 254, 41


def outcome(name: str, qtype: int, mode: Mode = Mode.OPEN) -> str:
    d = N.judge_question(agent(mode), name, qtype)
    return f"{d.verdict.value} {d.key}"


@pytest.mark.parametrize(
    ("name", "qtype", "expected"),
    [
        # the name's own verdict comes first, and is what an allowed question carries
        ("example.com", A, "allow allow.open"),
        ("pypi.org", A, "allow allow.rule"),
        ("gist.github.com", A, "deny deny.rule"),
        ("gist.github.com", AXFR, "deny deny.rule"),
        # question types
        ("example.com", ANY, "deny deny.dns_any"),
        ("pypi.org", ANY, "deny deny.dns_any"),
        ("example.com", AXFR, "deny deny.zone_transfer"),
        ("example.com", IXFR, "deny deny.zone_transfer"),
        ("example.com", TSIG, "deny deny.dns_meta"),
        ("example.com", MAILA, "deny deny.dns_meta"),
        ("example.com", OPT, "deny deny.dns_meta"),
        ("example.com", 128, "deny deny.dns_meta"),
        ("example.com", 127, "allow allow.open"),  # not a meta type
        ("example.com", 256, "allow allow.open"),  # URI
        ("example.com", TXT, "allow allow.open"),
        ("example.com", AAAA, "deny deny.ipv6"),
        # special-use names, whatever the type
        ("localhost", A, "deny deny.special_name"),
        ("foo.localhost", A, "deny deny.special_name"),
        ("metadata.google.internal", A, "deny deny.special_name"),
        ("anything.internal", TXT, "deny deny.special_name"),
        ("printer.local", A, "deny deny.special_name"),
        ("abc.onion", A, "deny deny.special_name"),
        ("nas.home.arpa", A, "deny deny.special_name"),
        ("_dns.resolver.arpa", 64, "deny deny.special_name"),
        ("x.invalid", A, "deny deny.special_name"),
        ("printer.home.arpa", A, "allow allow.rule"),  # an allow rule names it
        # names the test world serves, and lookalikes, are not special
        ("rebind.example", A, "allow allow.open"),
        ("example.test", A, "allow allow.open"),
        ("localhost.example.com", A, "allow allow.open"),
        ("notinternal", A, "allow allow.open"),
        ("local.example.com", A, "allow allow.open"),
        # reverse names
        ("10.0.77.10.in-addr.arpa", PTR, "deny deny.private"),
        ("1.0.0.127.in-addr.arpa", PTR, "deny deny.loopback"),
        ("254.169.254.169.in-addr.arpa", PTR, "deny deny.metadata"),
        ("168.192.in-addr.arpa", TXT, "deny deny.private"),
        ("8.8.8.8.in-addr.arpa", PTR, "allow allow.open"),
        ("10.1.1.1.in-addr.arpa", PTR, "allow allow.open"),  # 1.1.1.10
        ("x.1.1.1.in-addr.arpa", PTR, "deny deny.special"),
        ("1.1.1.1.1.in-addr.arpa", PTR, "deny deny.special"),
        ("256.1.1.1.in-addr.arpa", PTR, "deny deny.special"),
        ("1.0.0.0.ip6.arpa", PTR, "deny deny.ipv6"),
    ],
)
def test_question_table(name: str, qtype: int, expected: str) -> None:
    assert outcome(name, qtype) == expected


def test_locked_and_allowlist_deny_before_the_type() -> None:
    assert outcome("example.com", AXFR, Mode.LOCKED) == "deny deny.locked"
    assert outcome("example.com", ANY, Mode.ALLOWLIST) == "deny deny.not_allowlisted"
    assert outcome("pypi.org", AXFR, Mode.ALLOWLIST) == "deny deny.zone_transfer"


def test_public_override_makes_reverse_names_public() -> None:
    world = replace(agent(), public_override=(ipaddress.ip_network("203.0.113.0/24"),))
    assert N.judge_reverse(agent(), "10.113.0.203.in-addr.arpa") is not None
    assert N.judge_reverse(world, "10.113.0.203.in-addr.arpa") is None


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_reverse_name_read_back_to_front(value: int) -> None:
    address = ipaddress.IPv4Address(value)
    name = address.reverse_pointer  # "d.c.b.a.in-addr.arpa", from the standard library
    assert N.reverse_address(name) == address
    refused = N.judge_reverse(agent(), name)
    assert (refused is not None) is classify(address).special, name
    if refused is not None:
        assert refused.key == f"deny.{classify(address).cls.value}"


def test_special_name_table_has_sources() -> None:
    zones = [row.zone for row in N.SPECIAL_NAMES]
    assert len(zones) == len(set(zones))
    for row in N.SPECIAL_NAMES:
        assert row.source and row.note and row.zone == row.zone.lower().strip(".")
    assert N.special_name("metadata.google.internal") == next(
        r for r in N.SPECIAL_NAMES if r.zone == "metadata.google.internal"
    )
    assert N.special_name("example") is None and N.special_name("test") is None


ALLOWED = decide_name(agent(), "cdn.example.com")


@pytest.mark.parametrize(
    ("aliases", "expected"),
    [
        ((), "allow.open"),
        ((("www.example.com", "cdn.fastly.net"),), "allow.open"),
        ((("www.example.com", "a.example.net"), ("a.example.net", "b.example.org")), "allow.open"),
        ((("www.example.com", "localhost"),), "deny.cname_target"),
        ((("www.example.com", "metadata.google.internal"),), "deny.cname_target"),
        ((("www.example.com", "db.internal"),), "deny.cname_target"),
        ((("www.example.com", "gist.github.com"),), "deny.cname_target"),
        ((("www.example.com", "www.example.com"),), "deny.cname_loop"),
        (
            (("www.example.com", "a.example.net"), ("a.example.net", "www.example.com")),
            "deny.cname_loop",
        ),
        (
            (("a.example.net", "b.example.net"), ("b.example.net", "a.example.net")),
            "deny.cname_loop",
        ),
        ((("www.example.com", "printer.home.arpa"),), "allow.open"),  # an allow rule names it
    ],
)
def test_alias_table(aliases: tuple[tuple[str, str], ...], expected: str) -> None:
    assert N.judge_aliases(agent(), "www.example.com", aliases, ALLOWED).key == expected


def test_alias_refusal_names_the_rule() -> None:
    d = N.judge_aliases(
        agent(), "www.example.com", (("www.example.com", "gist.github.com"),), ALLOWED
    )
    assert d.reason is Reason.CNAME_TARGET and d.rule is not None and d.rule.ref == "agent.deny[0]"
    assert "gist.github.com" in d.detail


def _special_by_walk(name: str) -> N.SpecialName | None:
    """The table read the plain way: every suffix of the name, longest first."""
    labels = name.split(".")
    zones = {row.zone: row for row in N.SPECIAL_NAMES}
    return next(
        (zones[z] for i in range(len(labels)) if (z := ".".join(labels[i:])) in zones), None
    )


LABELS = st.sampled_from(
    ("", "a", "x", "local", "localhost", "arpa", "home", "internal", "google", "metadata", "goog")
) | st.sampled_from(
    ("onion", "alt", "invalid", "resolver", "service", "ipv4only", "ec2", "instance-data")
)


@given(st.lists(LABELS, min_size=1, max_size=5))
def test_special_name_is_the_suffix_walk(labels: list[str]) -> None:
    name = ".".join(labels)
    assert N.special_name(name) == _special_by_walk(name), name
