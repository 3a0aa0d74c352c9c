"""Holding a TCP flow's first flight until it can be judged (the reader side of the TLS gate).

The kernel queues the data segments of each new flow to port 443 (net/iptables.py); this module
decides which held packets to release, with which verdict, once the first flight (the
ClientHello) is whole. ``StreamPrefix`` reassembles it from segments in any order;
``FirstFlights`` calls the judge and never holds anything forever. Pure: no sockets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from sandgate.net.iptables import Action
from sandgate.net.nfqueue import QueuedPacket


class StreamPrefix:
    """The first bytes of one TCP direction, from held segments in any order.

    ``start`` is the sequence number of the stream's first byte (ISN + 1) when known; otherwise
    the first segment added is taken as the start, and ``out_of_order`` becomes true if a segment
    before it shows up later: the caller should then deny, since the peer sees bytes the reader
    did not. Overlapping retransmissions must agree byte for byte,
    else ``conflict`` is set (a peer could otherwise show the reader and the server different
    bytes). At most ``limit`` bytes are kept; ``overflow`` says a segment reached past that.
    """

    def __init__(self, start: int | None = None, limit: int = 1 << 16) -> None:
        self.start = start
        self.limit = limit
        self.out_of_order = False
        self.conflict = False
        self.overflow = False
        self._buf = bytearray()
        self._have = bytearray()  # 1 where a byte of _buf was received

    def add(self, seq: int, data: bytes) -> None:
        if not data:
            return
        if self.start is None:
            self.start = seq
        off = (seq - self.start) & 0xFFFFFFFF
        if off >= 1 << 31:  # before the start (u32 arithmetic: sequence numbers wrap)
            self.out_of_order = True
            return
        end = off + len(data)
        if end > self.limit:
            self.overflow = True
            data, end = data[: max(0, self.limit - off)], min(end, self.limit)
            if off >= end:
                return
        if end > len(self._buf):
            grow = end - len(self._buf)
            self._buf += bytes(grow)
            self._have += bytes(grow)
        seen = self._have[off:end]
        if 1 in seen:  # a retransmission overlaps: bytes seen before must not change
            old = self._buf[off:end]
            self.conflict |= any(h and a != b for h, a, b in zip(seen, old, data, strict=True))
        self._buf[off:end] = data
        self._have[off:end] = b"\x01" * (end - off)

    def contiguous(self) -> bytes:
        """The bytes received without a gap from the start."""
        gap = self._have.find(0)
        return bytes(self._buf if gap < 0 else self._buf[:gap])


# (the flow's first held packet, the first flight's bytes) -> allow, deny, or None: need more
Judge = Callable[[QueuedPacket, bytes], "bool | None"]


@dataclass(slots=True)
class _Held:
    prefix: StreamPrefix
    packets: list[QueuedPacket]
    since: float


class FirstFlights:
    """Holds each TCP flow's data segments until ``judge`` can decide from the stream's start.

    Pure: ``feed(packet, now)`` returns ``(packet, Action)`` pairs to apply now, in sequence
    order. ``[]`` means hold (the first flight is incomplete). Once ``judge`` returns True or
    False every held packet of the flow is released with ALLOW or DENY. Deny, never hold forever:
    ``judge`` raising, a flight longer than ``limit``, segments that disagree or precede the
    assumed start, more than ``max_flows`` flows in the air, and (via ``expire``) flows held
    longer than ``timeout`` seconds. A segment of a recently decided flow that lies inside the
    judged bytes (a retransmission queued before the ct mark was set) gets the same verdict; any
    other segment starts a new flow, so a reused 4-tuple is judged afresh.

    Limit: the rules skip the SYN, so the stream's start is the first data segment seen. A client
    that sends a later segment first and the earlier bytes only after the verdict (they then
    skip the queue) shows the reader one hello and the server another. Like domain fronting,
    that only lets a client lie about a name on an address the policy already allows; queueing
    SYNs (their sequence number is the start) would close it at one more verdict per connection.
    """

    def __init__(
        self,
        judge: Judge,
        *,
        limit: int = 16384,
        timeout: float = 5.0,
        max_flows: int = 1024,
        remember: int = 4096,
    ) -> None:
        self.judge = judge
        self.limit = limit
        self.timeout = timeout
        self.max_flows = max_flows
        self.remember = remember
        self._held: dict[tuple[object, ...], _Held] = {}
        self._done: OrderedDict[tuple[object, ...], tuple[Action, int, int]] = OrderedDict()

    @property
    def holding(self) -> int:
        """Packets held now."""
        return sum(len(h.packets) for h in self._held.values())

    def feed(self, p: QueuedPacket, now: float) -> list[tuple[QueuedPacket, Action]]:
        if p.tcp_seq is None:
            return [(p, Action.DENY)]  # not TCP we can read: the rules queue nothing else
        if not p.data:
            return [(p, Action.PASS)]  # no bytes to judge, none to leak
        key = p.flow
        done = self._done.get(key)
        if done is not None and key not in self._held:
            action, start, end = done
            if (p.tcp_seq - start) & 0xFFFFFFFF < end and (
                (p.tcp_seq + len(p.data) - start) & 0xFFFFFFFF
            ) <= end:
                return [(p, action)]
        held = self._held.get(key)
        if held is None:
            if len(self._held) >= self.max_flows:
                return [(p, Action.DENY)]
            held = self._held[key] = _Held(StreamPrefix(limit=self.limit), [], now)
        held.packets.append(p)
        held.prefix.add(p.tcp_seq, p.data)
        prefix = held.prefix
        verdict: bool | None = False
        if not (prefix.out_of_order or prefix.conflict or prefix.overflow):
            try:
                verdict = self.judge(held.packets[0], prefix.contiguous())
            except Exception:  # a broken judge denies, it never lets the flow through
                verdict = False
        if verdict is None:
            return []
        return self._release(key, Action.ALLOW if verdict else Action.DENY)

    def expire(self, now: float) -> list[tuple[QueuedPacket, Action]]:
        """Deny every flow held ``timeout`` seconds or more."""
        old = [k for k, h in self._held.items() if now - h.since >= self.timeout]
        return [pair for k in old for pair in self._release(k, Action.DENY)]

    def _release(
        self, key: tuple[object, ...], action: Action
    ) -> list[tuple[QueuedPacket, Action]]:
        held = self._held.pop(key)
        start = held.prefix.start or 0
        self._done[key] = (action, start, len(held.prefix.contiguous()))
        self._done.move_to_end(key)
        while len(self._done) > self.remember:
            self._done.popitem(last=False)
        ordered = sorted(held.packets, key=lambda q: ((q.tcp_seq or 0) - start) & 0xFFFFFFFF)
        return [(q, action) for q in ordered]
