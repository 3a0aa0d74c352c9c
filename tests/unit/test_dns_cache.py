"""The resolver's cache answers from bytes (issue 13): a hit copies the cached answer, gives it
the asker's id and spelling of the name, and lowers its TTLs by the seconds held, without
parsing. Differential: for generated questions (0x20 case, EDNS or not, answers the fast reader
takes and ones only dnspython reads, refused names, rebinding answers, answers too large for
plain UDP) the cached answer must be byte for byte what the slow path gives a fresh resolver
for the same question, the upstream's TTLs lowered by the same seconds."""

from __future__ import annotations

import asyncio
import gc
import struct
from collections.abc import Callable
from ipaddress import IPv4Network, ip_address
from pathlib import Path
from typing import Any

import dns.flags
import dns.message
import dns.rrset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandgate.events.schema import Event, Kind
from sandgate.events.store import Store
from sandgate.gateway.dns import cache, dnslogic
from sandgate.gateway.dns.resolver import GuestDNS, Resolver, _has_edns, _truncate
from sandgate.gateway.sink import EventSink
from sandgate.net.compile import GuestLink
from sandgate.policy.decide import decide_answer
from sandgate.policy.dnsnames import judge_question
from sandgate.policy.load import parse_policy

LINK = GuestLink.from_pool(IPv4Network("10.201.0.0/16"), 3, "02:00:00:00:00:03")
PROFILE = parse_policy(
    b'[profiles.p]\ninternet = "open"\ndeny = [{ domain = "gist.example.com" }]\n', "t.toml"
).profile("p", public_override=(IPv4Network("203.0.113.0/24"),), gateway_address=LINK.gateway)
CLIENT = (str(LINK.guest), 40000)

# (type, data) records the upstream answers with; the owner is the question's name.
Records = tuple[tuple[str, str, int], ...]


class FakeUpstream:
    """Answers every query at once with ``records`` (TTLs lowered by ``minus``), as a real
    upstream does: its question echoes ours (lower-case: we ask in lower case)."""

    def __init__(self, records: Records, minus: int = 0, authority: bool = False) -> None:
        self.records, self.minus, self.authority = records, minus, authority
        self.asked = 0

    def new_id(self) -> int:
        return 0x4242

    def send(
        self, query: bytes, done: Callable[[bytes | None, BaseException | None], None]
    ) -> None:
        self.asked += 1
        msg = dns.message.from_wire(query)
        resp = dns.message.make_response(msg)
        resp.flags |= dns.flags.RA
        owner = msg.question[0].name
        for rdtype in dict.fromkeys(t for t, _, _ in self.records):
            datas = [d for t, d, _ in self.records if t == rdtype]
            ttl = min(x for t, _, x in self.records if t == rdtype)
            rrset = dns.rrset.from_text(owner, max(0, ttl - self.minus), "IN", rdtype, *datas)
            resp.answer.append(rrset)
        if self.authority:  # a negative answer's SOA, aged like any record
            soa = "ns.example.com. host.example.com. 1 7200 900 1209600 3600"
            ttl = max(0, 3600 - self.minus)
            resp.authority.append(dns.rrset.from_text(owner, ttl, "IN", "SOA", soa))
        done(resp.to_wire(want_shuffle=False), None)


def resolver(upstream: FakeUpstream, clock: list[float]) -> tuple[Resolver, GuestDNS, list[Event]]:
    events: list[Event] = []
    r = Resolver([], lambda key, event: events.append(event), lambda *a: 300)
    r.upstream = upstream  # type: ignore[assignment]
    r.clock = lambda: clock[0]
    return r, GuestDNS(LINK, "s", PROFILE, "p"), events


def ask(r: Resolver, guest: GuestDNS, wire: bytes) -> bytes | None:
    got: list[bytes | None] = []
    r.resolve(guest, wire, CLIENT, "udp", got.append)
    assert len(got) == 1
    answer = got[0]
    if answer is not None and len(answer) > 512 and not _has_edns(wire):
        answer = _truncate(answer)  # as the UDP listener sends it
    return answer


def query(name: str, qtype: str, case: int, qid: int, payload: int | None) -> bytes:
    spelt = "".join(c.upper() if case >> i & 1 else c for i, c in enumerate(name))
    msg = dns.message.make_query(spelt, qtype, use_edns=payload is not None, payload=payload or 0)
    msg.id = qid
    return msg.to_wire()


def canonical(wire: bytes) -> tuple[object, ...]:
    """A message as its bytes say it, but the order of records within a set (dnspython's
    writer shuffles them): the TTLs and the name's spelling included."""
    msg = dns.message.from_wire(wire)

    def section(rrsets: list[dns.rrset.RRset]) -> list[object]:
        return [
            (r.name.to_wire(), r.rdtype, r.rdclass, r.ttl, sorted(d.to_text() for d in r))
            for r in rrsets
        ]

    return (
        wire[:12],
        msg.question[0].name.to_wire() if msg.question else None,
        section(msg.answer),
        section(msg.authority),
        section(msg.additional),
        msg.edns,
        msg.payload,
        [o.to_text() for o in msg.options],
    )


NAMES = ("example.com", "www.Example.org", "gist.example.com", "localhost", "10.in-addr.arpa")
address = st.builds(
    lambda a, b: f"{a}.0.113.{b}", st.sampled_from((203, 203, 10)), st.integers(1, 254)
)
records = st.one_of(
    st.lists(st.tuples(st.just("A"), address, st.integers(0, 90_000)), min_size=1, max_size=40),
    st.lists(
        st.tuples(
            st.just("MX"),
            st.builds(lambda n: f"{n} mx.example.net.", st.integers(1, 50)),
            st.integers(0, 9000),
        ),
        min_size=1,
        max_size=3,
    ),
    st.just([]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(NAMES),
    qtype=st.sampled_from(("A", "A", "MX", "AAAA", "ANY")),
    cases=st.tuples(st.integers(0, 2**20), st.integers(0, 2**20)),
    payload=st.sampled_from((None, 1232, 4096)),
    recs=records,
    authority=st.booleans(),
    held=st.sampled_from((0, 0, 1, 7, 59, 299, 301, 5000)),
)
def test_a_cached_answer_is_the_slow_paths_answer_aged(
    name: str,
    qtype: str,
    cases: tuple[int, int],
    payload: int | None,
    recs: list[tuple[str, str, int]],
    authority: bool,
    held: int,
) -> None:
    clock = [1000.0]
    up = FakeUpstream(tuple(recs), authority=authority)
    r, guest, events = resolver(up, clock)
    first = query(name, qtype, cases[0], 1, payload)
    second = query(name, qtype, cases[1], 2, payload)
    ask(r, guest, first)
    clock[0] += held
    got = ask(r, guest, second)
    from_cache = up.asked <= 1
    # The slow path for the same question, on a fresh resolver, the upstream's TTLs lowered by
    # what the cache held them (or not at all where the entry had expired and it asked again).
    ref_up = FakeUpstream(tuple(recs), minus=held if from_cache else 0, authority=authority)
    ref_r, ref_guest, _ = resolver(ref_up, [clock[0]])
    want = ask(ref_r, ref_guest, second)
    assert got is not None and want is not None
    assert (len(got), canonical(got)) == (len(want), canonical(want))
    assert got[:2] == second[:2]
    end = dnslogic.qname_end(second)
    assert got[12:end] == second[12:end]  # the asker's spelling, 0x20 bits and all
    if payload is None:  # RFC 6891 7: no OPT record in the answer to a query without one
        assert dns.message.from_wire(got).edns == -1
    assert len(events) == 2 and events[1].details.get("cached", False) is from_cache


def test_ttls_count_down_and_the_entry_expires_with_the_smallest() -> None:
    clock = [50.0]
    up = FakeUpstream((("A", "203.0.113.5", 30), ("A", "203.0.113.6", 30)), authority=True)
    r, guest, _ = resolver(up, clock)
    ttls = []
    for qid, step in enumerate((0, 10, 10, 9.5)):
        clock[0] += step
        wire = ask(r, guest, query("example.com", "A", qid, qid, 1232))
        assert wire is not None
        msg = dns.message.from_wire(wire)
        ttls.append((msg.answer[0].ttl, msg.authority[0].ttl))
    assert ttls == [(30, 3600), (20, 3590), (10, 3580), (1, 3571)] and up.asked == 1
    clock[0] += 1  # 30.5 s: past the smallest TTL, so the upstream is asked again
    ask(r, guest, query("example.com", "A", 0, 9, 1232))
    assert up.asked == 2


def test_the_cache_key_tells_apart_what_is_not_case() -> None:
    """Only the letters of the name fold: the type, class, flags and EDNS stay apart."""
    base = query("example.com", "A", 0, 1, None)
    assert dnslogic.cache_key(base) == dnslogic.cache_key(query("EXAMPLE.com", "A", 0, 7, None))
    others = [
        query("example.com", "TXT", 0, 1, None),
        query("example.com", "A", 0, 1, 1232),
        query("example.co", "A", 0, 1, None),
        base[:2] + bytes([base[2] ^ 0x01]) + base[3:],  # RD
        base[:-4] + b"\x00\x41\x00\x01",  # type 65 (HTTPS; "A" in ASCII) ...
        base[:-4] + b"\x00\x61\x00\x01",  # ... is not type 97 ("a")
        base[:-2] + b"\x00\x03",  # class CH
    ]
    keys = {dnslogic.cache_key(w) for w in others}
    assert dnslogic.cache_key(base) not in keys and len(keys) == len(others)
    assert dnslogic.cache_key(b"\x00\x01" + b"\xff" * 12) is None


def test_every_cached_answer_is_counted_in_the_store(tmp_path: Path) -> None:
    """A name asked over and over is one stored event per flow and window with ``count``, and
    the counts add up to the questions asked, whether the window ends at the sink's tick or
    at the guest's leaving (the attributor asks the resolver first)."""
    store = Store(tmp_path / "events.db")
    sink = EventSink(store, lambda guest: "s", lambda guest: False, lambda k, u, t: None)
    r = Resolver([], sink.flow, lambda *a: 300)
    r.upstream = FakeUpstream((("A", "203.0.113.5", 300),))  # type: ignore[assignment]
    sink.attributor.before.append(r.flush_log)
    guest = GuestDNS(LINK, "s", PROFILE, "p")
    asked = 0
    for port, times in ((40000, 250), (40001, 3), (40002, 4)):
        sink.attributor.sender((guest.ifname, "udp", port, guest.address, 53), 1000, 0.0)
        for i in range(times):
            wire = query("example.com", "A", i, i, 1232)
            r.resolve(guest, wire, (CLIENT[0], port), "udp", lambda answer: None)
            asked += 1
        if port == 40000:
            sink.attributor.tick(0.1)  # a window ends
    sink.attributor.flush(guest.ifname, 0.2)  # the guest leaves
    sink.flush()
    events = store.events(session="s", kinds=[Kind.DNS])
    assert sum(e.count for e in events) == asked == r.questions
    assert len(events) < 10  # folded: 257 answers, a handful of rows
    assert {e.uid for e in events} == {1000}  # attributed as any other event
    store.close()


ALLOWLIST = parse_policy(
    b'[profiles.p]\ninternet = "allowlist"\nallow = [{ domain = "*.example.com" }]\n', "t.toml"
).profile("p", public_override=(IPv4Network("203.0.113.0/24"),), gateway_address=LINK.gateway)


class NumberedUpstream(FakeUpstream):
    """n{i}.example.com is 203.0.113.{i}, TTL 60."""

    def send(
        self, query: bytes, done: Callable[[bytes | None, BaseException | None], None]
    ) -> None:
        label = dns.message.from_wire(query).question[0].name.labels[0].decode()
        self.records = (("A", f"203.0.113.{int(label[1:])}", 60),)
        super().send(query, done)


def _burst(fail: bool) -> tuple[list[tuple[Any, ...]], list[bytes | None]]:
    pins: list[tuple[Any, ...]] = []
    replies: list[bytes | None] = []

    def pin(guest: GuestDNS, addresses: tuple[str, ...], ttl: int, tags: Any, insp: bool) -> int:
        pins.append((addresses, ttl, tags, len(replies)))
        if fail:
            raise OSError("the kernel said no")
        return 300

    async def main() -> None:
        r = Resolver([], lambda key, event: None, pin)
        r.upstream = NumberedUpstream(())  # type: ignore[assignment]
        guest = GuestDNS(LINK, "s", ALLOWLIST, "p")
        for i in range(1, 21):
            wire = query(f"n{i}.example.com", "A", 0, i, None)
            r.resolve(guest, wire, CLIENT, "udp", replies.append)
        # answered, none sent: they wait for the pass's one pin write
        assert (pins, replies) == ([], [])
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        # an answer whose addresses the kernel holds is not held again
        r.resolve(guest, query("n1.example.com", "A", 1, 99, None), CLIENT, "udp", replies.append)

    asyncio.run(main())
    return pins, replies


def test_a_burst_of_answers_waits_for_one_pin_write() -> None:
    pins, replies = _burst(fail=False)
    assert len(pins) == 1  # one write for the burst: one guest, one rule, one TTL
    addresses, ttl, tags, sent_before = pins[0]
    assert sorted(addresses) == sorted(f"203.0.113.{i}" for i in range(1, 21))
    # pinned (allow[0], in pin set a0: its tag a0.0) before any answer was sent
    assert (ttl, tags, sent_before) == (60, ("a0.0",), 0)
    assert len(replies) == 21 and all(r is not None for r in replies)


def test_a_failed_pin_write_sends_none_of_its_answers() -> None:
    pins, replies = _burst(fail=True)
    assert len(pins) == 2  # the burst's write, then the re-asked name's own (nothing held)
    assert replies == [None] * 21


def test_the_ticks_flush_stores_off_the_loop_in_order(tmp_path: Path) -> None:
    """The ticker's flush hands batches to the store's writer thread and returns; a waiting
    flush (a guest's leaving, the control socket's) returns once all of them are stored, in
    the order handed, the hash chain intact."""
    store = Store(tmp_path / "events.db")
    sink = EventSink(store, lambda guest: "s", lambda guest: False, lambda k, u, t: None)
    for batch in range(20):
        for i in range(50):
            sink.emit(Event(kind=Kind.DNS, session="s", name=f"n{batch * 50 + i}"))
        sink.flush(wait=False)
    sink.flush()
    names = [e.name for e in store.events(session="s")]
    assert names == [f"n{i}" for i in range(1000)]
    assert store.verify().ok
    store.close()


def test_an_opt_record_before_other_records_is_dropped_without_moving_pointers() -> None:
    """The answer to a query without EDNS loses the upstream's OPT record; where names after
    it point at each other, the answer is written anew rather than cut (pointers would move)."""
    query_ = query("example.com", "A", 0, 7, None)
    q = dnslogic.parse_question(query_)
    rr = struct.Struct("!HHIH")
    upstream = (
        struct.pack("!HHHHHH", 7, 0x8180, 1, 1, 0, 3)
        + query_[12:]  # the question
        + b"\xc0\x0c" + rr.pack(1, 1, 60, 4) + bytes((203, 0, 113, 9))
        + b"\x00" + rr.pack(41, 1232, 0, 0)  # OPT, not last
        + b"\x02ns\x07example\x03net\x00" + rr.pack(1, 1, 60, 4) + bytes((203, 0, 113, 10))
        + b"\x03ns2\xc0" + bytes((len(query_) + 16 + 11 + 3,)) + rr.pack(1, 1, 60, 4)
        + bytes((203, 0, 113, 11))
    )  # fmt: skip
    assert dnslogic._fast_answer(upstream) is not None  # the shape the fast reader takes
    got = dns.message.from_wire(dnslogic.judge_answer(q, upstream, lambda a: None).wire)
    assert got.edns == -1
    assert [(r.name.to_text(), r[0].address) for r in got.additional] == [
        ("ns.example.net.", "203.0.113.10"),
        ("ns2.example.net.", "203.0.113.11"),
    ]


def test_cached_answers_are_left_out_of_the_collectors_passes() -> None:
    """Every answer the cache holds, as made, cut at its first hit and aged, is untracked by
    the collector's young passes (a tuple is, once its items are: a gen-0 pass and the gen-1
    pass after it at most), so it never reaches the old generation and no full pass walks it
    (one over ~48,000 dataclass entries and their Decisions took 56-79 ms, 2026-12-02).
    Refusals and rebinding answers too."""
    clock = [1000.0]
    up = FakeUpstream((("A", "203.0.113.5", 300), ("A", "10.0.0.9", 300)))
    r, guest, events = resolver(up, clock)
    for i, name in enumerate(("example.com", "gist.example.com", "localhost", "rebind.example")):
        for qtype in ("A", "AAAA", "MX", "ANY"):
            ask(r, guest, query(name, qtype, i, i, 1232))
    up.records = (("A", "203.0.113.5", 300),)
    ask(r, guest, query("other.example.org", "A", 0, 1, None))
    gc.collect(0)
    gc.collect(1)
    assert len(r._cache) > 10
    assert [v for v in r._cache.values() if gc.is_tracked(v)] == []
    clock[0] += 7  # hits cut and age the answers they give, which the cache keeps
    for i, name in enumerate(("example.com", "gist.example.com", "other.example.org")):
        ask(r, guest, query(name, "A", i + 1, 9, 1232 if i < 2 else None))
    gc.collect(0)
    gc.collect(1)
    assert [v for v in r._cache.values() if gc.is_tracked(v)] == []
    assert sum(1 for e in events if e.details.get("cached")) == 3


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(NAMES), qtype=st.sampled_from(("A", "MX", "AAAA", "ANY")))
def test_an_answer_from_the_cache_is_the_same_event_as_the_first(name: str, qtype: str) -> None:
    """The cache keeps one Decision per (verdict, reason, rule) for its answers' events: a
    hit's event says what the first answer's event said (but ``cached``), field by field."""
    up = FakeUpstream((("A", "203.0.113.5", 60), ("A", "10.1.2.3", 60)))
    r, guest, events = resolver(up, [5.0])
    ask(r, guest, query(name, qtype, 0, 1, None))
    ask(r, guest, query(name, qtype, 3, 2, None))
    first, hit = (e.as_json() for e in events)
    hit["details"] = dict(hit["details"])
    assert hit["details"].pop("cached") is True
    for event in (first, hit):
        del event["ts"]
    assert hit == first


def test_events_read_of_a_decision_only_what_the_cache_keeps() -> None:
    """What the cache's Verdicts rests on: Event.attempt reads a decision's verdict, reason
    key and rule, so two decisions alike in those make the same event whatever their detail
    or the address they classified."""
    rebinding = [
        decide_answer(PROFILE, "example.com", ip_address(a)) for a in ("10.0.0.1", "10.9.9.9")
    ]
    assert rebinding[0].detail != rebinding[1].detail and rebinding[0].classification
    pairs = [
        (judge_question(PROFILE, "a.example.com", 1), judge_question(PROFILE, "b.example.org", 1)),
        tuple(rebinding),
    ]
    verdicts = cache.Verdicts()
    for one, other in pairs:
        assert one != other and verdicts.number(one) == verdicts.number(other)
        made = [
            Event.attempt(Kind.DNS, d, ts=1.0, protocol="udp", port=53, name="n").as_json()
            for d in (one, other)
        ]
        assert made[0] == made[1]
    assert verdicts.number(judge_question(PROFILE, "gist.example.com", 1)) == 2
