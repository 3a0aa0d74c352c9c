"""One event schema for every kind of attempt and finding.

A DNS question, a connection attempt (allowed or dropped), an HTTP request, a credential
swap, a write outside the work dir, a configuration drift: each is one ``Event`` with the same
fields, so one query answers "what did this session reach for". Field names are constants here
and nowhere else.
"""

from __future__ import annotations

import enum
import json
import operator
import time
from dataclasses import MISSING, asdict, dataclass, field
from dataclasses import fields as dataclass_fields

from sandgate import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, NoReturn

    from sandgate.policy.decide import Decision


class Kind(enum.StrEnum):
    DNS = "dns"  # a question to the gateway resolver
    CONN = "conn"  # a connection attempt seen at L3/L4 (NFLOG)
    HTTP = "http"  # one request or tunnel through the proxy
    SESSION = "session"  # a session started or ended
    GUEST = "guest"  # a guest joined or left the gateway
    INTEGRITY = "integrity"  # the gateway found itself changed or broken
    DRIFT = "drift"  # configuration changed during a session
    STRAY = "stray"  # a write outside the work dir
    NOTICE = "notice"  # anything else worth a line


class Category(enum.StrEnum):
    """What a person would call the traffic, for reports."""

    DNS = "DNS"
    NTP = "NTP"
    ICMP = "ICMP"
    ICMPV6 = "ICMPv6"
    TCP = "TCP"
    UDP = "UDP"
    L2 = "L2"  # spoofed MAC/ARP/IP or a foreign ethertype at the guest link
    OTHER = "other"


# How every enforcer and log reader names one flow, so their records of it can be joined
# (gateway/logs/attribution.py): guest, protocol, source port, destination, destination port.
FlowKey = tuple[str, str, int | None, str, int | None]


def category_of(protocol: str | None, port: int | None, family: int | None = None) -> Category:
    if protocol == "icmp":
        return Category.ICMP
    if protocol == "ipv6-icmp":
        return Category.ICMPV6
    if port == 53 and protocol in ("udp", "tcp"):
        return Category.DNS
    if port == 123 and protocol == "udp":
        return Category.NTP
    if protocol == "tcp":
        return Category.TCP
    if protocol == "udp":
        return Category.UDP
    return Category.OTHER


# Column names, in table order.
FIELDS = (
    "ts",
    "session",
    "guest",
    "kind",
    "verdict",
    "rule",
    "reason",
    "category",
    "src",
    "dst",
    "port",
    "protocol",
    "name",
    "uid",
    "pid",
    "count",
    "details",
)
_ROW = operator.attrgetter(*FIELDS)
_FIELD_NAMES = frozenset(FIELDS)
_KIND_AT = FIELDS.index("kind")
_DETAILS_AT = FIELDS.index("details")
# json.dumps(details, sort_keys=True), whose keyword makes a new encoder per call: made once.
_DETAILS_JSON = json.JSONEncoder(sort_keys=True)


class FrozenDetails(dict[str, "Any"]):  # "Any": a run loads no typing (sandgate/__init__.py)
    """Details shared by many events (every answer from one resolver cache entry), read-only,
    with their JSON text made once instead of once per event."""

    text: str | None = None

    @classmethod
    def of(cls, values: dict[str, Any], text: str | None = None) -> FrozenDetails:
        """``values``, with ``text`` their JSON when it was made before (else made here)."""
        details = cls(values)
        if text is None:
            text = json.dumps(details, sort_keys=True) if details else None
        details.text = text
        return details

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("these event details are shared and read-only")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _read_only
    __ior__ = _read_only


@dataclass(frozen=True)
class Event:
    """One logged thing, as the store keeps it."""

    kind: Kind
    ts: float = field(default_factory=time.time)
    session: str | None = None
    guest: str | None = None
    verdict: str | None = None  # "allow" | "deny" | None when the event is not a decision
    rule: str | None = None
    reason: str | None = None  # a Reason key such as "deny.private"
    category: str | None = None
    src: str | None = None
    dst: str | None = None
    port: int | None = None
    protocol: str | None = None
    name: str | None = None  # DNS name, SNI, Host
    uid: int | None = None
    pid: int | None = None
    count: int = 1  # packets or repeats folded into this one event
    details: dict[str, Any] = field(default_factory=dict)

    def but(self, **changes: Any) -> Event:
        """This event with ``changes``: what ``dataclasses.replace`` makes, at a twentieth of
        its cost (no ``__init__`` and its per-field work, ~10 µs on a loaded machine). Hot: every
        DNS answer's event is joined with its sender (gateway/logs/attribution.py)."""
        unknown = changes.keys() - _FIELD_NAMES
        if unknown:
            raise TypeError(f"Event has no field {', '.join(sorted(unknown))}")
        new = object.__new__(type(self))
        values = new.__dict__
        values.update(self.__dict__)
        values.update(changes)
        return new

    def row(self) -> tuple[Any, ...]:
        """The store's row. Hot (every DNS question, every logged packet): no ``asdict``."""
        return encode_row(self.raw_row())

    def raw_row(self) -> tuple[Any, ...]:
        """The row with its details still a plain dict, not yet JSON (``encode_row`` makes it
        ``row()``): the gateway's store writer encodes them in its own process, off the
        daemon's GIL (events/writer.py)."""
        values = list(_ROW(self))
        values[_KIND_AT] = str(self.kind)
        details = self.details
        text = details.text if isinstance(details, FrozenDetails) else None
        if text:
            values[_DETAILS_AT] = text
        elif not details:
            values[_DETAILS_AT] = None
        elif type(details) is not dict:
            values[_DETAILS_AT] = dict(details)
        return tuple(values)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Event:
        values = {f: row[f] for f in FIELDS}
        values["kind"] = Kind(values["kind"])
        values["details"] = json.loads(values["details"]) if values["details"] else {}
        return cls(**values)

    @classmethod
    def attempt(
        cls,
        kind: Kind,
        decision: Decision | None,
        *,
        protocol: str | None = None,
        port: int | None = None,
        category: str | None = None,
        **fields: Any,
    ) -> Event:
        """The canonical record of one attempt, with its ``Decision`` inside: verdict, reason
        key and rule are read from the decision here, and nowhere else (no enforcer copies
        them as strings). ``decision`` None: an attempt not (yet) judged.

        Made as ``but`` makes its copy, without ``__init__`` (its per-field work is most of an
        event's cost; one a DNS question): tests/unit/test_event_copy.py checks the result
        against the constructor's."""
        if fields.keys() - _ATTEMPT_FIELDS:
            unknown = fields.keys() - _ATTEMPT_FIELDS
            raise TypeError(f"Event.attempt takes no field {', '.join(sorted(unknown))}")
        new = object.__new__(cls)
        values = new.__dict__
        values.update(_DEFAULTS)
        values["ts"] = time.time()
        values["details"] = {}
        values["kind"] = kind
        if decision is not None:
            values["verdict"] = decision.verdict.value
            values["reason"] = decision.key
            values["rule"] = decision.rule_ref
        values["protocol"] = protocol
        values["port"] = port
        values["category"] = category or category_of(protocol, port).value
        values.update(fields)
        return new

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Event:
        values: dict[str, Any] = {f: raw.get(f) for f in FIELDS}
        values["kind"] = Kind(str(values["kind"]))
        values["details"] = values["details"] or {}
        values["count"] = values["count"] or 1
        return cls(**values)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = str(self.kind)
        return out


# Every field at its default, in declaration order (``Event.attempt``); a factory's field (the
# time, the details) is set per event.
_DEFAULTS = {f.name: None if f.default is MISSING else f.default for f in dataclass_fields(Event)}
# What ``Event.attempt`` takes as keywords beside those it sets itself.
_ATTEMPT_FIELDS = (
    _FIELD_NAMES - {"kind", "verdict", "reason", "rule", "protocol", "port"} - {"category"}
)


def encode_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """``Event.raw_row()``'s row as the store keeps it: the details as canonical JSON."""
    details = row[_DETAILS_AT]
    if details is None or isinstance(details, str):
        return row
    values = list(row)
    values[_DETAILS_AT] = _DETAILS_JSON.encode(details)
    return tuple(values)
