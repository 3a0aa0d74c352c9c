"""A small warm pool of guest namespaces, each with its link made and configured (issue 13).

Making a guest's link costs little work but much waiting: every link the kernel creates or
destroys takes the one rtnl lock, and a link's or a namespace's destruction holds it across an
RCU grace period (measured 2026-12-01, load 2-3: a veth with its peer made in the guest's
namespace 1 ms, moving a made link into another namespace 15-37 ms, a join's whole link step
8 ms when the kernel is idle and 27-31 ms right after the previous session's namespace went).
So the pool holds whole namespaces, never links to move: a runner takes one (``take_netns``)
before its session starts, and the join that names it finds the link ready.

An entry is made when a guest leaves (right after remove_guest's reply: sessions back to back
find the pool full), or a while after a take once the resolver is quiet, outside the join's
lock, on the daemon's netlink thread; its index is reserved from the moment it is chosen, so no
join takes it. Each namespace is fresh (``ns.create``) and used by one session only: the runner
removes it at the end, and the pair goes with it. Names are ``sg-<instance>-w<hex>`` (a
session's own are ``-s<hex>``), so ``sandgate cleanup`` treats a pooled namespace left by a
dead gateway as it treats a session's. Each untaken one is written down
(``<run dir>/warm/NAME``, before it is made): the daemon removes its own when it stops, and
``sweep`` what a killed daemon left (``manage.stop``, and a daemon starting where one died).
A taken one is its runner's: the gateway records the runner's pid as its owner before replying.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandgate.errors import SandgateError
from sandgate.net import ns

if TYPE_CHECKING:  # the compiler pulls in policy/ and pydantic; manage.stop imports sweep
    from sandgate.net.compile import GuestLink

NetlinkCall = Callable[..., Awaitable[Any]]
WARM_DIR = "warm"
# Seconds after a take or a join before making the next: made at once, it ran beside the
# runner's set-up and cost it more than the link saved (netns and mount work, the daemon's GIL).
REFILL_AFTER = 0.15
# Then it waits while the resolver answers more than QUIET_RATE questions a second (a window of
# QUIET_CHECK s), REFILL_LATEST s at most: an entry is 13-28 ms of the netlink thread's CPU
# (pyroute2, the GIL's), and 150 ms after a take it fell in the first 0.25 s of the command's
# questions in 10 of 16 cached-20k sessions timed thread by thread (issue 13, NOTES).
QUIET_RATE = 200.0
QUIET_CHECK = 0.1
REFILL_LATEST = 10.0


def sweep(run_dir: Path) -> list[str]:
    """Remove the untaken warm namespaces a daemon of this run dir left (it was killed);
    returns their names. Only names written down by the pool, and only ours (``sg-``)."""
    gone = []
    folder = run_dir / WARM_DIR
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        with contextlib.suppress(SandgateError):
            ns.remove(entry.name)
            gone.append(entry.name)
        entry.unlink(missing_ok=True)
    return gone


@dataclass(frozen=True)
class Warm:
    """One ready guest: its namespace (eth0 addressed and routed, lo up, the uid-log table in)
    and its link, whose gateway end is configured and up."""

    index: int
    link: GuestLink
    netns: str
    hold: bool = False  # the process hold's queue rules are in too (its join skips them)


class WarmPool:
    """Ready namespaces for the next joins. ``make(link, netns)`` builds one (blocking, run on
    the netlink thread through ``nl``), undoing its own part if it fails, and says whether the
    process hold's rules went in too; ``drop(link, netns)`` removes a made one nobody joined with.
    """

    def __init__(
        self,
        instance: str,
        run_dir: Path,
        size: int,
        free_index: Callable[[set[int]], int],
        make: Callable[[GuestLink, str], bool],
        drop: Callable[[GuestLink, str], None],
        link_for: Callable[[int], GuestLink],
        nl: NetlinkCall,
        own: Callable[[str, int], None] = lambda name, pid: None,
        activity: Callable[[], int] = lambda: 0,
    ) -> None:
        self.instance, self.size = instance, size
        self.folder = run_dir / WARM_DIR
        self._free_index, self._make, self._drop, self._link_for = free_index, make, drop, link_for
        self._nl, self._own = nl, own  # own: cleanup.own (not imported: cleanup finds manage)
        self.ready: list[Warm] = []
        self.taken: dict[str, Warm] = {}  # handed to a runner, its join not seen yet
        self.making: set[int] = set()
        self._forgetting: set[int] = set()  # handed out and gone: reserved until the link is
        self._tasks: set[asyncio.Task[None]] = set()
        self.failed: str | None = None  # the last failure to make one (refills stop until a take)
        self._activity = activity  # a count that grows with the work a refill would slow (DNS)
        self._due: asyncio.TimerHandle | None = None  # the pending refill_soon
        self._stopped = False  # the daemon stops (``stop``): never made again

    def reserved(self) -> set[int]:
        """Indexes no join may choose: ready, handed out, or being made."""
        taken = {w.index for w in self.taken.values()}
        return {w.index for w in self.ready} | taken | self.making | self._forgetting

    def take(self, owner: int | None = None) -> str | None:
        """A ready namespace for a runner, or None (pool empty or off: it makes its own).
        ``owner``: the runner's pid, recorded before the reply, so that if it dies before its
        own record, ``sandgate cleanup`` removes the namespace as any dead session's."""
        self._prune()
        if not self.ready:
            # Not refilled now: the makes would queue on the netlink thread ahead of this
            # runner's own link (its join then waited 55-111 ms, not ~5: 2026-12-07). Armed
            # instead, behind the join; a leave refills at once (``left``).
            self.refill_soon()
            return None
        warm = self.ready.pop(0)
        self.taken[warm.netns] = warm
        self.refill_soon()
        if owner is not None:
            self._own(warm.netns, owner)
        (self.folder / warm.netns).unlink(missing_ok=True)  # the runner's now, not ours
        self.failed = None
        return warm.netns

    def status(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "ready": [w.netns for w in self.ready],
            "taken": sorted(self.taken),
            "making": len(self.making),
            "failed": self.failed,
        }

    def claim(self, netns: str) -> Warm | None:
        """The entry a join names, once: None for a namespace the runner made itself."""
        return self.taken.pop(netns, None)

    def refill_soon(self, later: bool = False) -> None:
        """Refill once REFILL_AFTER has passed and then QUIET_CHECK with the resolver quiet
        (QUIET_RATE), REFILL_LATEST after that at the latest. One pending at a time: a take
        arms it, its join (``later``: the command starts now) moves it after itself."""
        loop = asyncio.get_running_loop()
        if self._due is not None:
            if not later:
                return
            self._due.cancel()
        deadline = loop.time() + REFILL_AFTER + REFILL_LATEST
        self._due = loop.call_later(REFILL_AFTER, self._when_quiet, None, 0.0, deadline)

    def left(self) -> None:
        """A guest has gone (remove_guest has answered): refill now. Its command is over, so a
        make disturbs no session's start or first questions, and sessions that come back to
        back (a suite, the startup bench) find the pool full: armed at each take and pushed
        back by each join, the refill never came while they did, and every fourth join made
        its own link."""
        self._cancel_due()
        self.refill()

    def _cancel_due(self) -> None:
        if self._due is not None:
            self._due.cancel()
            self._due = None

    def _when_quiet(self, count: int | None, since: float, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        now, now_count = loop.time(), self._activity()
        quiet = count is not None and now_count - count <= QUIET_RATE * (now - since)
        if quiet or now >= deadline:
            self._due = None
            self.refill()
            return
        self._due = loop.call_later(QUIET_CHECK, self._when_quiet, now_count, now, deadline)

    def refill(self) -> None:
        """Start making entries up to ``size`` (called after a reply: never on a join's path)."""
        if self.failed is not None or self._stopped:
            return
        self._prune()
        while len(self.ready) + len(self.making) < self.size:
            try:
                index = self._free_index(self.reserved())
            except SandgateError:
                return  # the guest pool is full: joins come first
            self.making.add(index)
            task = asyncio.ensure_future(self._fill(index))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _fill(self, index: int) -> None:
        link = self._link_for(index)
        netns = f"sg-{self.instance}-w{secrets.token_hex(3)}"
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.folder / netns).touch()  # before it exists: a crash while making it is swept
            hold = bool(await self._nl(self._make, link, netns))
        except Exception as exc:  # ``make`` undid its own part (it alone knows what it made)
            self.failed = str(exc)
            sys.stderr.write(f"sandgate gateway: no warm guest namespace ({exc})\n")
            (self.folder / netns).unlink(missing_ok=True)
            return
        finally:
            self.making.discard(index)
        self.ready.append(Warm(index, link, netns, hold))

    def _prune(self) -> None:
        """Forget handed-out namespaces whose runner removed them without joining (it died or
        failed first): their index is free again once their link is gone."""
        for name, warm in list(self.taken.items()):
            if not ns.exists(name):
                del self.taken[name]
                self._forgetting.add(warm.index)
                task = asyncio.ensure_future(self._forget(warm))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _forget(self, warm: Warm) -> None:
        try:
            with contextlib.suppress(Exception):
                await self._nl(self._drop, warm.link, warm.netns)
        finally:
            self._forgetting.discard(warm.index)

    def stop(self) -> None:
        """Make no more (the daemon stops: its guests' leaving must not refill, nor a take
        clear it as it clears a failure)."""
        self._cancel_due()
        self._stopped = True
        self.failed = "closed"

    async def close(self) -> None:
        """Remove every untaken namespace (the daemon stops); handed-out ones are their
        runners' to remove."""
        self.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while self.ready:
            warm = self.ready.pop()
            with contextlib.suppress(Exception):
                await self._nl(self._drop, warm.link, warm.netns)
                (self.folder / warm.netns).unlink(missing_ok=True)


__all__ = ["WARM_DIR", "Warm", "WarmPool", "sweep"]
