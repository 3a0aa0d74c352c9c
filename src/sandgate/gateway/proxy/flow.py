"""What the proxy knows about one guest and one connection, and how it judges a target.

Resolve once, check every address, dial the address that was checked (smokescreen): a name
whose answers include any address the policy refuses is refused as a whole (rebinding), and the
connection goes to an address that passed, never to one looked up again later.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sandgate.events.schema import Category, Event, FlowKey, Kind
from sandgate.gateway.proxy.credentials import Secret
from sandgate.net.compile import GuestLink
from sandgate.policy.decide import Attempt, Decision, Reason, decide, deny
from sandgate.policy.model import IPAddress, Protocol
from sandgate.policy.profile import Profile
from sandgate.policy.requests import judge_answers

Resolve = Callable[[str], list[IPAddress]]  # A records; AAAA where a name has no A
Emit = Callable[[FlowKey | None, Event], None]


@dataclass
class ProxyGuest:
    link: GuestLink
    session: str | None
    profile: Profile
    secrets: tuple[Secret, ...] = ()
    # The executable behind a flow and its parents, as the guest's process hold found them.
    identify: Callable[[FlowKey], tuple[str | None, tuple[str, ...]]] | None = None
    # internet = "ask": wait (blocking, bounded) for an answer on a name (gateway/approvals.py)
    ask: Callable[[str], None] | None = None

    def who(self, key: FlowKey) -> Process:
        """What process rules are judged with: whether to ask, the executable and its parents."""
        if not self.profile.has_process_rules:
            return None
        return self.identify(key) if self.identify is not None else (None, ())


# None: the profile has no process rules (do not ask); (exe, parents): asked, exe None if
# unidentified.
Process = tuple[str | None, tuple[str, ...]] | None


@dataclass(frozen=True)
class Judged:
    decision: Decision
    address: IPAddress | None  # where to dial, when allowed
    addresses: tuple[str, ...] = ()


def judge(
    profile: Profile,
    name: str | None,
    address: IPAddress | None,
    port: int,
    resolve: Resolve,
    request: tuple[str, str] | None = None,
    process: Process = None,
) -> Judged:
    """The verdict on connecting to ``name`` (resolved here) or to ``address``, on ``port``;
    with ``request`` (method, path as sent), on that HTTP request to it; with ``process``
    (``ProxyGuest.who``), for that executable."""
    method, path = request or (None, None)
    exe, parents = process if process is not None else (None, ())
    asked = Attempt(Protocol.TCP, None, port, None, method, path, process is not None, exe, parents)
    if name is None:
        if address is None:
            return Judged(deny(Reason.UNPARSEABLE, "no name and no address"), None)
        d = decide(profile, replace(asked, address=address))
        return Judged(d, address if d.allowed else None, (str(address),))
    literal = _literal(name)
    if literal is not None:
        d = decide(profile, replace(asked, address=literal))
        return Judged(d, literal if d.allowed else None, (str(literal),))
    first = decide(profile, replace(asked, name=name))
    if not first.allowed:
        return Judged(first, None)
    answers = resolve(name)
    judged = judge_answers(profile, name, port, answers, request=request, process=process)
    # An IPv6 answer is dialled only where decide() allowed it: where the uplink has IPv6.
    return Judged(judged.decision, judged.address, tuple(str(a) for a in answers))


MEMO = 32  # verdicts a connection remembers (distinct targets, requests and processes)
# A remembered verdict: the profile it was judged under, the name's answers (None: judged
# without a lookup), the verdict.
_Held = tuple[Profile, tuple[IPAddress, ...] | None, Judged]


class Judgements:
    """``judge`` for one connection, with its verdicts remembered: every request on a keep-alive
    connection is still judged, but a request ``judge`` has already judged (the same profile
    object, name, address, port, method and path as sent, process, and the same answers for the
    name) gets the ``Judged`` it got then. Exact, not a heuristic: ``decide()`` is pure (no I/O,
    no clock, no state) and a ``Profile`` is frozen; a reload or an approval swaps the guest's
    profile for another object, which is judged afresh. The name is still resolved per request
    (``Lookups``: per TTL) and an answer that changed is judged afresh too.

    Why (bench/proxyloop.py, 2026-12-01): ``judge`` was the largest single cost of an inspected
    request, ~100 of ~600 µs CPU on a loaded machine (two ``decide`` calls, rule strings)."""

    def __init__(self, bound: int = MEMO) -> None:
        self._bound = bound
        self._held: OrderedDict[tuple[Any, ...], _Held] = OrderedDict()
        self.hits = 0  # verdicts reused (tests read it)

    def __call__(
        self,
        profile: Profile,
        name: str | None,
        address: IPAddress | None,
        port: int,
        resolve: Resolve,
        request: tuple[str, str] | None = None,
        process: Process = None,
    ) -> Judged:
        key = (name, address, port, request, process)
        held = self._held.get(key)
        answers: tuple[IPAddress, ...] | None = None  # read here already: judge() gets them
        if held is not None and held[0] is profile:
            if held[1] is not None:
                answers = tuple(resolve(name or ""))
            if held[1] is None or answers == held[1]:
                # judged without a lookup (nothing it depends on can change), or same answers
                self.hits += 1
                self._held.move_to_end(key)
                return held[2]
        asked: list[tuple[IPAddress, ...]] = []

        def recorded(n: str) -> list[IPAddress]:
            got = tuple(resolve(n)) if answers is None else answers
            asked.append(got)
            return list(got)

        judged = judge(profile, name, address, port, recorded, request, process)
        self._held[key] = (profile, asked[0] if asked else None, judged)
        self._held.move_to_end(key)
        while len(self._held) > self._bound:
            self._held.popitem(last=False)
        return judged


def _literal(name: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address  # an IPv6 literal: decide() judges it (deny.ipv6 without an IPv6 uplink)


@dataclass
class Record:
    """One decision record per request or tunnel (issue 3, part 7); becomes one event."""

    guest: ProxyGuest
    door: str  # "explicit" | "transparent"
    client: tuple[str, int]
    original_dst: tuple[str, int] | None = None
    method: str | None = None
    host: str | None = None
    path: str | None = None
    port: int | None = None
    tls: str = "plain"  # plain | passthrough | inspected
    sni: str | None = None
    status: int | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    started: float = field(default_factory=time.monotonic)
    address: str | None = None
    decision: Decision | None = None
    credentials: list[str] = field(default_factory=list)
    note: str | None = None

    def flow_key(self) -> FlowKey:
        if self.original_dst is not None:
            dst, dport = self.original_dst
        else:
            dst, dport = str(self.guest.link.gateway), 0
        return (self.guest.link.ifname, "tcp", self.client[1], dst, dport)

    def _asked_for(self) -> str | None:
        """Where a refused transparent connection was going (it was never dialled)."""
        if self.door == "transparent" and self.original_dst is not None:
            return self.original_dst[0]
        return None

    def event(self) -> Event:
        d = self.decision
        details: dict[str, Any] = {
            "door": self.door,
            "tls": self.tls,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "duration_ms": round((time.monotonic() - self.started) * 1000, 1),
            "sport": self.client[1],
        }
        for key in ("method", "path", "status", "sni", "note"):
            value = getattr(self, key)
            if value is not None:
                details[key] = value
        if self.credentials:
            details["credentials"] = self.credentials
        return Event.attempt(
            Kind.HTTP,
            d,
            session=self.guest.session,
            guest=self.guest.link.ifname,
            category=Category.TCP.value,
            src=self.client[0],
            dst=self.address or self._asked_for(),
            port=self.port,
            protocol="tcp",
            name=self.host,
            details=details,
        )
