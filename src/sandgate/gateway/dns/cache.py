"""The resolver's cached answers, held where the garbage collector does not walk them.

A cached answer is a plain tuple of bytes, strings, numbers and tuples of them (``Packed``),
which CPython's collector untracks at its first pass: no later pass, young or full, walks it
again. A cache of dataclass entries, each with its own ``Decision``, was 2 tracked objects an
answer, and a full pass over ~48,000 answers (a gateway's cache after a while) stopped the
event loop for 56-79 ms on this machine (``bench.resolverloop``'s "uncached, full cache",
2026-12-02); every answer waiting behind it, cached ones too, felt it.

The decision an answer carries is a number: ``Verdicts`` keeps one ``Decision`` for every
(verdict, reason key, rule) it has met, which is what ``Event.attempt`` reads of a decision, so
an event made with that one is the event the answer's own decision makes
(tests/unit/test_dns_cache.py checks both). Those few are all the cache holds that is tracked.

On a hit the reply is rebuilt from bytes: the asker's id, then ``HEAD`` (the rest of the
header), then the asker's spelling of the name up to ``NAME_END``, then ``REST`` (aged once per
elapsed second). ``cut`` makes those at the first hit (most names are asked once); ``NAME_END``
0: the answer does not echo the name as asked, and answers that very query only.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Final, cast

from sandgate.events.schema import FrozenDetails
from sandgate.gateway.dns import dnslogic
from sandgate.policy.decide import Decision

__all__ = ["Answer", "Packed", "Verdicts", "hit_details", "pack", "reply"]

PinTags = tuple[str, ...]  # the pin sets (policy/pins.py) an answer's addresses join


@dataclass(slots=True)
class Answer:
    """An answer as judged, before it is cached (``pack``)."""

    wire: bytes
    expires: float
    name: str
    qtype: str
    decision: Decision  # what the answer says; every event of it carries this
    rcode: int
    addresses: tuple[str, ...] = ()
    ttl: int = 0
    pin: PinTags = ()  # the pin sets these addresses join at L3
    pins: bool = False  # the gateway must learn these addresses before the guest does
    inspect: bool = False  # an inspected name: send the guest's TLS to them to the proxy
    made: float | None = None  # when the upstream answered (monotonic); None: not aged

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"qtype": self.qtype, "rcode": self.rcode}
        if self.addresses:
            out["answers"] = list(self.addresses)
        return out


# A cached answer: only atoms (see the module docstring). Fields, by position:
Packed = tuple[
    float,  # EXPIRES (monotonic)
    int,  # NAME_END: -1 until ``cut``; 0: the answer does not echo the name
    bytes,  # HEAD
    bytes,  # REST
    bytes,  # QUERY: the query the answer was made for
    float | None,  # MADE: when the upstream answered; None: not aged
    int,  # AGE: the whole seconds REST is aged by
    tuple[int, ...] | None,  # TTLS: offset, TTL, offset, TTL... read at the first ageing
    bytes,  # WIRE: the answer as judged
    bool,  # PINS
    tuple[str, ...],  # ADDRESSES
    int,  # TTL
    PinTags,  # PIN
    bool,  # INSPECT
    str,  # NAME
    str,  # QTYPE
    int,  # RCODE
    int,  # VERDICT: its number in ``Verdicts``
    int,  # SERIAL: this answer's own number (a repeat is counted per answer, not per name)
    str | None,  # HIT: the JSON text of a cached answer's details, made by ``cut``
]
EXPIRES: Final = 0
NAME_END: Final = 1
HEAD: Final = 2
REST: Final = 3
QUERY: Final = 4
MADE: Final = 5
AGE: Final = 6
TTLS: Final = 7
WIRE: Final = 8
PINS: Final = 9
ADDRESSES: Final = 10
TTL: Final = 11
PIN: Final = 12
INSPECT: Final = 13
NAME: Final = 14
QTYPE: Final = 15
RCODE: Final = 16
VERDICT: Final = 17
SERIAL: Final = 18
HIT: Final = 19

_serials = itertools.count()


class Verdicts:
    """One ``Decision`` per (verdict, reason key, rule): what events read of a decision. As
    many as a policy has rules and reasons, not one an answer."""

    def __init__(self) -> None:
        self._number: dict[tuple[str, str, str | None], int] = {}
        self.decisions: list[Decision] = []

    def number(self, decision: Decision) -> int:
        key = (decision.verdict.value, decision.key, decision.rule_ref)
        found = self._number.get(key)
        if found is None:
            found = self._number[key] = len(self.decisions)
            self.decisions.append(decision)
        return found


def pack(answer: Answer, query: bytes, verdict: int) -> Packed:
    """``answer`` (to ``query``) as the cache holds it, its decision ``verdict`` (Verdicts).
    The rcode as a plain int: dnspython's ``Rcode`` is an enum, which the collector tracks."""
    a = answer
    return (
        a.expires, -1, b"", b"", query, a.made, 0, None, a.wire, a.pins, a.addresses, a.ttl,
        a.pin, a.inspect, a.name, a.qtype, int(a.rcode), verdict, next(_serials), None,
    )  # fmt: skip


def cut(p: Packed) -> Packed:
    """``p`` with the parts a reply is made of, and its cached events' details."""
    query, wire = p[QUERY], p[WIRE]
    end = dnslogic.qname_end(query)
    if end and wire[12:end].lower() == query[12:end].lower():
        head = wire[2:12]
    else:
        end, head = 0, b""
    hit = FrozenDetails.of(_values(p)).text
    return _but(p, {NAME_END: end, HEAD: head, REST: wire[end or 2 :], HIT: hit})


def aged(p: Packed, age: int) -> Packed:
    """``p`` (cut) with REST aged by ``age`` whole seconds."""
    ttls = p[TTLS]
    if ttls is None:  # flat: a tuple of pairs would take the collector a pass more to untrack
        ttls = tuple(n for field in dnslogic.ttl_fields(p[WIRE]) or () for n in field)
    fields = tuple(zip(ttls[::2], ttls[1::2], strict=True))
    rest = dnslogic.aged(p[WIRE], fields, age)[p[NAME_END] or 2 :]
    return _but(p, {REST: rest, AGE: age, TTLS: ttls})


def reply(p: Packed, query: bytes, now: float) -> tuple[bytes | None, Packed]:
    """The answer to ``query`` (a question with ``p``'s cache key) at ``now``: the cached bytes
    with the query's id and spelling, every TTL lowered by the whole seconds held (None: ``p``
    cannot answer that spelling); and ``p`` as it is now (cut, aged), for the cache to keep."""
    if p[NAME_END] < 0:
        p = cut(p)
    made = p[MADE]
    if made is not None:
        age = int(now - made)
        if age != p[AGE]:
            p = aged(p, age)
    end = p[NAME_END]
    if end:
        return query[:2] + p[HEAD] + query[12:end] + p[REST], p
    if query[2:] != p[QUERY][2:]:
        return None, p
    return query[:2] + p[REST], p


def hit_details(p: Packed) -> FrozenDetails:
    """The details of an event of answers from the cache (``p`` is cut: its JSON is made)."""
    return FrozenDetails.of(_values(p), text=p[HIT])


def _values(p: Packed) -> dict[str, Any]:
    values: dict[str, Any] = {"qtype": p[QTYPE], "rcode": p[RCODE]}
    if p[ADDRESSES]:
        values["answers"] = list(p[ADDRESSES])
    values["cached"] = True
    return values


def _but(p: Packed, changes: dict[int, Any]) -> Packed:
    fields = list(p)
    for at, value in changes.items():
        fields[at] = value
    return cast(Packed, tuple(fields))
