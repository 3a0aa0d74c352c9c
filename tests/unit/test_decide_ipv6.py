"""``decide()`` for IPv6 (issue 14 part 5): the same judgement as IPv4 where the gateway's
uplink has IPv6 (``Profile.uplink_ipv6``), ``deny.ipv6`` saying why where it has none.

Rows read ``attempt -> (locked, open, allowlist)`` with the uplink's IPv6 on; every row is
also checked with it off, where everything that is not refused by its class is ``deny.ipv6``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from ipaddress import IPv6Address

import pytest

from sandgate.explain import explain
from sandgate.policy.classify import AddressClass
from sandgate.policy.decide import Attempt, Reason, decide, decide_answer
from sandgate.policy.dnsnames import QTYPE_AAAA, judge_question, reverse_address6
from sandgate.policy.model import Mode
from sandgate.policy.profile import Profile

from .test_decide import (
    GATEWAY,
    MODE_ONLY,
    POLICY,
    TCP,
    UDP,
    att,
    by_mode,
    mapped,
    nat64,
    outcome,
    rules_profile,
    same,
    six_to_four,
    teredo,
)


def coder(mode: Mode, uplink_ipv6: bool = True, **kw: object) -> Profile:
    return POLICY.profile(
        "coder",
        mode=mode,
        gateway_address=GATEWAY,
        uplink_ipv6=uplink_ipv6,
        **kw,  # type: ignore[arg-type]
    )


def exemptions(mode: Mode, uplink_ipv6: bool = True) -> Profile:
    return POLICY.profile("exemptions", mode=mode, gateway_address=GATEWAY, uplink_ipv6=uplink_ipv6)


def nat64_local(v4: str) -> IPv6Address:
    """RFC 8215 local-use prefix, RFC 6052 /48 format: IPv4 in bytes 6-7 and 9-10."""
    packed = bytearray(IPv6Address("64:ff9b:1::").packed)
    b = ipaddress.IPv4Address(v4).packed
    packed[6:8], packed[9:11] = b[:2], b[2:]
    return IPv6Address(bytes(packed))


# attempt -> (locked, open, allowlist) under the coder profile, the uplink having IPv6.
CODER_V6 = [
    # Public IPv6 goes on like IPv4: the mode decides, QUIC and DoT are refused.
    ("public", att(TCP, "2606:4700:4700::1111", 443), MODE_ONLY),
    ("public-edge-low", att(TCP, "2000::", 443), MODE_ONLY),
    ("public-edge-high", att(TCP, "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 443), MODE_ONLY),
    ("public-quic", att(UDP, "2606:4700:4700::1111", 443), same("deny.quic")),
    ("public-dot", att(TCP, "2606:4700:4700::1111", 853), same("deny.dns_bypass")),
    ("public-dns-redirect", att(UDP, "2606:4700:4700::1111", 53), same("deny.dns_redirect")),
    (
        "public-by-allowed-name",
        att(TCP, "2a04:4e42::223", 443, "pypi.org"),
        by_mode("deny.locked", "allow.rule coder.allow[1]", "allow.rule coder.allow[1]"),
    ),
    ("public-by-other-name", att(TCP, "2a04:4e42::223", 443, "example.org"), MODE_ONLY),
    (
        "public-by-denied-name",
        att(TCP, "2a04:4e42::223", 443, "gist.github.com"),
        same("deny.rule coder.deny[0]"),
    ),
    # Every special-purpose IPv6 block is refused by its class, each edge.
    ("unspecified", att(TCP, "::", 80), same("deny.unspecified")),
    ("loopback", att(TCP, "::1", 80), same("deny.loopback")),
    ("ula-low", att(TCP, "fc00::", 80), same("deny.unique_local")),
    (
        "ula-high",
        att(TCP, "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 80),
        same("deny.unique_local"),
    ),
    (
        "just-below-ula",
        att(TCP, "fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 80),
        same("deny.reserved"),
    ),
    ("link-local-low", att(TCP, "fe80::", 80), same("deny.link_local")),
    (
        "link-local-high",
        att(TCP, "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 80),
        same("deny.link_local"),
    ),
    ("site-local", att(TCP, "fec0::1", 80), same("deny.site_local")),
    ("multicast", att(UDP, "ff02::fb", 5353), same("deny.multicast")),
    ("discard", att(TCP, "100::1", 80), same("deny.discard")),
    ("documentation", att(TCP, "2001:db8::1", 443), same("deny.documentation")),
    ("documentation-3fff", att(TCP, "3fff::1", 443), same("deny.documentation")),
    ("benchmarking", att(TCP, "2001:2::1", 443), same("deny.benchmarking")),
    ("ietf-protocol", att(TCP, "2001:1ff::1", 443), same("deny.ietf_protocol")),
    ("just-above-ietf", att(TCP, "2001:200::1", 443), MODE_ONLY),
    ("orchid", att(TCP, "2001:20::1", 443), same("deny.identifier")),
    ("srv6", att(TCP, "5f00::1", 443), same("deny.segment_routing")),
    ("reserved", att(TCP, "4000::1", 443), same("deny.reserved")),
    ("metadata-aws", att(TCP, "fd00:ec2::254", 80), same("deny.metadata")),
    ("metadata-gcp", att(TCP, "fd20:ce::254", 80), same("deny.metadata")),
    ("metadata-by-name", att(TCP, "fd00:ec2::254", 80, "example.org"), same("deny.rebinding")),
    # Forms carrying an IPv4: judged by that IPv4; a public one refused as a transition form.
    ("mapped-metadata", att(TCP, mapped("169.254.169.254"), 80), same("deny.metadata")),
    ("mapped-public", att(TCP, mapped("8.8.8.8"), 443), MODE_ONLY),
    ("compatible-private", att(TCP, "::10.0.0.1", 80), same("deny.private")),
    ("nat64-private", att(TCP, nat64("10.0.0.1"), 80), same("deny.private")),
    ("nat64-metadata", att(TCP, nat64("169.254.169.254"), 80), same("deny.metadata")),
    ("nat64-loopback", att(TCP, nat64("127.0.0.1"), 80), same("deny.loopback")),
    ("nat64-public", att(TCP, nat64("8.8.8.8"), 443), same("deny.ipv6_embedding")),
    ("nat64-local-private", att(TCP, nat64_local("192.168.1.1"), 80), same("deny.private")),
    ("nat64-local-public", att(TCP, nat64_local("8.8.8.8"), 443), same("deny.ipv6_embedding")),
    ("6to4-private", att(TCP, six_to_four("172.16.0.1"), 80), same("deny.private")),
    ("6to4-public", att(TCP, six_to_four("8.8.8.8"), 443), same("deny.ipv6_embedding")),
    ("teredo-private-client", att(TCP, teredo("8.8.4.4", "10.0.0.1"), 80), same("deny.private")),
    ("teredo-public", att(TCP, teredo("8.8.4.4", "8.8.8.8"), 443), same("deny.ipv6_embedding")),
]


@pytest.mark.parametrize(
    ("attempt", "expected"), [pytest.param(a, e, id=i) for i, a, e in CODER_V6]
)
def test_coder_with_ipv6_uplink(attempt: Attempt, expected: tuple[str, str, str]) -> None:
    assert tuple(outcome(decide(coder(m), attempt)) for m in Mode) == expected


@pytest.mark.parametrize(
    ("attempt", "expected"), [pytest.param(a, e, id=i) for i, a, e in CODER_V6]
)
def test_without_ipv6_uplink_it_says_why(attempt: Attempt, expected: tuple[str, str, str]) -> None:
    """Without IPv6 on the uplink, what the class refuses stays refused by its class (and the
    mapped form is IPv4); every other IPv6 attempt is ``deny.ipv6``, saying why."""
    got = [decide(coder(m, uplink_ipv6=False), attempt) for m in Mode]
    address = attempt.address
    is_v4 = isinstance(address, IPv6Address) and address.ipv4_mapped is not None
    if is_v4 or all(e in _KEPT for e in expected):
        assert tuple(outcome(d) for d in got) == expected
    else:
        assert [d.key for d in got] == ["deny.ipv6"] * 3
        assert "uplink has no IPv6" in got[0].explain()


# Kept without IPv6: reasons settled before the address (a deny rule, DNS to the gateway) and
# refusals by the address's class.
_KEPT = {"deny.rule coder.deny[0]", "deny.dns_redirect", "deny.rebinding"} | {
    f"deny.{c.value}" for c in AddressClass
}


EXEMPTIONS_V6 = [
    ("ula-rule", att(TCP, "fd00::1", 80), "allow.exempt exemptions.allow[6]"),
    ("ula-rule-neighbour", att(TCP, "fd00::2", 80), "deny.unique_local"),
    ("documentation-rule", att(TCP, "2001:db8::1", 80), "allow.exempt exemptions.allow[7]"),
    (
        "documentation-rule-edge",
        att(TCP, "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 80),
        "allow.exempt exemptions.allow[7]",
    ),
    ("public-rule", att(TCP, "2606:4700::1111", 443), "allow.rule exemptions.allow[8]"),
    # An IPv4 rule opens the IPv4, never its NAT64 form.
    ("v4-rule-not-its-nat64", att(TCP, nat64("10.77.0.5"), 1234), "deny.private"),
]


@pytest.mark.parametrize(
    ("attempt", "expected"), [pytest.param(a, e, id=i) for i, a, e in EXEMPTIONS_V6]
)
def test_exemptions_with_ipv6_uplink(attempt: Attempt, expected: str) -> None:
    assert [outcome(decide(exemptions(m), attempt)) for m in Mode] == [expected] * 3


def test_link_local_and_multicast_are_never_exempted() -> None:
    """No router forwards them: a rule naming fe80::/10 or ff02::fb opens nothing."""
    for target, attempt, key in (
        ("fe80::/10", att(TCP, "fe80::1", 80), "deny.link_local"),
        ("fe80::a9fe:a9fe", att(TCP, "fe80::a9fe:a9fe", 80), "deny.metadata"),
        ("ff02::fb", att(UDP, "ff02::fb", 5353), "deny.multicast"),
    ):
        profile = replace(rules_profile(Mode.OPEN, [target], []), uplink_ipv6=True)
        assert decide(profile, attempt).key == key


def test_public_override_declares_the_test_worlds_v6_internet() -> None:
    world = (ipaddress.ip_network("2001:db8::/32"),)
    got = [decide(coder(m, public_override=world), att(TCP, "2001:db8:1::10", 443)) for m in Mode]
    assert tuple(d.key for d in got) == MODE_ONLY
    # ... which makes the addresses public, nothing more: ULA and NAT64 forms stay special.
    p = coder(Mode.OPEN, public_override=world)
    assert decide(p, att(TCP, "fd00::1", 80)).key == "deny.unique_local"
    assert decide(p, att(TCP, nat64("10.0.0.1"), 80)).key == "deny.private"


def test_aaaa_answers_are_pinned_like_a() -> None:
    p = coder(Mode.ALLOWLIST)
    ok = decide_answer(p, "pypi.org", IPv6Address("2a04:4e42::223"))
    assert ok.allowed
    bad = decide_answer(p, "pypi.org", IPv6Address("fd00:ec2::254"))
    assert (bad.key, bad.allowed) == ("deny.rebinding", False)


def test_aaaa_questions_follow_the_uplink() -> None:
    with_v6 = judge_question(coder(Mode.OPEN), "example.com", QTYPE_AAAA)
    assert with_v6.allowed and with_v6.reason is Reason.OPEN
    without = judge_question(coder(Mode.OPEN, uplink_ipv6=False), "example.com", QTYPE_AAAA)
    assert without.key == "deny.ipv6" and "uplink has no IPv6" in without.explain()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.7.4.0.0.0.0.7.4.6.0.6.2.ip6.arpa", "allow.open"),
        ("8.b.d.0.1.0.0.2.ip6.arpa", "deny.documentation"),  # 2001:db8::/32
        ("c.f.ip6.arpa", "deny.unique_local"),
        ("ip6.arpa", "deny.unspecified"),
        ("x.f.ip6.arpa", "deny.special"),  # not nibbles
    ],
)
def test_reverse_ipv6_names(name: str, expected: str) -> None:
    assert judge_question(coder(Mode.OPEN), name, 12).key == expected
    assert judge_question(coder(Mode.OPEN, uplink_ipv6=False), name, 12).key == "deny.ipv6"


def test_reverse_address6() -> None:
    assert reverse_address6("8.b.d.0.1.0.0.2.ip6.arpa") == IPv6Address("2001:db8::")
    assert reverse_address6("g.ip6.arpa") is None
    assert reverse_address6(".".join("0" * 33) + ".ip6.arpa") is None


def test_explain_says_which_classification_it_used() -> None:
    """The issue's check: ``explain '[2606:4700:4700::1111]:443'`` in open mode."""
    got = explain(coder(Mode.OPEN), "[2606:4700:4700::1111]:443").as_json()
    assert (got["verdict"], got["reason"]) == ("allow", "allow.open")
    assert got["addresses"][0]["class"] == "public"
    off = explain(coder(Mode.OPEN, uplink_ipv6=False), "[2606:4700:4700::1111]:443").as_json()
    assert (off["verdict"], off["reason"]) == ("deny", "deny.ipv6")
    assert "uplink has no IPv6" in off["detail"]


def test_explain_command_json() -> None:
    """``sandgate explain --json '[2606:4700:4700::1111]:443'``, the embedded open policy."""
    import json

    from typer.testing import CliRunner

    from sandgate.cli import app

    target = "[2606:4700:4700::1111]:443"
    on = CliRunner().invoke(app, ["explain", "--json", target])  # as the issue writes it
    got = json.loads(on.stdout)
    assert (got["verdict"], got["reason"], got["addresses"][0]["class"]) == (
        "allow",
        "allow.open",
        "public",
    )
    # And what an IPv4-only uplink would say instead, with the option that judges as one.
    assert got["uplink_ipv6"] and got["without_ipv6"] == {"verdict": "deny", "reason": "deny.ipv6"}
    off = CliRunner().invoke(app, ["explain", "--json", "--no-ipv6", target])
    assert json.loads(off.stdout)["reason"] == "deny.ipv6"
    v4 = json.loads(CliRunner().invoke(app, ["explain", "--json", "203.0.113.9:443"]).stdout)
    assert "without_ipv6" not in v4  # an IPv4 target is judged alike either way
