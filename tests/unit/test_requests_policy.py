"""policy/requests.py: the verdicts the proxy, the TLS gate and explain take from policy/."""

from __future__ import annotations

from ipaddress import IPv4Address, ip_address

import pytest

from sandgate.explain import explain
from sandgate.policy.decide import Reason, allow, deny
from sandgate.policy.load import parse_policy
from sandgate.policy.requests import (
    gate_verdict,
    judge_answers,
    names_agree,
    placeholder_sent,
    tls_mode,
)

PROFILE = parse_policy(
    b"""
[profiles.p]
internet = "allowlist"
allow = [ { domain = "pypi.org" }, { domain = "api.openai.com" } ]
inspect = [ "api.openai.com" ]
""",
    "t.toml",
).profile("p")


@pytest.mark.parametrize(
    ("outer", "inner", "fronting"),
    [
        ("pypi.org", "pypi.org", False),
        ("PyPI.org.", "pypi.org", False),
        ("pypi.org", None, False),  # no SNI: judged by the one name there is
        (None, "pypi.org", False),
        ("pypi.org", "evil.example", True),
        ("pypi.org", "pypi.org.evil.example", True),
        ("pypi.org", "", True),  # inspected TLS, request without a Host
    ],
)
def test_names_agree(outer: str | None, inner: str | None, fronting: bool) -> None:
    d = names_agree(outer, inner)
    assert (d is not None) == fronting
    if d is not None:
        assert d.reason is Reason.FRONTING and not d.allowed


def test_placeholder_sent_is_exfiltration() -> None:
    d = placeholder_sent("openai", "example.com", "body")
    assert (
        d.key == "deny.exfiltration"
        and d.detail == "placeholder of 'openai' in the body to example.com"
    )


@pytest.mark.parametrize(
    ("decision", "name", "mode"),
    [
        (allow(Reason.RULE_ALLOW), "api.openai.com", "inspect"),
        (allow(Reason.RULE_ALLOW), "pypi.org", "passthrough"),
        (allow(Reason.OPEN), None, "passthrough"),
        (deny(Reason.LOCKED), "api.openai.com", None),
        (deny(Reason.LOCKED), "pypi.org", None),
    ],
)
def test_tls_mode(decision: object, name: str | None, mode: str | None) -> None:
    assert tls_mode(PROFILE, decision, name) == mode  # type: ignore[arg-type]


A, B, PRIVATE = IPv4Address("151.101.0.223"), IPv4Address("151.101.64.223"), IPv4Address("10.0.0.5")


@pytest.mark.parametrize(
    ("answers", "key", "dial"),
    [
        ([A, B], "allow.rule", A),
        ([A, PRIVATE], "deny.rebinding", None),  # one bad answer refuses the name
        ([PRIVATE, A], "deny.rebinding", None),
        ([], "deny.unresolvable", None),
        ([ip_address("2001:db8::1")], "deny.rebinding", None),  # as decide() says of it
    ],
)
def test_judge_answers(answers: list[IPv4Address], key: str, dial: IPv4Address | None) -> None:
    judged = judge_answers(PROFILE, "pypi.org", 443, answers)
    assert (judged.decision.key, judged.address) == (key, dial)
    assert [a for a, _ in judged.each] == answers


def test_explain_says_what_the_proxy_would() -> None:
    for answers in ([A, B], [A, PRIVATE], []):
        out = explain(PROFILE, "pypi.org:443", resolve=lambda _, a=answers: list(a))
        assert out.reason == judge_answers(PROFILE, "pypi.org", 443, answers).decision.key
        assert [x["address"] for x in out.addresses] == [str(a) for a in answers]


@pytest.mark.parametrize(
    ("decision", "sni", "key"),
    [
        # an inspected name reached at an address the resolver never gave: refused at the gate
        (allow(Reason.RULE_ALLOW), "api.openai.com", "deny.protocol"),
        (allow(Reason.RULE_ALLOW), "pypi.org", "allow.rule"),
        (allow(Reason.OPEN), None, "allow.open"),
        (deny(Reason.NOT_ALLOWLISTED), "api.openai.com", "deny.not_allowlisted"),
    ],
)
def test_the_tls_gate_verdict(decision: object, sni: str | None, key: str) -> None:
    assert gate_verdict(PROFILE, decision, sni).key == key  # type: ignore[arg-type]
