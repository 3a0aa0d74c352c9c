"""The gateway watching itself while guests run (``sandgate up --watchdog 1s``).

Every interval: the applied ruleset's digest against the one recorded when the gateway last
changed it itself; the resolver and the proxy answering; the canary guest's denied probe still
refused by the gateway and its resolver still answering; the policy files still readable and
valid. On any drift: an integrity event, every guest cut off (forwarding off, the resolver and
the proxy refusing everything: not just a log line), an alarm (the daemon's stderr, the event
store, ``--notify``). Then a repair: the rules and listeners re-applied from what the gateway
knows, checked again, and only then the cut lifted. Detection takes at most two intervals.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandgate.events.schema import Event, Kind


class Watched(Protocol):
    """What the watchdog needs of the gateway (gateway/server.py implements it)."""

    def drifted(self) -> bool: ...  # the ruleset changed by someone else (hold settled())
    def settled(self) -> AbstractAsyncContextManager[Any]: ...  # no change of its own half made
    async def probe_canary(self) -> list[str]: ...
    async def probe_services(self) -> list[str]: ...
    def policy_problems(self) -> list[str]: ...
    async def cut(self, why: str) -> None: ...
    async def repair(self) -> None: ...
    async def uncut(self) -> None: ...
    def emit(self, event: Event) -> None: ...
    def notify(self, payload: dict[str, Any]) -> None: ...


@dataclass
class Watchdog:
    gateway: Watched
    interval: float
    cut: bool = False
    drifts: int = 0
    last_check: float = 0.0
    problems: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception as exc:  # the watchdog must never die of one bad check
                self._say(f"watchdog check failed: {exc!r}")

    async def check(self) -> list[str]:
        """One round; returns the problems found (empty: all is well)."""
        g = self.gateway
        problems: list[str] = []
        async with g.settled():
            drifted = g.drifted()
        if drifted:
            problems.append("the gateway's ruleset was changed from outside")
        problems += await g.probe_services()
        problems += await g.probe_canary()
        policy = g.policy_problems()
        self.last_check = time.time()
        if policy:
            # A broken policy file never weakens anything: the last good policy stays in force.
            self._record("policy", policy, cut=False)
        if problems:
            self.problems = problems
            await self._drift(problems)
        elif self.cut:
            await g.uncut()
            self.cut = False
            self._record("recovered", ["all checks pass again; guests are back online"], cut=False)
        return problems

    async def _drift(self, problems: list[str]) -> None:
        g = self.gateway
        self.drifts += 1
        if not self.cut:
            await g.cut("; ".join(problems))
            self.cut = True
            self._record("drift", problems, cut=True)
        await g.repair()

    def _record(self, what: str, problems: list[str], *, cut: bool) -> None:
        details = {"integrity": what, "problems": problems, "cut": cut}
        self.gateway.emit(
            Event(
                kind=Kind.INTEGRITY,
                verdict="deny" if cut else None,
                reason=f"integrity.{what}",
                details=details,
            )
        )
        self._say(f"ALARM {what}: " + "; ".join(problems) + (" — guests cut off" if cut else ""))
        self.gateway.notify({"alarm": what, "problems": problems, "cut": cut, "ts": time.time()})

    @staticmethod
    def _say(text: str) -> None:
        sys.stderr.write(f"sandgate gateway: {text}\n")
        sys.stderr.flush()


Probe = Callable[[], Awaitable[list[str]]]


def watchdog_status(wd: Watchdog | None, interval: float | None) -> dict[str, Any]:
    """The integrity part of the daemon's status: is it watched, cut off, what drifted."""
    return {
        "watchdog": interval,
        "cut": bool(wd and wd.cut),
        "drifts": wd.drifts if wd else 0,
        "problems": wd.problems if wd else [],
        "last_check": wd.last_check if wd else None,
    }
