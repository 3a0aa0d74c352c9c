"""The gateway's log readers at work: its NFLOG verdict sites and each guest's uid log, into the
sink; and what to say of a flow the guest sent that the gateway never reported.

Handed the sink, the ruleset's sites and the guest table; never the daemon.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import time
from typing import Any

from sandgate.events.schema import Event, FlowKey, Kind
from sandgate.gateway.guests import Guest, GuestTable
from sandgate.gateway.logs.logreader import gateway_event, guest_flow
from sandgate.gateway.sink import EventSink
from sandgate.net.compile import GROUP_ACCEPT, GROUP_DROP, Site
from sandgate.net.nflog import NflogSocket
from sandgate.policy.decide import Attempt, decide
from sandgate.policy.model import Protocol


class LogFeed:
    def __init__(self, sink: EventSink, sites: dict[str, Site], table: GuestTable) -> None:
        self.sink = sink
        self.sites = sites
        self.table = table
        self.readers: list[NflogSocket] = []

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        for group in (GROUP_DROP, GROUP_ACCEPT):
            sock = NflogSocket(group, timeout_cs=1)
            self.readers.append(sock)
            loop.add_reader(sock.fileno(), self.read_gateway, sock)

    def close(self) -> None:
        for sock in self.readers:
            sock.close()

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.readers)

    def read_gateway(self, sock: NflogSocket) -> None:
        for pkt in sock.read():
            site = self.sites.get(pkt.prefix)
            if site is not None:
                self.sink.flow(
                    *gateway_event(
                        pkt, site, self.table.session_at, self.table.session_of, self.pinned
                    )
                )

    def pinned(self, link: str, address: str) -> list[str]:
        """The rule tags the resolver pinned ``address`` under for this guest (still in the
        kernel's sets), for a pin group's log line to name its rule (policy/pins.py)."""
        guest = self.table.get(link)
        if guest is None:
            return []
        now = time.monotonic()
        pins = list(guest.dns.pinned.items())  # the resolver's loop adds to it meanwhile
        live = [t for (a, tags), until in pins if a == address and until > now for t in tags]
        return live or [t for (a, tags), _ in pins if a == address for t in tags]

    def read_all(self, guest: Guest | None = None) -> None:
        """Everything the kernel has logged so far (before a guest leaves, on a flush)."""
        for sock in self.readers:
            self.read_gateway(sock)
        for g in [guest] if guest is not None else list(self.table):
            self.read_guest(g)

    def read_guest(self, guest: Guest) -> None:
        if guest.uidlog is None:
            return
        for pkt in guest.uidlog.read():
            self.sender(*guest_flow(guest.link.ifname, pkt))

    def sender(self, key: FlowKey, uid: int | None, **extra: Any) -> None:
        """A guest-side record of a new flow: its uid (uid log), its process (the hold)."""
        now = time.monotonic()
        self.sink.attributor.sender(key, uid, now, **extra)
        guest = self.table.get(key[0])
        gateway = str(guest.link.gateway) if guest is not None else None
        if key[4] == 53 and key[1] in ("udp", "tcp") and gateway and key[3] != gateway:
            # A DNS packet to another server is redirected: the resolver sees it at the gateway.
            alias: FlowKey = (key[0], key[1], key[2], gateway, 53)
            self.sink.attributor.sender(alias, uid, now, **extra)


def inferred(table: GuestTable, key: FlowKey, uid: int | None, ts: float) -> Event | None:
    """A flow the guest sent that the gateway did not report (its log was rate-limited)."""
    guest = table.get(key[0])
    if guest is None:
        return None
    name, proto, sport, dst, dport = key
    if dst == str(guest.link.gateway):
        return None  # the gateway's own services (resolver, proxy) report their flows
    try:
        address = ipaddress.ip_address(dst)
        protocol = Protocol(proto)
    except ValueError:
        return None
    port = dport if protocol is not Protocol.ICMP else None
    d = decide(guest.profile, Attempt(protocol, address, port))
    fields: dict[str, Any] = {
        "session": guest.session,
        "guest": name,
        "src": str(guest.link.guest),
        "dst": dst,
        "port": port,
        "protocol": proto,
    }
    if d.allowed:
        # Every accepted flow is logged at the gateway; an allowed flow it never logged never
        # reached it (dropped at the link, or failed inside the guest). Claim nothing.
        event = Event.attempt(Kind.CONN, None, **fields)
        details = {"inferred": True, "sport": sport, "would_be": d.key}
        return dataclasses.replace(event, reason="unseen", details=details)
    return Event.attempt(Kind.CONN, d, **fields, details={"inferred": True, "sport": sport})


__all__ = ["LogFeed", "inferred"]
