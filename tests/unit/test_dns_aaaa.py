"""AAAA records in upstream answers (issue 14 part 5): removed unseen where the gateway's
uplink has no IPv6, judged like A records (each one checked, a refused one refuses the whole
answer) where it has."""

from __future__ import annotations

import ipaddress

import dns.message
import dns.rdatatype
import dns.rrset

from sandgate.gateway.dns import dnslogic as L
from sandgate.policy.classify import classify


def _answer(qtype: str, records: list[tuple[str, str]]) -> tuple[L.Question, bytes]:
    query = dns.message.make_query("example.com", qtype)
    q = L.parse_question(query.to_wire())
    resp = dns.message.make_response(query)
    for rdtype in dict.fromkeys(t for t, _ in records):
        texts = [a for t, a in records if t == rdtype]
        resp.answer.append(dns.rrset.from_text("example.com.", 300, "IN", rdtype, *texts))
    return q, resp.to_wire()


def _special(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    cls = classify(address)
    return f"deny.{cls.cls.value}" if cls.special else None


def _records(wire: bytes) -> list[tuple[str, str]]:
    msg = dns.message.from_wire(wire)
    return [(dns.rdatatype.to_text(r.rdtype), d.address) for r in msg.answer for d in r]


def test_without_ipv6_aaaa_records_are_removed_unseen() -> None:
    q, wire = _answer("AAAA", [("AAAA", "fd00::1"), ("AAAA", "2606:4700::1111")])
    ans = L.judge_answer(q, wire, _special)
    assert (ans.refused, ans.addresses, _records(ans.wire)) == (None, (), [])


def test_with_ipv6_public_aaaa_records_pass_and_are_reported() -> None:
    q, wire = _answer("AAAA", [("AAAA", "2606:4700::1111"), ("AAAA", "2606:4700::1001")])
    ans = L.judge_answer(q, wire, _special, _special)
    assert ans.refused is None and ans.ttl == 300
    assert sorted(ans.addresses) == ["2606:4700::1001", "2606:4700::1111"]
    assert sorted(_records(ans.wire)) == [("AAAA", "2606:4700::1001"), ("AAAA", "2606:4700::1111")]


def test_with_ipv6_one_special_aaaa_refuses_the_answer() -> None:
    """Rebinding over IPv6: a ULA, a NAT64 form of metadata, or a mapped loopback."""
    for bad, key in (
        ("fd00::1", "deny.unique_local"),
        ("64:ff9b::a9fe:a9fe", "deny.metadata"),
        ("::ffff:127.0.0.1", "deny.loopback"),
    ):
        q, wire = _answer("AAAA", [("AAAA", "2606:4700::1111"), ("AAAA", bad)])
        ans = L.judge_answer(q, wire, _special, _special)
        shown = str(ipaddress.ip_address(bad))
        assert (ans.refused, ans.refused_address, ans.addresses) == (key, shown, ())
        assert _records(ans.wire) == []


def test_with_ipv6_a_records_still_take_the_fast_path() -> None:
    q, wire = _answer("A", [("A", "8.8.8.8")])
    assert L.judge_answer(q, wire, _special, _special).addresses == ("8.8.8.8",)
