"""The proxy's name lookups, kept for the TTL the answer gave.

The proxy used to ask the upstream for a name's A records on every request: a hop to the
event loop's thread and a DNS round trip per request on a keep-alive connection. ``Lookups``
keeps each answer for its smallest TTL (capped), so a name is looked up once per TTL. Only the
addresses are kept, never a verdict: every request is still judged by ``decide()`` with the
addresses it is given (flow.judge), and the proxy dials one of those it checked. Empty answers
(NXDOMAIN, NODATA, a timeout) are not kept: the next request asks again.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

TTL_CAP = 300.0  # seconds: an answer is kept at most this long, whatever its TTL says
NAMES = 4096  # answers kept (LRU)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Found(Protocol):
    """What the resolver read from the upstream's reply (gateway/dns/dnslogic.py
    ``Addresses``): the reply is parsed once, there, not again here."""

    @property
    def found(self) -> Sequence[Address]: ...

    @property
    def ttl(self) -> int: ...


# name -> the addresses the upstream gave (to an A question, or to AAAA for a name with no A
# record), or None (timeout, no readable reply)
Ask = Callable[[str], "Found | None"]


class Lookups:
    """A ``flow.Resolve``: ``lookups(name)`` is the name's A (else AAAA) records, from the
    upstream at most once per TTL. Thread-safe (the proxy's connection threads share it)."""

    def __init__(
        self,
        ask: Ask,
        cap: float = TTL_CAP,
        bound: int = NAMES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._cap = cap
        self._bound = bound
        self._clock = clock
        self._held: OrderedDict[str, tuple[float, list[Address]]] = OrderedDict()
        self._lock = threading.Lock()
        self.asked = 0  # upstream questions made (tests and the bench read it)

    def __call__(self, name: str) -> list[Address]:
        key = name.lower().rstrip(".")
        now = self._clock()
        with self._lock:
            held = self._held.get(key)
            if held is not None and held[0] > now:
                self._held.move_to_end(key)
                return list(held[1])
        self.asked += 1
        answer = self._ask(key)
        found = list(answer.found) if answer is not None else []
        ttl = min(float(answer.ttl), self._cap) if found and answer is not None else 0.0
        if found and ttl > 0:
            with self._lock:
                self._held[key] = (now + ttl, found)
                self._held.move_to_end(key)
                while len(self._held) > self._bound:
                    self._held.popitem(last=False)
        return list(found)

    def forget(self) -> None:
        """Drop every kept answer (a policy reload or an operator's wish)."""
        with self._lock:
            self._held.clear()
