"""The reader of the TLS gate: judges each new TLS flow on its ClientHello, in the kernel's path.

The gateway's iptables-nft rules (net/iptables.py) hold the data segments of every new flow from
a guest to port 443 in an NFQUEUE until this reader answers. It reassembles the first flight
(gateway/proxy/firstflight.py), parses the SNI, and asks ``decide()`` about that name at that
address; the verdict sets a conntrack mark and the rest of the flow passes at kernel speed, never
through user space. A deny becomes a TCP reset. With no reader bound, flows are blocked: the rule
has no bypass (fail closed).

Names the profile inspects are not passed through: the resolver sends their addresses to the
proxy. A ClientHello for such a name on some other address (one the guest did not get from our
resolver) is refused, because the gateway could not have swapped its credentials.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

from sandgate.events.schema import Category, Event, FlowKey, Kind
from sandgate.gateway.proxy import sni
from sandgate.gateway.proxy.firstflight import FirstFlights
from sandgate.net.iptables import TlsGate
from sandgate.net.nfqueue import NfqueueSocket, QueuedPacket
from sandgate.policy.decide import Attempt, Decision, Reason, decide, deny
from sandgate.policy.model import Protocol
from sandgate.policy.profile import Profile
from sandgate.policy.requests import gate_verdict

QUEUE = 7

GuestOf = Callable[[str], "tuple[str, str | None, Profile] | None"]  # src -> link, session, profile
Emit = Callable[[FlowKey | None, Event], None]


class GateReader:
    def __init__(
        self, guest_of: GuestOf, emit: Emit, queue: int = QUEUE, ifaces: tuple[str, ...] = ()
    ) -> None:
        self.gate = TlsGate(queue, ifaces=ifaces)
        self.socket = NfqueueSocket(queue)
        self.flights = FirstFlights(self._judge)
        self._guest_of = guest_of
        self._emit = emit
        self.judged = 0
        self.cut = False  # the watchdog cut the gateway off: every new flow is refused

    def fileno(self) -> int:
        return self.socket.fileno()

    def on_readable(self) -> None:
        now = time.monotonic()
        for packet in self.socket.read():
            for held, action in self.flights.feed(packet, now):
                self.socket.verdict(held.id, **self.gate.verdict_args(held, action))

    def expire(self) -> None:
        recorded: set[object] = set()
        for held, action in self.flights.expire(time.monotonic()):
            if held.flow not in recorded:
                recorded.add(held.flow)
                self._record(held, None, deny(Reason.PROTOCOL, "the ClientHello never completed"))
            self.socket.verdict(held.id, **self.gate.verdict_args(held, action))

    def close(self) -> None:
        self.socket.close()

    def _judge(self, first: QueuedPacket, flight: bytes) -> bool | None:
        if self.cut:
            self._record(first, None, deny(Reason.PROTOCOL, "the gateway is cut off (integrity)"))
            return False
        try:
            parsed = sni.parse_client_hello(flight)
        except sni.Malformed as exc:
            self._record(first, None, deny(Reason.PROTOCOL, f"ClientHello: {exc.reason}"))
            return False
        if isinstance(parsed, sni.NeedMore):
            return None
        found = self._guest_of(first.src or "")
        if found is None or first.dst is None or first.dport is None:
            self._record(first, parsed.sni, deny(Reason.UNPARSEABLE, "not from a known guest"))
            return False
        _, _, profile = found
        d = decide(
            profile, Attempt(Protocol.TCP, ipaddress.ip_address(first.dst), first.dport, parsed.sni)
        )
        d = gate_verdict(profile, d, parsed.sni)
        self._record(first, parsed.sni, d)
        return d.allowed

    def _record(self, first: QueuedPacket, name: str | None, d: Decision) -> None:
        self.judged += 1
        found = self._guest_of(first.src or "")
        link, session = (found[0], found[1]) if found else (None, None)
        event = Event.attempt(
            Kind.HTTP,
            d,
            session=session,
            guest=link,
            category=Category.TCP.value,
            src=first.src,
            dst=first.dst,
            port=first.dport,
            protocol="tcp",
            name=name,
            details={
                "door": "transparent",
                "tls": "passthrough",
                "path": "kernel",
                "sni": name,
                "sport": first.sport,
            },
        )
        key = (link, "tcp", first.sport, first.dst, first.dport) if link and first.dst else None
        self._emit(key, event)
