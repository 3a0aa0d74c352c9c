"""The proxy's judgement: resolve once, check every address, dial the address checked."""

from __future__ import annotations

from ipaddress import IPv4Address

from sandgate.gateway.proxy.flow import judge
from sandgate.policy.load import parse_policy

POLICY = parse_policy(
    b"""
[profiles.p]
internet = "allowlist"
allow = [ { domain = "pypi.org" }, { domain = "*.cdn.example", port = 443 },
          { host = "10.77.0.10", port = 8000 } ]
deny = [ { domain = "bad.pypi.org" } ]
""",
    "t.toml",
)
PROFILE = POLICY.profile("p")
ANSWERS = {
    "pypi.org": [IPv4Address("151.101.0.223"), IPv4Address("151.101.64.223")],
    "mixed.cdn.example": [IPv4Address("151.101.0.1"), IPv4Address("10.0.0.5")],
    "a.cdn.example": [IPv4Address("151.101.0.2")],
}
asked: list[str] = []


def resolve(name: str) -> list[IPv4Address]:
    asked.append(name)
    return ANSWERS.get(name, [])


def test_allowed_name_dials_the_first_checked_address() -> None:
    j = judge(PROFILE, "pypi.org", None, 443, resolve)
    assert j.decision.allowed and j.address == IPv4Address("151.101.0.223")


def test_one_private_answer_refuses_the_whole_name() -> None:
    j = judge(PROFILE, "mixed.cdn.example", None, 443, resolve)
    assert not j.decision.allowed and j.decision.key == "deny.rebinding" and j.address is None


def test_port_scoped_rule_is_checked_with_the_port() -> None:
    assert judge(PROFILE, "a.cdn.example", None, 443, resolve).decision.allowed
    assert not judge(PROFILE, "a.cdn.example", None, 8443, resolve).decision.allowed


def test_denied_names_are_never_resolved() -> None:
    asked.clear()
    j = judge(PROFILE, "bad.pypi.org", None, 443, resolve)
    assert j.decision.key == "deny.rule" and asked == []
    j = judge(PROFILE, "evil.example", None, 443, resolve)
    assert j.decision.key == "deny.not_allowlisted" and asked == []


def test_unresolvable_and_literal_names() -> None:
    # Allowed by name (*.cdn.example on 443), so it is resolved; no answers: refused.
    asked.clear()
    j = judge(PROFILE, "gone.cdn.example", None, 443, resolve)
    assert j.decision.key == "deny.unresolvable" and j.address is None
    assert asked == ["gone.cdn.example"]
    j = judge(PROFILE, "10.77.0.10", None, 8000, resolve)
    assert j.decision.key == "allow.exempt" and j.address == IPv4Address("10.77.0.10")
    j = judge(PROFILE, "::ffff:10.77.0.10", None, 8000, resolve)
    assert j.decision.allowed


def test_address_only() -> None:
    assert judge(PROFILE, None, IPv4Address("151.101.0.223"), 443, resolve).decision.key == (
        "deny.not_allowlisted"
    )
    assert judge(PROFILE, None, None, 443, resolve).decision.key == "deny.unparseable"
