"""Domain rules share pin sets (policy/pins.py): one set and one verdict site per list and
scope, and still every log line names the rule ``decide()`` names (issue 11 part 4).

The groups are not in profile order (``d0`` holds deny[0] and deny[2], ``d1`` deny[1]), so
the site a packet meets first may be another group's than the rule ``decide()`` names: the
reader picks, among the rules the resolver pinned the address under, the first of the list
whose scope holds the packet. Each case below is one way to get that wrong.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network
from typing import Any

import pytest

from sandgate.gateway.logs.logreader import gateway_event
from sandgate.net.compile import GuestLink, base_ruleset, guest_add, pin_set
from sandgate.net.nflog import NflogPacket
from sandgate.policy.decide import Attempt, decide
from sandgate.policy.load import parse_policy
from sandgate.policy.model import Protocol
from sandgate.policy.pins import pin_groups, pin_rules
from tests.nfteval import Nft, Packet

POOL = IPv4Network("10.201.0.0/16")
LINK = GuestLink.from_pool(POOL, 5, "02:00:00:00:00:05")
TEXT = b"""
[profiles.p]
internet = "allowlist"
deny = [
  { domain = "*.github.com", port = 23 },
  { domain = "gist.github.com", port = [22, 25] },
  { domain = "*.github.com", port = 22 },
  { domain = "raw.github.com", port = 23 },
]
allow = [
  { domain = "*.github.com", port = 443 },
  { domain = "pypi.org" },
  { domain = "api.github.com", port = [443, 8443] },
  { domain = "gist.github.com", port = 443 },
  { domain = "*.github.com" },
]
"""
INTERNET = (IPv4Network("203.0.113.0/24"),)  # the test world's "public" addresses
PROFILE = parse_policy(TEXT, "t.toml").profile(
    "p", public_override=INTERNET, gateway_address=LINK.gateway
)
ADDRESS = {
    "gist.github.com": "203.0.113.33",
    "raw.github.com": "203.0.113.34",
    "api.github.com": "203.0.113.31",
    "pypi.org": "203.0.113.20",
}


def _nft() -> Nft:
    base, base_sites = base_ruleset("up0", POOL, public_override=INTERNET)
    guest, sites = guest_add(LINK, PROFILE)
    sets: dict[str, list[str]] = {}
    for name, address in ADDRESS.items():  # what the resolver pins (pin_elements' sets)
        for pin in pin_rules(PROFILE, name):
            sets.setdefault(pin_set(LINK.ifname, pin.tag), []).append(address)
    return Nft(base + guest, {**base_sites, **sites}, LINK, sets)


def test_nine_domain_rules_are_four_pin_sets() -> None:
    groups = pin_groups(PROFILE)
    assert [(g.tag, [p.index for p in g.rules]) for g in groups] == [
        ("d0", [0, 3]),
        ("d1", [1]),
        ("d2", [2]),
        ("a0", [0, 3]),
        ("a1", [1, 4]),
        ("a2", [2]),
    ]
    cmds, _ = guest_add(LINK, PROFILE)
    made = [c["add"]["set"]["name"] for c in cmds if "set" in c.get("add", {})]
    assert sorted(n for n in made if n.startswith("pin_")) == sorted(
        f"pin_g5_{g.tag}" for g in groups
    )


@pytest.mark.parametrize(
    ("name", "port"),
    [
        ("gist.github.com", 22),  # d1 (deny[1]) before d2 (deny[2])
        ("gist.github.com", 23),  # d0: deny[0], not deny[3]'s name
        ("raw.github.com", 23),  # d0 holds deny[0] and deny[3]: the first
        ("gist.github.com", 25),
        ("gist.github.com", 443),  # a0 holds allow[0] and allow[3]: allow[0]
        ("api.github.com", 8443),  # a2 (allow[2]) before a1's allow[4]
        ("api.github.com", 9000),  # only allow[4] holds the port
        ("pypi.org", 8080),
        ("raw.github.com", 443),
    ],
)
def test_a_pin_groups_log_line_names_decides_rule(name: str, port: int) -> None:
    nft = _nft()
    address = ADDRESS[name]
    d = decide(PROFILE, Attempt(Protocol.TCP, ipaddress.ip_address(address), port, name))
    reached, verdict = nft.trace(Packet(IPv4Address(address), "tcp", port))
    assert reached == d.allowed, (name, port, d.key)
    site = nft.site(verdict)
    assert site is not None and site.pins is not None, (name, port, verdict)
    tags = {p.tag for n, a in ADDRESS.items() if a == address for p in pin_rules(PROFILE, n)}
    pkt = NflogPacket(
        group=2, prefix=site.prefix, hook=None, family=2, indev=None, outdev=None, uid=None,
        gid=None, seq=None, seq_global=None, timestamp=None, proto=6, src=str(LINK.guest),
        dst=address, sport=40000, dport=port, tcp_flags=2, icmp_type=None, icmp_code=None,
        length=60, mark=None,
    )  # fmt: skip
    pinned = {(LINK.ifname, address): sorted(tags)}
    _, event = gateway_event(pkt, site, lambda src: None, None, lambda g, a: pinned[(g, a)])
    assert (event.verdict, event.rule) == (d.verdict.value, d.rule_ref), (name, port, event)


def test_a_shorter_answer_does_not_shorten_a_shared_pin() -> None:
    """Two names of one pin group at one address: the kernel keeps one element and sets its
    timeout anew on each add, so the resolver pins the second with the longer TTL it holds."""
    from sandgate.gateway.dns.resolver import GuestDNS, Resolver

    asked: list[tuple[tuple[str, ...], int, tuple[str, ...]]] = []

    def pin(dns: object, addresses: tuple[str, ...], ttl: int, tags: Any, insp: bool) -> int:
        asked.append((addresses, ttl, tuple(tags)))
        return ttl

    resolver = Resolver([], lambda key, event: None, pin)
    guest = GuestDNS(LINK, None, PROFILE, "p")
    address = ADDRESS["api.github.com"]

    def answer(name: str, ttl: int, at: str = address) -> None:
        tags = tuple(p.tag for p in pin_rules(PROFILE, name))
        resolver._ensure_pinned(guest, (at,), tags, False, ttl)

    answer("api.github.com", 3600)  # allow[0], allow[2], allow[4]: sets a0, a2, a1
    answer("gist.github.com", 60)  # allow[0], allow[3] (a0), allow[4] (a1): shared sets
    (_, first, _), (_, second, tags) = asked
    assert first == 3600 and {"a0.0", "a0.3", "a1.4"} <= set(tags), tags
    assert second >= 3599, asked  # not 60: that would cut api.github.com's pin short
    answer("pypi.org", 60, ADDRESS["pypi.org"])  # set a1 too, another address: its own TTL
    assert asked[-1][1] == 60, asked


def test_in_one_burst_the_longer_pin_is_written_last() -> None:
    """Answers of one loop pass share one pin write each (the resolver's burst): where two put
    one address into one set, the longer TTL is written last, so the kernel keeps it."""
    import asyncio

    from sandgate.gateway.dns.resolver import GuestDNS, Resolver

    written: list[tuple[int, tuple[str, ...]]] = []

    def pin(dns: object, addresses: tuple[str, ...], ttl: int, tags: Any, insp: bool) -> int:
        written.append((ttl, tuple(tags)))
        return ttl

    resolver = Resolver([], lambda key, event: None, pin)
    guest = GuestDNS(LINK, None, PROFILE, "p")
    address = ADDRESS["api.github.com"]

    def answer(name: str, ttl: int) -> None:
        tags = tuple(p.tag for p in pin_rules(PROFILE, name))
        resolver._ensure_pinned(guest, (address,), tags, False, ttl)

    async def burst() -> None:
        answer("api.github.com", 3600)
        answer("gist.github.com", 60)  # same address, shared sets a0 and a1
        await asyncio.sleep(0.01)

    asyncio.run(burst())
    assert [ttl for ttl, _ in written] == [60, 3600], written


def test_an_inspected_name_at_an_address_already_pinned_still_gets_inspected() -> None:
    """Two names at one address with the same pin sets (example.com and www.example.com in the
    test world), only the second inspected: its answer must still put the address into the
    inspect set, though the first answer pinned it into the same rule sets a moment ago."""
    from sandgate.gateway.dns.resolver import GuestDNS, Resolver

    written: list[tuple[tuple[str, ...], bool]] = []

    def pin(dns: object, addresses: tuple[str, ...], ttl: int, tags: Any, insp: bool) -> int:
        written.append((addresses, insp))
        return ttl

    resolver = Resolver([], lambda key, event: None, pin)
    guest = GuestDNS(LINK, None, PROFILE, "p")
    at = ADDRESS["pypi.org"]
    tags = tuple(p.tag for p in pin_rules(PROFILE, "pypi.org"))
    for inspect in (False, True, True):
        resolver._ensure_pinned(guest, (at,), tags, inspect, 300)
    assert written == [((at,), False), ((at,), True)]  # the third: both still held
