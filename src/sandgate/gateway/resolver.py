"""The gateway's resolver: one UDP and one TCP listener on each guest's gateway address.

Every question is logged with its guest and session. What is answered is decided by
``decide_name()`` and, for upstream answers, by ``decide()`` on each address (dnslogic.py).
Nothing leaves for a name the policy refuses. In allowlist mode, the addresses an allowed name
resolves to are pinned into the guest's nftables sets (with their TTL) *before* the answer is
sent, so the guest can never race its own DNS answer to the firewall.

Fast path: answers are cached by (profile, query bytes without the id); a hit costs one dict
lookup and one send, which keeps the resolver from being the bottleneck.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from typing import Any

from sandgate.events.schema import Category, Event, Kind
from sandgate.gateway import dnslogic
from sandgate.gateway.attribution import FlowKey
from sandgate.net.compile import PINNED_MAX_PORTS, GuestLink
from sandgate.policy.decide import Attempt, Decision, Reason, decide, decide_name
from sandgate.policy.model import Mode, Protocol
from sandgate.policy.profile import Profile

CACHE_MAX = 50_000
TTL_CAP = 300
UPSTREAM_TIMEOUT = 2.0
TCP_IDLE = 10.0

PinPorts = tuple[tuple[Protocol, int], ...] | None  # None: every port


@dataclass
class GuestDNS:
    """What the resolver knows of one guest."""

    link: GuestLink
    session: str | None
    profile: Profile
    profile_key: str
    pinned: dict[tuple[str, PinPorts], float] = field(default_factory=dict)
    udp: Any = None
    tcp: Any = None


@dataclass(frozen=True)
class _Entry:
    wire: bytes
    expires: float
    name: str
    qtype: str
    verdict: str
    reason: str
    rule: str | None
    rcode: int
    addresses: tuple[str, ...] = ()
    ttl: int = 0
    pin: PinPorts = None
    pins: bool = False  # allowlist: these addresses must be pinned for the asking guest


Emit = Callable[[FlowKey, Event], None]
Pin = Callable[[GuestDNS, tuple[str, ...], int, PinPorts], None]


class Resolver:
    def __init__(self, upstreams: list[str], emit: Emit, pin: Pin) -> None:
        self.upstream = Upstream(upstreams)
        self._emit = emit
        self._pin = pin
        self._cache: dict[tuple[str, bytes], _Entry] = {}
        self.questions = 0

    async def start_guest(self, guest: GuestDNS) -> None:
        loop = asyncio.get_running_loop()
        addr = str(guest.link.gateway)
        guest.udp, _ = await loop.create_datagram_endpoint(
            lambda: _UdpServer(self, guest), local_addr=(addr, 53), reuse_port=False
        )
        guest.tcp = await asyncio.start_server(
            lambda r, w: self._tcp_client(guest, r, w), host=addr, port=53, reuse_address=True
        )

    async def stop_guest(self, guest: GuestDNS) -> None:
        if guest.udp is not None:
            guest.udp.close()
        if guest.tcp is not None:
            guest.tcp.close()
            await guest.tcp.wait_closed()

    def forget(self, profile_key: str) -> None:
        for key in [k for k in self._cache if k[0] == profile_key]:
            del self._cache[key]

    # -- answering -----------------------------------------------------------------------------

    def cached(
        self, guest: GuestDNS, wire: bytes, client: tuple[str, int], proto: str
    ) -> bytes | None:
        """The fast path: an answer from the cache, logged, or None."""
        entry = self._cache.get((guest.profile_key, wire[2:]))
        if entry is None or entry.expires < time.monotonic():
            return None
        if entry.pins:
            self._ensure_pinned(guest, entry)
        self._log(guest, client, proto, entry, cached=True)
        return wire[:2] + entry.wire[2:]

    async def answer(
        self, guest: GuestDNS, wire: bytes, client: tuple[str, int], proto: str
    ) -> bytes | None:
        hit = self.cached(guest, wire, client, proto)
        if hit is not None:
            return hit
        try:
            q = dnslogic.parse_question(wire)
        except dnslogic.Malformed as exc:
            self._emit(
                _key(guest, client, proto),
                _event(
                    guest,
                    client,
                    proto,
                    name=None,
                    verdict="deny",
                    reason=Reason.PROTOCOL.key,
                    rule=None,
                    details={"error": str(exc)},
                ),
            )
            return exc.reply
        entry = await self._resolve(guest, q)
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[(guest.profile_key, wire[2:])] = entry
        if entry.pins:
            self._ensure_pinned(guest, entry)
        self._log(guest, client, proto, entry, cached=False)
        return wire[:2] + entry.wire[2:]

    async def _resolve(self, guest: GuestDNS, q: dnslogic.Question) -> _Entry:
        profile = guest.profile
        decision = decide_name(profile, q.name)
        forever = float("inf")
        if not decision.allowed:
            return _entry(dnslogic.blocked(q, decision.key), forever, q, decision, rcode=3)
        if q.qtype == dnslogic.AAAA:
            return _entry(dnslogic.empty(q), forever, q, decision, rcode=0)
        if q.qtype == dnslogic.PTR and dnslogic.private_reverse(q.name):
            wire = dnslogic.blocked(q, "deny.special")
            return _entry(
                wire, forever, q, decision, rcode=3, verdict="deny", reason="deny.special"
            )
        try:
            upstream = await self.upstream.ask(
                dnslogic.query_for_upstream(q, self.upstream.new_id())
            )
        except (TimeoutError, OSError) as exc:
            wire = dnslogic.servfail(q, f"upstream: {exc or 'timeout'}")
            return _entry(wire, time.monotonic() + 2, q, decision, rcode=2)

        def check(address: IPv4Address) -> str | None:
            d = decide(profile, Attempt(Protocol.TCP, address, None, q.name))
            if d.reason in (Reason.REBINDING, Reason.SPECIAL, Reason.LATERAL, Reason.RULE_DENY):
                return Reason.REBINDING.key if d.reason is not Reason.RULE_DENY else d.key
            return None

        ans = dnslogic.judge_answer(q, upstream, check)
        if ans.refused is not None:
            return _entry(
                ans.wire,
                time.monotonic() + 60,
                q,
                decision,
                rcode=ans.rcode,
                verdict="deny",
                reason=ans.refused,
                addresses=(ans.refused_address or "",),
            )
        ttl = max(0, min(ans.ttl, TTL_CAP))
        pins = profile.mode is Mode.ALLOWLIST and decision.reason is Reason.RULE_ALLOW
        return _entry(
            ans.wire,
            time.monotonic() + ttl,
            q,
            decision,
            rcode=ans.rcode,
            addresses=ans.addresses,
            ttl=ans.ttl,
            pins=pins and bool(ans.addresses),
            pin=_pin_ports(profile, q.name) if pins else None,
        )

    def _ensure_pinned(self, guest: GuestDNS, entry: _Entry) -> None:
        now = time.monotonic()
        todo = tuple(a for a in entry.addresses if guest.pinned.get((a, entry.pin), 0) < now + 5)
        if todo:
            self._pin(guest, todo, entry.ttl, entry.pin)
            for a in todo:
                guest.pinned[(a, entry.pin)] = now + max(entry.ttl, 60)

    def _log(
        self, guest: GuestDNS, client: tuple[str, int], proto: str, entry: _Entry, *, cached: bool
    ) -> None:
        self.questions += 1
        details: dict[str, Any] = {"qtype": entry.qtype, "rcode": entry.rcode}
        if entry.addresses:
            details["answers"] = list(entry.addresses)
        if cached:
            details["cached"] = True
        self._emit(
            _key(guest, client, proto),
            _event(
                guest, client, proto, entry.name, entry.verdict, entry.reason, entry.rule, details
            ),
        )

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
        self._tasks: set[asyncio.Future[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        hit = self.resolver.cached(self.guest, data, addr, "udp")
        if hit is not None:
            self.transport.sendto(hit, addr)
            return
        task = asyncio.ensure_future(self._slow(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _slow(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = await self.resolver.answer(self.guest, data, addr, "udp")
        if reply is not None and self.transport is not None:
            if len(reply) > 512 and not _has_edns(data):
                reply = _truncate(reply)
            self.transport.sendto(reply, addr)


class Upstream:
    """Asks upstream servers over UDP (TCP when the answer is truncated)."""

    def __init__(self, servers: list[str]) -> None:
        self.servers = servers
        self._transport: asyncio.DatagramTransport | None = None
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count(random.randrange(1 << 16))

    def new_id(self) -> int:
        for _ in range(1 << 16):
            qid = next(self._ids) & 0xFFFF
            if qid not in self._waiting:
                return qid
        raise OSError("too many upstream questions in flight")

    async def _socket(self) -> asyncio.DatagramTransport:
        if self._transport is None:
            loop = asyncio.get_running_loop()
            self._transport, _ = await loop.create_datagram_endpoint(
                lambda: _UpstreamProtocol(self._waiting), local_addr=("0.0.0.0", 0)
            )
        return self._transport

    async def ask(self, query: bytes) -> bytes:
        if not self.servers:
            raise OSError("no upstream resolver configured")
        qid = int.from_bytes(query[:2], "big")
        transport = await self._socket()
        for server in self.servers:
            fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self._waiting[qid] = fut
            try:
                transport.sendto(query, (server, 53))
                reply = await asyncio.wait_for(fut, UPSTREAM_TIMEOUT)
            except TimeoutError:
                continue
            finally:
                self._waiting.pop(qid, None)
            if len(reply) > 2 and reply[2] & 0x02:  # TC: ask again over TCP
                return await self._tcp(server, query)
            return reply
        raise TimeoutError("no upstream resolver answered")

    async def _tcp(self, server: str, query: bytes) -> bytes:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(server, 53), UPSTREAM_TIMEOUT
        )
        try:
            writer.write(struct.pack("!H", len(query)) + query)
            await writer.drain()
            (size,) = struct.unpack(
                "!H", await asyncio.wait_for(reader.readexactly(2), UPSTREAM_TIMEOUT)
            )
            return await asyncio.wait_for(reader.readexactly(size), UPSTREAM_TIMEOUT)
        finally:
            writer.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _UpstreamProtocol(asyncio.DatagramProtocol):
    def __init__(self, waiting: dict[int, asyncio.Future[bytes]]) -> None:
        self.waiting = waiting

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) < 2:
            return
        fut = self.waiting.get(int.from_bytes(data[:2], "big"))
        if fut is not None and not fut.done():
            fut.set_result(data)


def _pin_ports(profile: Profile, name: str) -> PinPorts:
    """Which ports the allow rules open for ``name`` (None: every port)."""
    ports: set[tuple[Protocol, int]] = set()
    for rule in profile.allow:
        if rule.spec.pattern is None or not rule.spec.pattern.matches(name):
            continue
        if not rule.spec.ports:
            return None
        for proto in rule.spec.protocols & {Protocol.TCP, Protocol.UDP}:
            for low, high in rule.spec.ports:
                ports.update((proto, p) for p in range(low, high + 1))
                if len(ports) > PINNED_MAX_PORTS:
                    return None
    return tuple(sorted(ports)) if ports else None


def _entry(
    wire: bytes,
    expires: float,
    q: dnslogic.Question,
    decision: Decision,
    *,
    rcode: int,
    verdict: str | None = None,
    reason: str | None = None,
    **kw: Any,
) -> _Entry:
    return _Entry(
        wire=wire,
        expires=expires,
        name=q.name,
        qtype=q.type_text,
        verdict=verdict or decision.verdict.value,
        reason=reason or decision.key,
        rule=decision.rule_ref,
        rcode=rcode,
        **kw,
    )


def _key(guest: GuestDNS, client: tuple[str, int], proto: str) -> FlowKey:
    return (guest.link.ifname, proto, client[1], str(guest.link.gateway), 53)


def _event(
    guest: GuestDNS,
    client: tuple[str, int],
    proto: str,
    name: str | None,
    verdict: str | None,
    reason: str | None,
    rule: str | None,
    details: dict[str, Any],
) -> Event:
    return Event(
        kind=Kind.DNS,
        session=guest.session,
        guest=guest.link.ifname,
        verdict=verdict,
        rule=rule,
        reason=reason,
        category=Category.DNS.value,
        src=client[0],
        dst=str(guest.link.gateway),
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
