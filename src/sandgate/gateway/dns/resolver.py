"""The gateway's resolver: one UDP and one TCP listener on each guest's gateway address.

Every question is logged with its guest and session. What is answered is decided by
``policy.dnsnames.judge_question()`` (the name by ``decide_name()``, then special-use names,
reverse names and question types) and, for upstream answers, by ``decide()`` on each address and
``judge_aliases()`` on the CNAME records; dnslogic.py writes the answer each verdict calls for.
Nothing leaves for a name the policy refuses. In allowlist mode, the addresses an allowed name
resolves to are pinned into the guest's nftables sets (with their TTL) *before* the answer is
sent, so the guest can never race its own DNS answer to the firewall.

Fast path: answers are cached by (profile, query bytes without the id, the name's letters
folded); a hit costs one dict lookup, a copy of the cached bytes with the asker's id and
spelling and TTLs aged, and one send, which keeps the resolver from being the bottleneck. Its
event is shared: the first hit of an entry to a flow is logged at once, its repeats are counted
into one event with ``count`` (``flush_log``, which the attributor calls before each of its
rounds). Questions that miss the cache are read and answered by dnslogic's fast readers when
they have the common shape (dnspython otherwise). Answers that need pins wait for the end of
the loop's pass, when one write per guest, TTL and pin sets pins the whole burst.
Measured 2026-12-01 (bench/run foundation --only dns): a cached answer 12-14 µs CPU all told,
of which ~7 in the kernel (52 µs before); an uncached one ~150 µs (was ~170), of which
~65 in Python (~45 the question, its verdicts and its event, ~20 the store's row: see
bench/resolverloop.py) and the rest the kernel's sends and the loop. The tail under load is the
machine's: the loop's worst stalls hold under ~1.3 ms of its own CPU, and the bench's
``resolver_wait_cores`` shows it waiting 0.3-0.6 s a second for a core on this 2-core host.
Where an uncached question goes (2026-12-01, ``python -m bench.resolverloop``, loopback, load
3-5): the loop thread ~100 µs, the question ~28 of it (its upstream send ~8), the answer ~60
(its send to the guest ~10), the rest of the loop ~12; the store's writer thread 15-30 more.
Of the Python, policy's verdicts (judge_question, decide_answer, pin_rules, proxied) are about
a third; the collector ~6 µs (its passes walked every cached answer and its Decision until
2026-12-02: the cache now holds atoms only, which no pass walks, cache.py). The I/O alone, a
forwarder swapping ids on the same loop, costs 13-16 µs a question and answers 19-34k a
second: uvloop and the sockets are not the ceiling. Since 2026-12-07 the store's rows are
written by a process of its own (events/writer.py): on a thread they cost the loop the GIL at
every wake, ~35 µs a question more than the rows themselves. Since 2026-12-07 too, an answer's
addresses are judged once per profile and address (policy ``answer_refusal``: ~9 → ~1 µs), the
question's event is made without ``__init__`` and the rule index skips what a list lacks: ~20%
less CPU an uncached question in ``bench.resolverloop`` (docs/NOTES.md).
"""

from __future__ import annotations

import asyncio
import functools
import math
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import Any

from sandgate.events.schema import Category, Event, FlowKey, Kind
from sandgate.gateway.dns import cache, dnslogic
from sandgate.gateway.dns.cache import (
    ADDRESSES,
    EXPIRES,
    INSPECT,
    NAME,
    PIN,
    PINS,
    SERIAL,
    TTL,
    VERDICT,
    Answer,
    Packed,
)
from sandgate.gateway.dns.upstream import Upstream, grow_rcvbuf
from sandgate.net.compile import GuestLink
from sandgate.policy import dnsnames
from sandgate.policy.decide import Decision, Reason, allow, answer_refusal, deny
from sandgate.policy.pins import pin_rules, set_of
from sandgate.policy.profile import Profile

CACHE_MAX = 50_000
TTL_CAP = 300
TCP_IDLE = 10.0
PROXY_LOOKUP_TIMEOUT = 6.0
OWN = "\0own "  # a profile key + this + a guest's address: the cache scope of its own answers
DNS_CATEGORY = Category.DNS.value

PinTags = cache.PinTags


@dataclass
class GuestDNS:
    """What the resolver knows of one guest."""

    link: GuestLink
    session: str | None
    profile: Profile
    profile_key: str
    pinned: dict[tuple[str, PinTags], float] = field(default_factory=dict)
    # Addresses in the guest's inspect set, apart: two names at one address with the same pin
    # sets, one inspected and one not, need the inspect element whichever was answered first.
    inspected: dict[str, float] = field(default_factory=dict)
    udp: Any = None
    tcp: Any = None
    address: str = field(init=False)  # the gateway's address on this guest's link
    ifname: str = field(init=False)

    def __post_init__(self) -> None:
        self.address = str(self.link.gateway)
        self.ifname = self.link.ifname


Emit = Callable[[FlowKey, Event], None]
# (guest, addresses, ttl, pin sets, inspect?) -> the seconds the kernel keeps them
Pin = Callable[[GuestDNS, tuple[str, ...], int, PinTags, bool], int]


@dataclass(slots=True)
class _Repeat:
    """Cached answers of one entry to one flow since the last ``flush_log``, but the first."""

    guest: GuestDNS
    client: tuple[str, int]
    proto: str
    answer: Packed
    decision: Decision
    count: int = 0
    ts: float = field(default_factory=time.time)  # when the window's first answer was given


class _Reloaded(Exception):
    """The guest's policy changed while its question was with the upstream."""


Reply = Callable[[bytes | None], None]  # the answer for the guest; None: no answer at all


class Resolver:
    # internet = "ask" (gateway/approvals.py): (guest, name, judge again) -> True if it waits
    asks: Callable[[GuestDNS, str, Callable[[], None]], bool] | None = None

    def __init__(self, upstreams: list[str], emit: Emit, pin: Pin) -> None:
        self.upstream = Upstream(upstreams)
        self._emit = emit
        self._pin = pin
        # (scope, cache key) -> the answer, as atoms only: no collector's pass walks them (cache.py)
        self._cache: dict[tuple[str, bytes], Packed] = {}
        self._verdicts = cache.Verdicts()
        self.questions = 0
        self.cut = False  # the watchdog cut the gateway off: refuse every question
        self.forward_everything = False  # fault injection (tests of `prove` only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.clock: Callable[[], float] = time.monotonic  # tests age the cache with their own
        self._repeats: dict[tuple[FlowKey, int], _Repeat] = {}  # by flow and answer: see _log_hit
        # Pin writes due in this pass of the loop, by (guest, TTL, pin sets, inspect), and the
        # answers waiting for them (_deliver).
        self._pins_due: dict[tuple[int, int, PinTags, bool], tuple[GuestDNS, dict[str, None]]] = {}
        self._held: list[tuple[Reply, bytes | None]] = []
        self._write_due = False

    async def start_guest(self, guest: GuestDNS) -> None:
        loop = asyncio.get_running_loop()
        await self.upstream.open()
        addr = guest.address
        guest.udp, _ = await loop.create_datagram_endpoint(
            lambda: _UdpServer(self, guest), local_addr=(addr, 53), reuse_port=False
        )
        grow_rcvbuf(guest.udp.get_extra_info("socket"))
        guest.tcp = await asyncio.start_server(
            lambda r, w: self._tcp_client(guest, r, w), host=addr, port=53, reuse_address=True
        )

    @staticmethod
    def close_listeners(guest: GuestDNS) -> None:
        """Stop answering this guest at once (a guest that failed to join; a test's fault)."""
        if guest.udp is not None:
            guest.udp.close()
        if guest.tcp is not None:
            guest.tcp.close()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the proxy's lookups (from its threads) are handed to."""
        self._loop = loop

    def answer_blocking(self, name: str) -> dnslogic.Addresses | None:
        """The upstream's addresses for ``name``, from a proxy thread (the proxy keeps them for
        the answer's TTL: gateway/proxy/lookup.py); None: no readable reply. Those of an A
        question, or for a name that has no A record (but exists) of an AAAA one, which the
        proxy's decide() allows only where the uplink has IPv6 (deny.ipv6 says so elsewhere).
        The reply is read once, here (dnslogic.read_addresses), for both sides."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._answer(name), self._loop)
        try:
            return future.result(PROXY_LOOKUP_TIMEOUT)
        except (TimeoutError, OSError):
            return None

    async def _answer(self, name: str) -> dnslogic.Addresses | None:
        try:
            reply = await self.upstream.ask(dnslogic.address_query(name, self.upstream.new_id()))
            found = dnslogic.read_addresses(reply)
            if found is not None and found.nodata:
                query = dnslogic.address_query(name, self.upstream.new_id(), dnslogic.AAAA)
                return dnslogic.read_addresses(await self.upstream.ask(query))
            return found
        except (TimeoutError, OSError):
            return None

    async def stop_guest(self, guest: GuestDNS) -> None:
        if guest.udp is not None:
            guest.udp.close()
        if guest.tcp is not None:
            guest.tcp.close()
            await guest.tcp.wait_closed()

    def names(self, guest: GuestDNS) -> dict[str, set[str]]:
        """Address -> the names answers under this guest's profile gave it (expired answers
        too: a connection outlives its answer's TTL), its own fronted ones included. A reload
        judges open flows by them."""
        out: dict[str, set[str]] = {}
        scopes = (guest.profile_key, _own_scope(guest))
        for (key, _), answer in self._cache.items():
            if key in scopes:
                for address in answer[ADDRESSES]:
                    out.setdefault(address, set()).add(answer[NAME])
        return out

    def forget(self, profile_key: str) -> None:
        """Every answer under ``profile_key``, every guest's own (fronted names) too."""
        own = profile_key + OWN
        for key in [k for k in self._cache if k[0] == profile_key or k[0].startswith(own)]:
            del self._cache[key]

    # -- answering -----------------------------------------------------------------------------

    def cached(
        self, guest: GuestDNS, wire: bytes, client: tuple[str, int], proto: str
    ) -> bytes | None:
        """The fast path: an answer from the cache, logged, or None. No parse: the cached
        bytes get the query's id and spelling of the name and their TTLs aged (cache.reply);
        tests/unit/test_dns_cache.py checks them against the slow path's answer."""
        key = dnslogic.cache_key(wire)
        if key is None:
            return None
        at = (guest.profile_key, key)
        found = self._cache.get(at)
        if found is None:  # a fronted name: this guest's own answer (_answered)
            at = (_own_scope(guest), key)
            found = self._cache.get(at)
            if found is None:
                return None
        now = self.clock()
        if found[EXPIRES] < now:
            return None
        reply, now_ = cache.reply(found, wire, now)
        if now_ is not found:
            self._cache[at] = found = now_
        if reply is None:
            return None
        if found[PINS]:
            self._ensure_pinned(guest, found[ADDRESSES], found[PIN], found[INSPECT], found[TTL])
        self._log_hit(guest, client, proto, found)
        return reply

    def resolve(
        self, guest: GuestDNS, wire: bytes, client: tuple[str, int], proto: str, reply: Reply
    ) -> None:
        """Answer one question: ``reply`` is called once, with the answer (None: say nothing),
        at once or when the upstream has answered. No task per question: a question that must
        go upstream waits as a callback, which is what keeps forwarding fast."""
        if self.cut:
            # The gateway is cut off (gateway/watchdog.py): nothing is answered, each question
            # is still an event, with the name where it can be read.
            try:
                name: str | None = dnslogic.parse_question(wire).name
            except dnslogic.Malformed:
                name = None
            self._emit(
                _key(guest, client, proto),
                _event(guest, client, proto, name, deny(Reason.CUT), {"cut": True}),
            )
            reply(dnslogic.refused_wire(wire))
            return
        hit = None if self.forward_everything else self.cached(guest, wire, client, proto)
        if hit is not None:
            self._deliver(reply, hit)
            return
        try:
            q = dnslogic.parse_question(wire)
        except dnslogic.Malformed as exc:
            self._emit(
                _key(guest, client, proto),
                _event(guest, client, proto, None, deny(Reason.PROTOCOL), {"error": str(exc)}),
            )
            reply(exc.reply)
            return
        decision = dnsnames.judge_question(guest.profile, q.name, q.qtype)
        if (
            decision.reason is Reason.NOT_ALLOWLISTED
            and guest.profile.ask
            and self.asks is not None
            and self.asks(guest, q.name, lambda: self.resolve(guest, wire, client, proto, reply))
        ):
            return  # waits for `sandgate approve`; judged again when answered (issue 14)
        if self.forward_everything:  # a fault injected by a test: the resolver gone rogue
            decision = allow(Reason.OPEN, detail="fault: forwarding everything")
        entry = self._local(guest, q, decision)
        if entry is not None:
            self._deliver(reply, self._answered(guest, wire, client, proto, entry))
            return

        asked_under = guest.profile_key

        def upstream_answered(upstream: bytes | None, error: BaseException | None) -> None:
            try:
                if guest.profile_key != asked_under:
                    # The policy was reloaded while the upstream was asked: this question was
                    # judged (and its pin sets named) under the old one. Fail closed.
                    raise _Reloaded
                entry = self._judged(guest, q, decision, upstream, error)
            except _Reloaded:
                wire_ = dnslogic.servfail(q, "the policy changed; ask again")
                reply(wire[:2] + wire_[2:])
                return
            except Exception as exc:  # a bug must cost one answer, never the resolver
                traceback.print_exc(file=sys.stderr)
                entry = _answer(
                    dnslogic.servfail(q, f"internal error: {exc}"),
                    self.clock() + 2,
                    q,
                    decision,
                    rcode=2,
                )
            self._deliver(reply, self._answered(guest, wire, client, proto, entry))

        self.upstream.send(
            dnslogic.query_for_upstream(q, self.upstream.new_id()), upstream_answered
        )

    async def answer(
        self, guest: GuestDNS, wire: bytes, client: tuple[str, int], proto: str
    ) -> bytes | None:
        fut: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

        def reply(answer: bytes | None) -> None:
            if not fut.done():
                fut.set_result(answer)

        self.resolve(guest, wire, client, proto, reply)
        return await fut

    def _answered(
        self, guest: GuestDNS, wire: bytes, client: tuple[str, int], proto: str, entry: Answer
    ) -> bytes:
        """Cache a new answer, pin what it allows (before it is sent), log it; the reply."""
        self.remember(guest, wire, entry)
        if entry.pins:
            self._ensure_pinned(guest, entry.addresses, entry.pin, entry.inspect, entry.ttl)
        self.questions += 1
        self._emit(
            _key(guest, client, proto),
            _event(guest, client, proto, entry.name, entry.decision, entry.details()),
        )
        return wire[:2] + entry.wire[2:]

    def remember(self, guest: GuestDNS, wire: bytes, answer: Answer) -> None:
        """Cache ``answer`` to the query ``wire`` (unless it has no name to key it by)."""
        key = dnslogic.cache_key(wire)
        if key is None:
            return
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
            self._verdicts = cache.Verdicts()
        # A fronted name's answer is the asking guest's own gateway address: cached for that
        # guest alone (shared, it sent the next guest of the profile to an address not its own,
        # refused as lateral or an outside name). Every other answer is the same for every
        # guest of the profile.
        own = answer.decision.reason is Reason.FRONT and answer.decision.allowed
        packed = cache.pack(answer, wire, self._verdicts.number(answer.decision))
        self._cache[(_own_scope(guest) if own else guest.profile_key, key)] = packed

    def _local(self, guest: GuestDNS, q: dnslogic.Question, decision: Decision) -> Answer | None:
        """The answer when no upstream is needed (or allowed), else None."""
        forever = float("inf")
        if decision.reason is Reason.FRONT and decision.allowed:
            # A service the gateway fronts: the answer is the guest's own gateway address.
            gateway = str(guest.link.gateway)
            wire = dnslogic.local_answer(q, gateway)
            return _answer(wire, forever, q, decision, rcode=0, addresses=(gateway,))
        if decision.allowed:
            return None
        # The verdict is policy's; only the shape of the refusal is chosen here.
        if decision.reason is Reason.IPV6 and q.qtype == dnslogic.AAAA:
            return _answer(dnslogic.empty(q), forever, q, decision, rcode=0)
        if decision.reason is Reason.DNS_ANY:
            return _answer(dnslogic.minimal_any(q, decision.key), forever, q, decision, rcode=0)
        if decision.reason in (Reason.ZONE_TRANSFER, Reason.DNS_META):
            return _answer(dnslogic.refused(q, decision.key), forever, q, decision, rcode=5)
        return _answer(dnslogic.blocked(q, decision.key), forever, q, decision, rcode=3)

    def _judged(
        self,
        guest: GuestDNS,
        q: dnslogic.Question,
        decision: Decision,
        upstream: bytes | None,
        error: BaseException | None,
    ) -> Answer:
        """The entry for an upstream's answer (or for its silence)."""
        if upstream is None:
            wire = dnslogic.servfail(q, f"upstream: {error or 'timeout'}")
            return _answer(wire, self.clock() + 2, q, decision, rcode=2)
        profile = guest.profile

        refusals: list[Decision] = []

        def check(address: IPv4Address | IPv6Address) -> str | None:
            d = answer_refusal(profile, q.name, address)
            if d is None:
                return None
            refusals.append(d)
            return d.key

        # AAAA answers are judged like A where the uplink has IPv6 (issue 14 part 5).
        ans = dnslogic.judge_answer(q, upstream, check, check if profile.uplink_ipv6 else None)
        aliased = dnsnames.judge_aliases(profile, q.name, ans.aliases, decision)
        if not aliased.allowed:
            wire = dnslogic.blocked(q, aliased.key, code=dnslogic.EDE_FILTERED)
            return _answer(wire, self.clock() + 60, q, aliased, rcode=3)
        if ans.refused is not None:
            return _answer(
                ans.wire,
                self.clock() + 60,
                q,
                refusals[-1],
                rcode=ans.rcode,
                addresses=(ans.refused_address or "",),
            )
        ttl = max(0, min(ans.ttl, TTL_CAP))
        pins = pin_rules(profile, q.name)
        inspect = profile.proxied(q.name)  # inspected, or judged by process (issue 14)
        now = self.clock()
        return _answer(
            ans.wire,
            now + ttl,
            q,
            decision,
            rcode=ans.rcode,
            addresses=ans.addresses,
            ttl=ans.ttl,
            pins=(bool(pins) or inspect) and bool(ans.addresses),
            pin=tuple([p.tag for p in pins]) if pins else (),
            inspect=inspect,
            made=now,
        )

    def _ensure_pinned(
        self, guest: GuestDNS, addresses: tuple[str, ...], pin: PinTags, inspect: bool, ttl: int
    ) -> None:
        """Pin an answer's addresses unless the kernel still holds them for a while: what is
        remembered is when the kernel's own element expires (the pin's timeout). The write
        joins the burst's (``_write_pins``), which the answer waits for (``_deliver``)."""
        now = time.monotonic()
        todo = tuple(
            a
            for a in addresses
            if guest.pinned.get((a, pin), 0) < now + 5
            or (inspect and guest.inspected.get(a, 0) < now + 5)
        )
        if todo:
            # A pin group's set holds an address for every rule it was pinned under: adding it
            # again must not shorten what another name's answer keeps (policy/pins.py).
            sets = {set_of(t) for t in pin}
            held = max(
                (
                    until
                    for (a, tags), until in guest.pinned.items()
                    if a in todo and any(set_of(t) in sets for t in tags)
                ),
                default=now,
            )
            if inspect:
                held = max(held, *(guest.inspected.get(a, now) for a in todo))
            ttl = max(ttl, math.ceil(held - now))
            group = (id(guest), ttl, pin, inspect)
            self._pins_due.setdefault(group, (guest, {}))[1].update(dict.fromkeys(todo))
            if not self._write_due:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # called outside a loop (tests): write at once
                    self._write_pins()
                    return
                self._write_due = True
                loop.call_soon(self._write_pins)

    def _deliver(self, reply: Reply, answer: bytes | None) -> None:
        """Send an answer, or hold it while pin writes are due: answers given in one pass of
        the loop (a burst) wait for one pin write per guest, rule set and TTL, made once the
        pass is over, instead of a netlink transaction each (~100-200 µs apiece)."""
        if not self._pins_due:
            reply(answer)
            return
        self._held.append((reply, answer))

    def _write_pins(self) -> None:
        """The burst's pin writes, then its answers. A write that fails (the kernel refused
        it) costs the burst's answers (fail closed: no answer before its pin), not the
        resolver; the guest asks again."""
        due, self._pins_due = self._pins_due, {}
        held, self._held = self._held, []
        self._write_due = False
        ok = True
        # Shortest TTL first: a re-add sets the kernel's timeout anew, so where two answers of a
        # burst put one address into one pin group's set, the longer one is written last.
        for (_, ttl, tags, inspect), (guest, todo) in sorted(due.items(), key=lambda d: d[0][1]):
            now = time.monotonic()
            addresses = tuple(todo)
            try:
                timeout = self._pin(guest, addresses, ttl, tags, inspect)
            except Exception:
                traceback.print_exc(file=sys.stderr)
                ok = False
                continue
            for a in addresses:
                guest.pinned[(a, tags)] = now + timeout
                if inspect:
                    guest.inspected[a] = now + timeout
        for reply, answer in held:
            try:
                reply(answer if ok else None)
            except Exception:  # one guest's failed send must not cost the others' answers
                traceback.print_exc(file=sys.stderr)

    def _log_hit(
        self, guest: GuestDNS, client: tuple[str, int], proto: str, answer: Packed
    ) -> None:
        """An answer from the cache. The first of an answer to a flow since the last flush_log
        is an event at once; its repeats (a client asking one name over and over) are counted
        into one event at the next: one row per name and flow per window, not one per answer
        (the store's row is the dearest part of a cached answer, ~20 µs)."""
        self.questions += 1
        key = (guest.ifname, proto, client[1], guest.address, 53)
        repeat = self._repeats.get((key, answer[SERIAL]))
        if repeat is not None:
            repeat.count += 1
            return
        decision = self._verdicts.decisions[answer[VERDICT]]
        self._repeats[(key, answer[SERIAL])] = _Repeat(guest, client, proto, answer, decision)
        details = cache.hit_details(answer)
        self._emit(key, _event(guest, client, proto, answer[NAME], decision, details))

    def flush_log(self) -> None:
        """Emit the repeats counted since the last call (one event each, with ``count``). The
        event sink calls it before it attributes and stores what it holds, so no answer given
        is missing from what it stores (gateway/logs/attribution.py ``before``)."""
        repeats, self._repeats = self._repeats, {}
        for (key, _), r in repeats.items():
            if r.count:
                details = cache.hit_details(r.answer)
                event = _event(r.guest, r.client, r.proto, r.answer[NAME], r.decision, details)
                self._emit(key, event.but(ts=r.ts, count=r.count))

    async def _tcp_client(
        self, guest: GuestDNS, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = writer.get_extra_info("peername")
        client = (peer[0], peer[1]) if peer else ("?", 0)
        try:
            while True:
                head = await asyncio.wait_for(reader.readexactly(2), TCP_IDLE)
                (size,) = struct.unpack("!H", head)
                wire = await asyncio.wait_for(reader.readexactly(size), TCP_IDLE)
                reply = await self.answer(guest, wire, client, "tcp")
                if reply is None:
                    break
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


class _UdpServer(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver, guest: GuestDNS) -> None:
        self.resolver = resolver
        self.guest = guest
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.resolver.resolve(
            self.guest, data, addr, "udp", functools.partial(self._send, data, addr)
        )

    def _send(self, data: bytes, addr: tuple[str, int], reply: bytes | None) -> None:
        if reply is None or self.transport is None or self.transport.is_closing():
            return  # nothing to say, or the guest has left meanwhile
        if len(reply) > 512 and not _has_edns(data):
            reply = _truncate(reply)
        self.transport.sendto(reply, addr)


# What the upstream said (None when it said nothing: then the error says why).


def _answer(
    wire: bytes,
    expires: float,
    q: dnslogic.Question,
    decision: Decision,
    *,
    rcode: int,
    **kw: Any,
) -> Answer:
    return Answer(
        wire=wire,
        expires=expires,
        name=q.name,
        qtype=q.type_text,
        decision=decision,
        rcode=rcode,
        **kw,
    )


def _own_scope(guest: GuestDNS) -> str:
    """The cache scope of answers that hold for this guest alone (fronted names)."""
    return guest.profile_key + OWN + guest.address


def _key(guest: GuestDNS, client: tuple[str, int], proto: str) -> FlowKey:
    return (guest.ifname, proto, client[1], guest.address, 53)


def _event(
    guest: GuestDNS,
    client: tuple[str, int],
    proto: str,
    name: str | None,
    decision: Decision,
    details: dict[str, Any],
) -> Event:
    return Event.attempt(
        Kind.DNS,
        decision,
        session=guest.session,
        guest=guest.ifname,
        category=DNS_CATEGORY,
        src=client[0],
        dst=guest.address,
        port=53,
        protocol=proto,
        name=name,
        details=details,
    )


def _has_edns(wire: bytes) -> bool:
    return len(wire) >= 12 and wire[10:12] != b"\x00\x00"


def _truncate(reply: bytes) -> bytes:
    """Header and question only, with TC set: the client retries over TCP."""
    import dns.message

    msg = dns.message.from_wire(reply)
    msg.answer, msg.authority, msg.additional = [], [], []
    wire = bytearray(msg.to_wire())
    wire[2] |= 0x02
    return bytes(wire)
