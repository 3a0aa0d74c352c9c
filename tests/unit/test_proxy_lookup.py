"""The proxy's name lookups: asked once per TTL, never kept when empty, the TTL capped."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

import dns.message
import dns.rrset

from sandgate.gateway.dns.dnslogic import Addresses, read_addresses
from sandgate.gateway.proxy.lookup import Lookups


def reply(name: str, ttl: int, *addresses: str, cname_ttl: int | None = None) -> Addresses:
    """What the resolver hands the proxy for such an upstream reply (read once, there)."""
    found = read_addresses(wire(name, ttl, *addresses, cname_ttl=cname_ttl))
    assert found is not None
    return found


def wire(name: str, ttl: int, *addresses: str, cname_ttl: int | None = None) -> bytes:
    q = dns.message.make_query(name, "A")
    r = dns.message.make_response(q)
    target = name + "."
    if cname_ttl is not None:
        target = "edge." + name + "."
        r.answer.append(dns.rrset.from_text(name + ".", cname_ttl, "IN", "CNAME", target))
    if addresses:
        r.answer.append(dns.rrset.from_text(target, ttl, "IN", "A", *addresses))
    return r.to_wire()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_kept_for_its_ttl_and_asked_again_after() -> None:
    clock, asked = Clock(), []

    def ask(name: str) -> Addresses:
        asked.append(name)
        return reply(name, 30, "203.0.113.7", "203.0.113.8")

    lookups = Lookups(ask, clock=clock)
    want = [IPv4Address("203.0.113.7"), IPv4Address("203.0.113.8")]
    assert sorted(lookups("API.Example.com.")) == want
    clock.now += 29.9
    assert sorted(lookups("api.example.com")) == want
    assert asked == ["api.example.com"]
    clock.now += 0.2  # past the TTL
    assert sorted(lookups("api.example.com")) == want
    assert asked == ["api.example.com"] * 2


def test_empty_and_missing_answers_are_not_kept() -> None:
    asked: list[str] = []

    def ask(name: str) -> Addresses | None:
        asked.append(name)
        return None if name == "gone.example" else reply(name, 300)

    lookups = Lookups(ask, clock=Clock())
    for _ in range(2):
        assert lookups("gone.example") == []
        assert lookups("empty.example") == []
    assert asked == ["gone.example", "empty.example"] * 2


def test_the_ttl_is_capped_and_a_cname_bounds_it() -> None:
    found = reply("a.example", 600, "203.0.113.1", cname_ttl=5)
    assert (found.found, found.ttl) == ((IPv4Address("203.0.113.1"),), 5)
    clock, asked = Clock(), []
    lookups = Lookups(
        lambda n: asked.append(n) or reply(n, 86400, "203.0.113.1"), cap=60, clock=clock
    )
    lookups("a.example")
    clock.now += 61
    lookups("a.example")
    assert len(asked) == 2
    assert read_addresses(b"\x00garbage") is None


def test_a_name_with_only_aaaa_gives_its_ipv6_addresses() -> None:
    """The resolver answers an AAAA question for a name with no A record (an IPv6-only name):
    its addresses are kept like A's, and decide() judges them (deny.ipv6 without an IPv6
    uplink)."""
    q = dns.message.make_query("v6only.example.net", "AAAA")
    r = dns.message.make_response(q)
    r.answer.append(dns.rrset.from_text("v6only.example.net.", 60, "IN", "AAAA", "2001:db8::10"))
    found = read_addresses(r.to_wire())
    assert found is not None and found.nodata
    assert found.found == (IPv6Address("2001:db8::10"),) and found.ttl == 60
    clock = Clock()
    assert Lookups(lambda n: found, clock=clock)("v6only.example.net") == [
        IPv6Address("2001:db8::10")
    ]
