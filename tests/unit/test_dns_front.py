"""A fronted name's answer is the asking guest's own gateway address (gateway/dns/resolver.py
``_local``): cached, it must stay that guest's. Shared across the guests of one profile, as
every other answer is, it sent the next guest to another guest's gateway address, which was
refused (the warm pool's revert, issue 13: each session had a new address)."""

from __future__ import annotations

from ipaddress import IPv4Network

import dns.message
import dns.rdatatype

from sandgate.events.schema import Event
from sandgate.gateway.dns.resolver import GuestDNS, Resolver
from sandgate.net.compile import GuestLink
from sandgate.policy.load import parse_policy

POOL = IPv4Network("10.201.0.0/16")
POLICY = parse_policy(
    b'[profiles.p]\ninternet = "locked"\nallow = [{ host = "10.77.0.10", port = 8000 }]\n'
    b'[[profiles.p.front]]\nname = "models.lan"\nupstream = "http://10.77.0.10:8000"\n',
    "t.toml",
)


class NoUpstream:
    """A fronted name is answered locally: asking upstream is a bug."""

    def new_id(self) -> int:
        return 1

    def send(self, query: bytes, done: object) -> None:
        raise AssertionError("a fronted name went upstream")


def guest(index: int, key: str = "p") -> GuestDNS:
    link = GuestLink.from_pool(POOL, index, f"02:00:00:00:00:{index:02x}")
    profile = POLICY.profile("p", gateway_address=link.gateway)
    return GuestDNS(link, "s", profile, key)


def answer(r: Resolver, g: GuestDNS, qid: int) -> list[str]:
    q = dns.message.make_query("models.lan", "A")
    q.id = qid
    got: list[bytes | None] = []
    r.resolve(g, q.to_wire(), (str(g.link.guest), 40000 + qid), "udp", got.append)
    (wire,) = got
    assert wire is not None
    reply = dns.message.from_wire(wire)
    assert reply.id == qid
    return [d.to_text() for rrset in reply.answer if rrset.rdtype == dns.rdatatype.A for d in rrset]


def test_each_guest_of_a_profile_is_answered_its_own_gateway_cached_or_not() -> None:
    events: list[Event] = []
    r = Resolver([], lambda key, event: events.append(event), lambda *a: 300)
    r.upstream = NoUpstream()  # type: ignore[assignment]
    a, b = guest(3), guest(4)
    for round_ in range(2):  # asked fresh, then from the cache
        for n, g in enumerate((a, b, a)):
            assert answer(r, g, 10 * round_ + n) == [str(g.link.gateway)]
    assert sum(bool(e.details.get("cached")) for e in events) == 4  # all but the first two
    # A reload judges a guest's open flows by its own answers only; forget drops them all.
    assert r.names(a) == {str(a.link.gateway): {"models.lan"}}
    assert r.names(b) == {str(b.link.gateway): {"models.lan"}}
    r.forget("p")
    assert r.names(a) == {} and r.names(b) == {}
    assert answer(r, b, 7) == [str(b.link.gateway)]
    assert not events[-1].details.get("cached")
