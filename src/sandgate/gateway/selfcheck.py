"""The gateway's side of the watchdog (gateway/watchdog.py): probing itself, cutting guests off,
repairing from what it knows, and reloading policies without ever falling back to open.

Kept apart from server.py, which owns guests and the event loop; this module acts on them
through ``Daemon`` and ``GuestView``, the Protocols below of what it needs, so it never imports
the daemon (server.py's ``Gateway`` and ``Guest`` satisfy them; mypy checks that where
server.py builds its ``SelfCheck``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from sandgate.errors import SandgateError
from sandgate.events.schema import Event
from sandgate.gateway import integrity
from sandgate.gateway.config import GatewayConfig
from sandgate.gateway.dns.resolver import GuestDNS, Resolver
from sandgate.gateway.proxy.flow import ProxyGuest
from sandgate.gateway.proxy.server import Proxy
from sandgate.gateway.proxy.tlsgate import GateReader
from sandgate.net import iptables
from sandgate.net.compile import (
    TABLE,
    GuestLink,
    Limits,
    Site,
    base_ruleset,
    guest_add,
    guest_remove,
    inspect_elements,
    pin_elements,
)
from sandgate.net.links import Plumber
from sandgate.net.nft import TOUCHED_MAX, Commit, CommitMonitor, Nft, batch
from sandgate.net.ns import NsThread
from sandgate.policy.profile import Profile

T = TypeVar("T")
_LOST = -2  # the pid of the "commit" that stands for lost notifications
RULESET_LINES_MAX = 2000  # of a snapshot's answer; the control socket's replies are bounded
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class GuestView(Protocol):
    """What the self-check reads of one guest (server.py's ``Guest``)."""

    sites: dict[str, Site]  # replaced after a repair

    @property
    def link(self) -> GuestLink: ...
    @property
    def profile(self) -> Profile: ...
    @property
    def dns(self) -> GuestDNS: ...
    @property
    def proxy(self) -> ProxyGuest | None: ...
    @property
    def msg(self) -> dict[str, Any]: ...


class Daemon(Protocol):
    """What the self-check needs of the gateway daemon (server.py's ``Gateway``)."""

    @property
    def cfg(self) -> GatewayConfig: ...
    @property
    def pool(self) -> Network: ...
    @property
    def public_override(self) -> tuple[Network, ...]: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def sites(self) -> dict[str, Site]: ...
    @property
    def nft(self) -> Nft: ...
    @property
    def plumber(self) -> Plumber: ...
    @property
    def resolver(self) -> Resolver: ...
    @property
    def proxy(self) -> Proxy: ...
    @property
    def gate(self) -> GateReader | None: ...
    @property
    def canary(self) -> GuestView | None: ...
    @property
    def canary_worker(self) -> NsThread | None: ...
    @property
    def guests(self) -> Mapping[str, GuestView]: ...

    def all_guests(self) -> Sequence[GuestView]: ...
    def reload_policy(self, path: str) -> None: ...
    def emit_event(self, event: Event) -> None: ...
    async def netlink_call(self, fn: Callable[..., T], *args: Any) -> T: ...


class SelfCheck:
    def __init__(self, gw: Daemon) -> None:
        self.gw = gw
        self._expected = ""
        self._policy_mtimes: dict[str, float] = {}
        # Held by every change the gateway makes to its own rules and links (lifecycle.py: a
        # guest joining, leaving, its link going) until ``note()`` has recorded the result; the
        # digest comparisons (``settled``) and repairs hold it too. Without it a comparison made
        # while a join awaited its resolver saw the half-made guest as drift from outside: the
        # watchdog cut every guest off (questions refused, unlogged) and its repair re-made the
        # tables without the joining guest, whose packets then met ``deny.unknown_link``
        # (issue 11's soak: 5 of 100 concurrent sessions got no DNS answer).
        self.lock = asyncio.Lock()
        # Who commits to the gateway's namespace (net/nft.py's CommitMonitor): with it, a change
        # of our own is noted in O(1) (``_stale``: not yet hashed) and the digest is only
        # computed when someone else committed, or when a snapshot asks for it.
        self._monitor: CommitMonitor | None = None
        self._foreign: list[Commit] = []  # commits by others since the last verified digest
        self._lost = 0
        self._stale = False
        self._kernel_pid = -1

    # -- the ruleset ------------------------------------------------------------------------------

    def ruleset_digest(self) -> str:
        return integrity.live_digest(self.gw.nft)

    def ruleset_lines(self) -> list[str]:
        return integrity.ruleset_lines(self._listing())

    def _listing(self) -> list[dict[str, Any]]:
        listing = self.gw.nft.run({"nftables": [{"list": {"ruleset": {}}}]}) or {}
        return list(listing.get("nftables", []))

    def expected_digest(self) -> str:
        return self._expected

    def snapshot(self, verify: bool = False) -> dict[str, Any]:
        """What an agent might change to get online, as the gateway holds it (session drift).

        ``ruleset`` is empty while only the gateway has committed to its rules since they were
        last verified: with the commit monitor that needs no listing, which is what keeps a
        snapshot flat in the number of guests (at 100 guests the whole listing took ~100 ms on
        the loop and was more than a control reply may carry, 1 MiB). After another process's
        commit it holds what that commit changed and the chains it changed, as they are now.
        ``verify``: hash the rules now whatever the monitor says (``digest`` is then theirs)."""
        gw = self.gw
        digest, lines, listed = self._ruleset_now(verify)
        return {
            "ruleset": lines,
            "digest": digest,
            "expected": self._expected,
            "listed": listed,  # the rules were listed (hashed) for this answer
            "resolver": {
                "upstream": list(gw.resolver.upstream.servers),
                "cut": gw.resolver.cut,
                "forward_everything": gw.resolver.forward_everything,
            },
            "proxy": {"cut": gw.proxy.cut},
            "forwarding": gw.plumber.forwarding(),
        }

    def _ruleset_now(self, verify: bool = False) -> tuple[str, list[str], bool]:
        """The digest now, the lines that show a change from outside, and whether the rules
        were listed. Only our own commits since the last verified digest: the rules are the
        gateway's by construction (the kernel queues a commit's notification to our socket
        before the committer's call returns), so nothing is listed. Without the monitor, or
        after notifications were lost, every line is listed, as nothing can be vouched for."""
        self._drain()
        if self._monitor is not None and not self._foreign and not verify:
            return self._expected, [], False
        digest = self._verified_digest()
        if digest == self._expected:
            self._foreign.clear()  # it changed nothing the digest covers
            return digest, [], True
        if self._monitor is None or self._lost_since_verified():
            return digest, _capped(self.ruleset_lines()), True
        return digest, _capped(self._foreign_lines()), True

    def _lost_since_verified(self) -> bool:
        return any(c.pid == _LOST for c in self._foreign)

    def _foreign_lines(self) -> list[str]:
        """Each outside commit and what it changed, then every chain it changed as it is now."""
        lines: list[str] = []
        chains: dict[str, None] = {}
        for commit in self._foreign:
            lines.append(f"# committed by {commit.name or '?'} (pid {commit.pid})")
            for change in commit.touched:
                lines.append(f"#   {change}")
                what, _, _how = change.rpartition(": ")
                if what.startswith(("rule in chain ", "chain ")):
                    chains.setdefault(what.removeprefix("rule in "))
            if len(commit.touched) >= TOUCHED_MAX:
                lines.append(f"#   (and maybe more: the first {TOUCHED_MAX} changes are named)")
        for chain in chains:
            text = self.gw.nft.list_text(f"list {chain}")
            lines += text.splitlines() if text is not None else [f"# {chain}: gone"]
        return lines

    def watch_commits(self, loop: asyncio.AbstractEventLoop) -> None:
        """From now on, tell our own commits from others' (call after the first ``note()``).

        One commit of ours first (a chain made and deleted in one transaction: the rules do
        not change) to learn the pid the kernel gives us: in a pid namespace (a pod) it is not
        ``os.getpid()``. A kernel that sends no notification keeps the digest after every
        change, as before."""
        monitor = CommitMonitor()
        probe = {"family": "inet", "table": TABLE, "name": "sg_commit_probe"}
        self.gw.nft.run(batch({"add": {"chain": probe}}, {"delete": {"chain": probe}}))
        seen = monitor.read()
        if not seen:
            monitor.close()
            return
        self._kernel_pid = seen[-1].pid
        self._monitor = monitor
        loop.add_reader(monitor.fileno(), self._drain)

    def _ours(self, pid: int) -> bool:
        """A commit by this process: the loop's thread as the kernel names it, or a thread
        of ours (its id as this pid namespace sees it)."""
        if pid == self._kernel_pid or pid == os.getpid():
            return True
        return pid > 0 and os.path.exists(f"/proc/self/task/{pid}")

    def _drain(self) -> None:
        if self._monitor is None:
            return
        for commit in self._monitor.read():
            if not self._ours(commit.pid):
                self._foreign.append(commit)
        if self._monitor.overruns != self._lost:
            self._lost = self._monitor.overruns
            self._foreign.append(Commit(_LOST, "(commit notifications lost)"))

    def note(self) -> None:
        """The gateway changed its own rules: this is now what they must look like. With the
        commit monitor that costs nothing: the rules are hashed when a comparison needs it."""
        if self._monitor is None:
            self._expected = self.ruleset_digest()
            return
        self._drain()  # what came before our change is judged as before
        self._stale = True

    def before_change(self) -> None:
        """With the lock held, before a change of ours: commits by others since the last
        verified digest are judged now, while none of ours is mixed in. One that changed
        nothing the digest covers is forgotten; one that did stays, for the watchdog. Without
        this, a harmless outside commit followed by a join was drift (``drifted``: ours and
        theirs cannot be told apart), and the repair emptied the joining session's counters."""
        self._drain()
        pending = self._monitor is not None and self._foreign and not self._stale
        if pending and self.ruleset_digest() == self._expected:
            self._foreign.clear()

    def note_verified(self) -> None:
        """After a repair: the rules as they are now are the gateway's, whoever committed."""
        self._drain()
        self._foreign.clear()
        self._expected = self.ruleset_digest()
        self._stale = False

    def drifted(self) -> bool:
        """Whether someone other than the gateway changed its rules (hold ``settled()``)."""
        if self._monitor is None:
            return self.ruleset_digest() != self._expected
        self._drain()
        if not self._foreign:
            return False  # every commit since the last verified digest was our own
        if self._stale:
            return True  # another's commit among ours not yet hashed: cannot tell them apart
        if self.ruleset_digest() == self._expected:
            self._foreign.clear()  # it changed nothing the digest covers (a pinned address)
            return False
        return True

    def _verified_digest(self) -> str:
        """The digest now; when only we have committed since the last one, it is also what
        the rules must look like (``_expected``)."""
        self._drain()
        digest = self.ruleset_digest()
        self._drain()
        if self._monitor is not None and self._stale and not self._foreign:
            self._expected, self._stale = digest, False
        return digest

    def settled(self) -> asyncio.Lock:
        """Hold it to compare the ruleset with ``expected_digest()``: no change of the gateway's
        own is half made meanwhile."""
        return self.lock

    async def snapshot_settled(self, verify: bool = False) -> dict[str, Any]:
        async with self.lock:
            return self.snapshot(verify)

    # -- probes -----------------------------------------------------------------------------------

    async def probe_canary(self) -> list[str]:
        canary = self.gw.canary
        if canary is None or self.gw.canary_worker is None:
            return []
        worker = self.gw.canary_worker
        loop = asyncio.get_running_loop()
        cut = self.gw.resolver.cut
        denied = await loop.run_in_executor(None, worker.call, lambda: integrity.canary_denied(cut))
        return [f"canary: {denied}"] if denied else []

    async def probe_services(self) -> list[str]:
        canary, worker = self.gw.canary, self.gw.canary_worker
        if canary is None or worker is None:
            return []
        loop = asyncio.get_running_loop()
        gateway = str(canary.link.gateway)
        problems = []
        answered = await loop.run_in_executor(
            None, worker.call, lambda: integrity.canary_answered(gateway)
        )
        if answered:
            problems.append(f"resolver: {answered}")
        accepts = await loop.run_in_executor(
            None, worker.call, lambda: integrity.proxy_accepts(gateway, 3128)
        )
        if accepts:
            problems.append(f"proxy: {accepts}")
        return problems

    # -- policies ---------------------------------------------------------------------------------

    def policy_problems(self) -> list[str]:
        """Reload what changed on disk. A file that became unreadable or invalid keeps the last
        good policy in force, and is reported; it never turns anything open."""
        problems: list[str] = []
        for path in {g.msg.get("policy") for g in self.gw.guests.values()} - {None}:
            assert path is not None
            try:
                mtime = os.stat(path).st_mtime
            except OSError as exc:
                problems.append(
                    f"policy {path}: {exc.strerror}; the last good policy stays in force"
                )
                continue
            if self._policy_mtimes.setdefault(path, mtime) == mtime:
                continue
            self._policy_mtimes[path] = mtime
            try:
                self.gw.reload_policy(path)
            except SandgateError as exc:
                first = str(exc).splitlines()[0]
                problems.append(
                    f"policy {path} is invalid ({first}); the last good policy stays in force"
                )
        return problems

    def remember_policy(self, path: str | None) -> None:
        if path is not None and path not in self._policy_mtimes:
            with contextlib.suppress(OSError):
                self._policy_mtimes[path] = os.stat(path).st_mtime

    # -- cutting off and repairing ----------------------------------------------------------------

    async def cut(self, why: str) -> None:
        gw = self.gw
        gw.resolver.cut = gw.proxy.cut = True
        if gw.gate is not None:
            gw.gate.cut = True
        await gw.netlink_call(gw.plumber.disable_forwarding)

    async def uncut(self) -> None:
        gw = self.gw
        gw.resolver.cut = gw.proxy.cut = False
        if gw.gate is not None:
            gw.gate.cut = False
        await gw.netlink_call(gw.plumber.enable_forwarding, gw.cfg.uplink.has_ipv6)

    async def repair(self) -> None:
        """Re-apply every rule and restart every listener from what the gateway knows (under
        the lock: a guest joining meanwhile would lose its rules to the new tables)."""
        async with self.lock:
            await self._repair()

    async def _repair(self) -> None:
        gw = self.gw
        cmds, sites = base_ruleset(
            gw.cfg.uplink.ifname,
            gw.pool,
            public_override=gw.public_override,
            limits=gw.limits,
            ipv6=gw.cfg.uplink.has_ipv6,
        )
        gw.nft.run(batch(*cmds))
        gw.sites.update(sites)
        if gw.gate is not None:
            iptables.install(gw.gate.gate)
        for guest in gw.all_guests():
            await self._repair_guest(guest)
        self.note_verified()

    async def _repair_guest(self, guest: GuestView) -> None:
        gw = self.gw
        cmds, sites = guest_add(guest.link, guest.profile, gw.limits)
        with contextlib.suppress(SandgateError):
            gw.nft.run(batch(*guest_remove(guest.link, guest.sites.values(), guest.profile)))
        gw.nft.run(batch(*cmds))
        guest.sites = sites
        gw.sites.update(sites)
        # What the resolver pinned before the rules were lost, pinned again.
        repins: list[dict[str, Any]] = []
        now = time.monotonic()
        # Shortest first: one address of a pin group's set keeps the longest (a re-add sets
        # the kernel's timeout anew).
        for (address, tags), until in sorted(guest.dns.pinned.items(), key=lambda kv: kv[1]):
            left = int(until - now)  # the kernel's element had this long to live
            if left <= 0:
                continue
            repins += pin_elements(guest.link, [address], left, tags, gw.limits)
        for address, until in sorted(guest.dns.inspected.items(), key=lambda kv: kv[1]):
            if (left := int(until - now)) > 0:
                repins.append(inspect_elements(guest.link, [address], left, gw.limits))
        if repins:
            with contextlib.suppress(SandgateError):
                gw.nft.run(batch(*repins))
        if guest.dns.udp is None or guest.dns.udp.is_closing():
            await gw.resolver.start_guest(guest.dns)
        if guest.proxy is not None and not gw.proxy.running(guest.proxy):
            gw.proxy.stop_guest(guest.proxy)
            gw.proxy.start_guest(guest.proxy)

    # -- telling people ----------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        self.gw.emit_event(event)

    def notify(self, payload: dict[str, Any]) -> None:
        target = self.gw.cfg.notify
        if target:
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, integrity.alarm, target, payload)


def _capped(lines: list[str]) -> list[str]:
    if len(lines) <= RULESET_LINES_MAX:
        return lines
    return [*lines[:RULESET_LINES_MAX], f"# ({len(lines) - RULESET_LINES_MAX} more lines)"]


def inject_fault(what: str, guests: Sequence[GuestView], resolver: Resolver, proxy: Proxy) -> None:
    """Break a part on purpose, so a test sees the watchdog find it (SANDGATE_FAULTS=1 only)."""
    if os.environ.get("SANDGATE_FAULTS") != "1":
        raise SandgateError("fault injection is off", "start the gateway with SANDGATE_FAULTS=1")
    if what == "resolver":
        for guest in guests:
            resolver.close_listeners(guest.dns)
    elif what == "proxy":
        for guest in guests:
            if guest.proxy is not None:
                proxy.stop_guest(guest.proxy)
    elif what == "resolver-open":
        resolver.forward_everything = True
    elif what == "upstream":
        # The upstream resolver unreachable (`sandgate doctor`'s SERVFAIL): a loopback address
        # of the gateway's namespace where nothing listens, so no query leaves it.
        resolver.upstream.servers = ["127.0.0.1"]
    else:
        raise SandgateError(f"unknown fault {what!r}", "resolver, proxy, resolver-open or upstream")
