"""The gateway's log readers at work: its NFLOG verdict sites and each guest's uid log, into the
sink; and what to say of a flow the guest sent that the gateway never reported.

Handed the sink, the ruleset's sites and the guest table; never the daemon.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import sys
import time
from collections.abc import Iterator
from typing import Any

from sandgate.events.schema import Event, FlowKey, Kind
from sandgate.gateway.guests import Guest, GuestTable
from sandgate.gateway.logs.logreader import gateway_event, guest_flow
from sandgate.gateway.sink import EventSink
from sandgate.net.compile import FLUSH_MARK, FLUSH_PREFIX, GROUP_ACCEPT, GROUP_DROP, Site
from sandgate.net.nflog import MarkerSender, NflogSocket
from sandgate.policy.decide import Attempt, decide
from sandgate.policy.model import Protocol

BARRIER_MAX = 1.0  # seconds a leaving guest's last flows may take to clear (a burst's)


class LogFeed:
    def __init__(self, sink: EventSink, sites: dict[str, Site], table: GuestTable) -> None:
        self.sink = sink
        self.sites = sites
        self.table = table
        self.readers: list[NflogSocket] = []
        self.marker: MarkerSender | None = None
        self._token = 0
        self._pending: dict[int, set[int]] = {}  # a marker's token → groups yet to log it

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        for group in (GROUP_DROP, GROUP_ACCEPT):
            sock = NflogSocket(group, timeout_cs=1)
            self.readers.append(sock)
            loop.add_reader(sock.fileno(), self.read_gateway, sock)
        try:
            self.marker = MarkerSender(FLUSH_MARK)
        except OSError as exc:  # flush() then always says no: callers wait the settle instead
            print(f"sandgate: no log flush marker ({exc}); logs wait the settle", file=sys.stderr)

    def close(self) -> None:
        for sock in self.readers:
            sock.close()
        if self.marker is not None:
            self.marker.close()

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.readers)

    def _tokens(self) -> Iterator[int]:
        while True:
            self._token = self._token % 0xFFFF + 1
            yield self._token

    def _expect(self, tokens: list[int]) -> None:
        for token in tokens:
            self._pending[token] = {sock.group for sock in self.readers}

    def _done(self, tokens: list[int]) -> bool:
        return not any(self._pending.get(t) for t in tokens)

    def _marker(self, group: int, token: int | None) -> None:
        groups = self._pending.get(token) if token is not None else None
        if groups is None:
            return  # not awaited (any more)
        groups.discard(group)

    def flush(self) -> bool:
        """Read every gateway log record the kernel holds for anything logged before now.

        Sends one flush marker from the gateway itself (net/compile.py ``FLUSH_MARK``), logged
        in ``sendto``, and reads each group up to it: True when every group's marker came back.
        False (no marker rule, a lost batch): the caller waits out the kernel's timer instead.
        """
        if self.marker is None:
            return False
        tokens = [next(self._tokens())]
        self._expect(tokens)
        try:
            self.marker.send(tokens[0])
            for sock in self.readers:
                while sock.group in self._pending[tokens[0]] and self.read_gateway(sock):
                    pass
            return self._done(tokens)
        except OSError:
            return False
        finally:
            self._pending.pop(tokens[0], None)

    async def barrier(self, guest: Guest, stall: float) -> bool:
        """Wait until every flow ``guest``'s processes started has been reported by the
        gateway, reading its records as they come: its counters and events are final then.

        A flow's first packet waits in the guest's process hold (logs/prochold.py), which
        lets them go one /proc walk after another: 300 connects take ~100 ms to clear, long
        after their sender died. So the hold first lets them all go (``release_all``). The
        uid log then records each flow as it goes on (no batch: queue-threshold 1), before
        the gateway meets it (a CPU's receive backlog may still hold it), so the gateway's
        record can come later: each round flushes the gateway's log batches (``flush``) and
        compares. False when nothing moved for ``stall`` seconds (a flow the gateway never
        logs: rate-limited), after BARRIER_MAX, or without the marker; the caller then waits
        the settle. Flows to the gateway's own address are its services' to report.
        Measured 2026-12-01, kernel 6.18, 2 cores at load 3: ~0.2 ms for a quiet guest.
        """
        gateway = str(guest.link.gateway)
        if guest.hold is not None:
            guest.hold.release_all()
        start = moved = time.monotonic()
        before: tuple[bool, list[FlowKey]] | None = None
        while True:
            released = guest.hold is None or guest.hold.released
            self.read_guest(guest)
            if not self.flush():
                return False
            waiting = self.sink.attributor.unreported(guest.link.ifname)
            # The gateway's own services report flows to its address; the guest drops IPv6
            # itself unless the uplink has it (after the uid log saw it).
            waiting = [k for k in waiting if k[3] != gateway and ":" not in k[3]]
            if released and not waiting:
                return True
            now = time.monotonic()
            if (released, waiting) != before:  # still moving: a burst is being worked off
                before, moved = (released, waiting), now
            elif (released and now - moved > stall) or now - start > BARRIER_MAX:
                return False
            await asyncio.sleep(0.0005)

    def read_gateway(self, sock: NflogSocket) -> int:
        """Turn what ``sock`` holds into events; the number of records read."""
        packets = sock.read()
        for pkt in packets:
            if pkt.prefix == FLUSH_PREFIX:  # a flush marker: neither event nor count
                self._marker(pkt.group, pkt.dport)
                continue
            site = self.sites.get(pkt.prefix)
            if site is not None:
                self.sink.flow(
                    *gateway_event(
                        pkt, site, self.table.session_at, self.table.session_of, self.pinned
                    )
                )
        return len(packets)

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
