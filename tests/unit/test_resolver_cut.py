"""While the watchdog has cut the gateway off, the resolver answers nothing, but every question
is still an event: ``deny.cut``, with the name where the question can be read (principle 4)."""

from __future__ import annotations

from ipaddress import IPv4Network
from typing import Any

import dns.message

from sandgate.events.schema import Event
from sandgate.gateway.dns.resolver import GuestDNS, Resolver
from sandgate.net.compile import GuestLink
from sandgate.policy.load import parse_policy

LINK = GuestLink.from_pool(IPv4Network("10.201.0.0/16"), 3, "02:00:00:00:00:03")
PROFILE = parse_policy(b'[profiles.p]\ninternet = "open"\n', "t.toml").profile(
    "p", gateway_address=LINK.gateway
)


def _ask(resolver: Resolver, guest: GuestDNS, wire: bytes) -> list[bytes | None]:
    replies: list[bytes | None] = []
    resolver.resolve(guest, wire, ("10.201.0.14", 5353), "udp", replies.append)
    return replies


def test_questions_refused_while_cut_are_events() -> None:
    events: list[Event] = []

    def pin(*args: Any) -> int:
        raise AssertionError("nothing is pinned while cut off")

    resolver = Resolver([], lambda key, event: events.append(event), pin)
    guest = GuestDNS(LINK, "s1", PROFILE, "p")
    resolver.cut = True
    query = dns.message.make_query("pypi.org", "A")
    replies = _ask(resolver, guest, query.to_wire())
    assert len(replies) == 1 and replies[0] is not None
    assert dns.message.from_wire(replies[0]).rcode() == dns.rcode.REFUSED
    replies = _ask(resolver, guest, b"\x12\x34garbage")  # not a question: still an event
    assert len(events) == 2, events
    first, second = events
    assert (first.verdict, first.reason, first.name, first.session) == (
        "deny",
        "deny.cut",
        "pypi.org",
        "s1",
    )
    assert (second.reason, second.name) == ("deny.cut", None)
