"""Authoritative answers, computed without sockets: query in, response out."""

from __future__ import annotations

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest

from sandgate.world.servers.dnszone import ZoneSpec, answer, build_zones

ZONES = build_zones(
    [
        ZoneSpec.model_validate(
            {
                "origin": "example.test",
                "ttl": 120,
                "records": [
                    {"name": "@", "type": "A", "value": "203.0.113.10", "ttl": 60},
                    {"name": "@", "type": "AAAA", "value": "2001:db8::10"},
                    {"name": "www", "type": "CNAME", "value": "@"},
                    {"name": "out", "type": "CNAME", "value": "elsewhere.invalid."},
                    {"name": "loop1", "type": "CNAME", "value": "loop2"},
                    {"name": "loop2", "type": "CNAME", "value": "loop1"},
                    {"name": "a.deep", "type": "A", "value": "203.0.113.11"},
                    {"name": "*.star", "type": "A", "value": "203.0.113.12"},
                    {"name": "t", "type": "TXT", "value": "x" * 300},
                    {"name": "mx", "type": "MX", "value": "10 mail"},
                ],
            }
        ),
        ZoneSpec(origin="sub.example.test", records=[]),
        ZoneSpec.model_validate(
            {
                "origin": "exfil.test",
                "wildcard": True,
                "records": [{"type": "A", "value": "198.51.100.66"}],
            }
        ),
    ]
)


def ask(name: str, rdtype: str = "A") -> dns.message.Message:
    return answer(ZONES, dns.message.make_query(name, rdtype))


def values(response: dns.message.Message) -> list[str]:
    return [rd.to_text() for rrset in response.answer for rd in rrset]


@pytest.mark.parametrize(
    ("name", "rdtype", "rcode", "expected"),
    [
        ("example.test", "A", "NOERROR", ["203.0.113.10"]),
        ("EXAMPLE.test.", "AAAA", "NOERROR", ["2001:db8::10"]),
        ("www.example.test", "A", "NOERROR", ["example.test.", "203.0.113.10"]),
        ("www.example.test", "CNAME", "NOERROR", ["example.test."]),
        ("out.example.test", "A", "NOERROR", ["elsewhere.invalid."]),
        ("nope.example.test", "A", "NXDOMAIN", []),
        ("deep.example.test", "A", "NOERROR", []),  # empty non-terminal: NODATA
        ("x.y.star.example.test", "A", "NOERROR", ["203.0.113.12"]),
        ("mx.example.test", "MX", "NOERROR", ["10 mail.example.test."]),
        ("example.test", "NS", "NOERROR", ["ns1.example.test."]),
        ("loop1.example.test", "A", "SERVFAIL", None),
        ("www.sub.example.test", "A", "NXDOMAIN", []),  # the child zone answers for itself
        ("outside.invalid", "A", "REFUSED", []),
    ],
)
def test_answers(name: str, rdtype: str, rcode: str, expected: list[str] | None) -> None:
    response = ask(name, rdtype)
    assert dns.rcode.to_text(response.rcode()) == rcode
    if expected is not None:
        assert values(response) == expected


def test_negative_answers_carry_the_soa_and_aa() -> None:
    for response in (ask("nope.example.test"), ask("example.test", "TXT")):
        assert response.flags & dns.flags.AA
        assert response.authority[0].rdtype == dns.rdatatype.SOA
    sub = ask("www.sub.example.test")
    assert sub.authority[0].name.to_text() == "sub.example.test."


def test_wildcard_answers_carry_the_asked_name() -> None:
    long_label = "a" * 63
    name = f"{long_label}.{long_label}.exfil.test"
    response = ask(name)
    assert values(response) == ["198.51.100.66"]
    assert response.answer[0].name.to_text() == name + "."
    assert ask("x.star.example.test").answer[0].name.to_text() == "x.star.example.test."


def test_ttls_and_long_txt() -> None:
    assert ask("example.test").answer[0].ttl == 60
    assert ask("example.test", "AAAA").answer[0].ttl == 120
    txt = ask("t.example.test", "TXT").answer[0][0]
    assert b"".join(txt.strings) == b"x" * 300
    assert [len(s) for s in txt.strings] == [255, 45]


def test_any_and_notimp() -> None:
    types = {rrset.rdtype for rrset in ask("example.test", "ANY").answer}
    assert {dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.SOA, dns.rdatatype.NS} <= types
    query = dns.message.make_query("example.test", "A")
    query.set_opcode(dns.opcode.STATUS)
    assert answer(ZONES, query).rcode() == dns.rcode.NOTIMP


def test_records_outside_the_zone_are_rejected() -> None:
    spec = ZoneSpec.model_validate(
        {"origin": "a.test", "records": [{"name": "b.test.", "type": "A", "value": "192.0.2.1"}]}
    )
    with pytest.raises(ValueError, match="outside"):
        build_zones([spec])
