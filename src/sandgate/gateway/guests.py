"""The guest table: who is on this gateway, by link name and by address.

A leaf object: it knows guests and their slots in the pool, not the services that serve them.
The daemon's parts look guests up here (the TLS gate by source address, the log readers by
link); only the guest lifecycle (lifecycle.py) adds and removes them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from sandgate.errors import SandgateError
from sandgate.gateway.dns.resolver import GuestDNS
from sandgate.gateway.logs.prochold import ProcessHold
from sandgate.gateway.proxy.flow import ProxyGuest
from sandgate.net.compile import GuestLink, Site
from sandgate.net.nflog import NflogSocket
from sandgate.policy.model import IPNetwork
from sandgate.policy.profile import Profile


@dataclass
class Guest:
    link: GuestLink
    netns: str
    session: str | None
    profile: Profile
    sites: dict[str, Site]
    dns: GuestDNS
    uid: int | None = None
    uidlog: NflogSocket | None = None
    proxy: ProxyGuest | None = None
    hold: ProcessHold | None = None  # which process made each flow (logs/prochold.py)
    started: float = field(default_factory=time.time)
    msg: dict[str, Any] = field(default_factory=dict)  # how it was added (for reloads, restarts)


class GuestTable:
    """Guests by link name and by address; the canary apart (it is the watchdog's)."""

    def __init__(self, pool: IPNetwork) -> None:
        self.pool = pool
        self.by_link: dict[str, Guest] = {}
        self._by_address: dict[str, Guest] = {}
        self.draining: set[str] = set()  # removed guests whose links are still being deleted
        self.canary: Guest | None = None

    def __iter__(self) -> Iterator[Guest]:
        return iter(list(self.by_link.values()))

    def __len__(self) -> int:
        return len(self.by_link)

    def free_index(self, reserved: AbstractSet[int] = frozenset()) -> int:
        """The first /30 of the pool no guest holds (the last is the canary's), and none of
        ``reserved`` (the warm pool's, gateway/pool.py)."""
        free = (
            i
            for i in range(self.canary_index())
            if f"g{i}" not in self.by_link and f"g{i}" not in self.draining and i not in reserved
        )
        index = next(free, None)
        if index is None:
            raise SandgateError(
                f"the guest pool {self.pool} is full ({len(self.by_link)} guests)",
                "wait for sessions to end, or start the gateway with a larger guest_pool",
            )
        return index

    def canary_index(self) -> int:
        return self.pool.num_addresses // 4 - 1

    def add(self, guest: Guest) -> None:
        self.by_link[guest.link.ifname] = guest
        self._by_address[str(guest.link.guest)] = guest

    def pop(self, name: str) -> Guest:
        guest = self.by_link.pop(name)
        self._by_address.pop(str(guest.link.guest), None)
        return guest

    def get(self, name: str | None) -> Guest | None:
        return self.by_link.get(name or "")

    def at(self, address: str | None) -> Guest | None:
        return self._by_address.get(address or "")

    def everyone(self) -> list[Guest]:
        """Every guest, the canary included (repairs and faults reach it too)."""
        return [*self.by_link.values(), *([self.canary] if self.canary else [])]

    def is_canary(self, name: str | None) -> bool:
        return self.canary is not None and name == self.canary.link.ifname

    # -- lookups handed to the services ---------------------------------------------------------

    def profile_at(self, address: str) -> tuple[str, str | None, Profile] | None:
        """(link, session, profile) of the guest at ``address`` (the TLS gate's question)."""
        guest = self.at(address)
        return (guest.link.ifname, guest.session, guest.profile) if guest else None

    def session_at(self, address: str | None) -> tuple[str, str | None] | None:
        """(link, session) of the guest at ``address`` (the log readers' question)."""
        guest = self.at(address)
        return (guest.link.ifname, guest.session) if guest else None

    def session_of(self, name: str | None) -> str | None:
        guest = self.get(name)
        return guest.session if guest else None


__all__ = ["Guest", "GuestTable"]
