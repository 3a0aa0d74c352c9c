"""A guest's life on the gateway: joining (link, rules, resolver, proxy, logs, process hold, in
that order, undone in reverse if any step fails), policy reloads, leaving, re-attaching after a
restart, and the watchdog's canary.

What a guest may do is its profile's, made once here from the guest's policy file and the
gateway's own wiring (its pool, its test world): ``policy.profile(...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandgate import cleanup
from sandgate.errors import SandgateError
from sandgate.events.schema import Event, FlowKey, Kind
from sandgate.events.store import home_of
from sandgate.gateway import heap, registry
from sandgate.gateway.approvals import Approvals
from sandgate.gateway.config import GatewayConfig
from sandgate.gateway.dns.resolver import GuestDNS, PinTags, Resolver
from sandgate.gateway.guests import Guest, GuestTable
from sandgate.gateway.hostlo import HostLoopback, unserved
from sandgate.gateway.logfeed import LogFeed
from sandgate.gateway.logs.prochold import HOLD_QUEUE, ProcessHold, ProcessTable
from sandgate.gateway.pool import Warm, WarmPool
from sandgate.gateway.proxy.credentials import load_secrets, sandbox_view
from sandgate.gateway.proxy.flow import ProxyGuest
from sandgate.gateway.proxy.server import EXPLICIT_PORT, Proxy
from sandgate.gateway.reload import denied_flows
from sandgate.gateway.selfcheck import SelfCheck
from sandgate.gateway.sink import EventSink
from sandgate.net import conntrack, iptables, ns
from sandgate.net.compile import (
    GROUP_GUEST,
    TABLE,
    GuestLink,
    Limits,
    Site,
    guest_add,
    guest_remove,
    guest_uid_log,
    inspect_elements,
    pin_elements,
    pin_elements6,
)
from sandgate.net.links import Plumber, guest_mac
from sandgate.net.nflog import NflogSocket
from sandgate.net.nft import CounterReader, Nft, batch
from sandgate.policy.load import BUILTIN, Policy, load_policy
from sandgate.policy.model import Mode
from sandgate.policy.profile import Profile

EXPOSE_LISTEN_GRACE = 5.0  # seconds a guest has to start listening on an exposed port
NFLOG_SETTLE = 0.015  # our NFLOG groups flush their batches after 10 ms (timeout 1 cs)
NetlinkCall = Callable[..., Awaitable[Any]]


class Lifecycle:
    def __init__(
        self,
        cfg: GatewayConfig,
        table: GuestTable,
        sink: EventSink,
        feed: LogFeed,
        nft: Nft,
        limits: Limits,
        sites: dict[str, Site],
        resolver: Resolver,
        proxy: Proxy,
        check: SelfCheck,
        netlink: ThreadPoolExecutor,
        plumber: Plumber,
        nl: NetlinkCall,
    ) -> None:
        self.cfg, self.table, self.sink, self.feed = cfg, table, sink, feed
        self.processes = ProcessTable()  # flow → executable, from the holds, for the proxy
        self._approvals: Approvals | None = None  # made on the first guest that asks
        self.nft, self.limits, self.sites = nft, limits, sites
        self.resolver, self.proxy, self.check = resolver, proxy, check
        self.netlink, self.plumber, self._nl = netlink, plumber, nl
        self.pool = table.pool
        self.public_override = tuple(ipaddress.ip_network(n) for n in cfg.public_override)
        self.host_addresses = tuple(ipaddress.ip_address(a) for a in cfg.host_addresses)
        self.hostlo = HostLoopback(cfg.hostlo_dir, cfg.host_loopback)
        # The self-check's lock: every change to the gateway's own rules and links is made
        # and noted under it, so no digest comparison sees one half made (selfcheck.py).
        self._lock = check.lock
        self._detaching: set[asyncio.Task[None]] = set()
        self._counter_reader: CounterReader | None = None  # made on the loop's thread
        self.canary_worker: ns.NsThread | None = None
        # Packets of sites deleted since start, per (profile, rule, verdict, reason).
        self.retired: dict[tuple[str, str | None, str, str], int] = {}
        self._joining: set[int] = set()  # indexes of joins under way
        # Ready namespaces with their links (pool.py); none on a gateway VM (handed links).
        warm = 0 if cfg.guest_links or cfg.uplink.kind == "handed" else cfg.warm_links
        self.warm = WarmPool(
            cfg.instance,
            cfg.run_dir,
            warm,
            # Not an index a join has chosen and not yet put in the table (it awaits meanwhile).
            lambda reserved: self.table.free_index(reserved | self._joining),
            self._make_warm,
            self._drop_warm,
            lambda i: GuestLink.from_pool(self.pool, i, guest_mac(i)),
            nl,
            cleanup.own,
            lambda: self.resolver.questions,  # a refill waits while questions come fast
        )

    # -- what a guest may do --------------------------------------------------------------------

    def profile_for(self, msg: dict[str, Any], policy: Policy, link: GuestLink) -> Profile:
        if msg.get("canary"):
            # The canary: locked, no exemption; a denied probe must stay denied.
            return Profile(
                name="canary",
                mode=Mode.LOCKED,
                guest_pool=self.pool,
                gateway_address=link.gateway,
                public_override=self.public_override,
                host_addresses=self.host_addresses,
            )
        profile = policy.profile(
            msg.get("profile"),
            mode=Mode(msg["mode"]) if msg.get("mode") else None,
            extra_allow=msg.get("allow", ()),
            extra_deny=msg.get("deny", ()),
            public_override=self.public_override,
            gateway_address=link.gateway,
            guest_pool=self.pool,
            host_addresses=self.host_addresses,
            ask=bool(msg.get("ask")),
            uplink_ipv6=self.cfg.uplink.has_ipv6,  # a wiring fact (issue 14 part 5)
        )
        return self._held_elsewhere(link, profile)

    def check_wiring(self, policy: Policy) -> None:
        """A guest's policy that asks for another wiring than this gateway's is refused: the
        daemon reads ``[gateway]`` once, at start (session/stack.py), and uses only that."""
        spec = policy.file.gateway
        mine = {"guest_pool": str(self.pool), "upstream_dns": list(self.cfg.upstream_dns)}
        theirs = {"guest_pool": str(spec.pool), "upstream_dns": spec.upstream_dns}
        for key in sorted(spec.model_fields_set & mine.keys()):
            if theirs[key] != mine[key]:
                raise policy.gateway_problem(
                    key,
                    f"{key} = {theirs[key]} differs from the running gateway "
                    f"'{self.cfg.instance}' ({mine[key]}, from {self.cfg.policy or 'its start'})",
                    f"stop it (sandgate down --instance {self.cfg.instance}) and start it with "
                    "this policy (sandgate up --policy FILE), or drop the key",
                )
        for port in policy.host_loopback_ports():
            if port not in self.cfg.host_loopback:
                raise policy.host_loopback_problem(
                    port,
                    f"host_loopback {port} is not relayed by the running gateway "
                    f"'{self.cfg.instance}' (it relays {list(self.cfg.host_loopback) or 'none'}, "
                    f"from {self.cfg.policy or 'its start'})",
                    f"stop it (sandgate down --instance {self.cfg.instance}) and start it with "
                    "this policy (sandgate up --policy FILE)",
                )

    async def _warn_unexposed(self, guest: Guest) -> None:
        """A notice for each exposed port nothing in the guest listens on, a while after it
        joined (its service needs a moment to start); LAN clients would meet its reset."""
        await asyncio.sleep(EXPOSE_LISTEN_GRACE)
        if self.table.get(guest.link.ifname) is not guest:
            return
        ports = [r.port for r in guest.profile.expose]
        address = str(guest.link.guest)
        loop = asyncio.get_running_loop()
        try:
            idle = await loop.run_in_executor(
                None,
                lambda: ns.run_in(
                    guest.netns,
                    lambda: unserved(ports, Path("/proc/thread-self/net"), (address,)),
                ),
            )
        except Exception:  # the guest left meanwhile
            return
        for port in idle:
            self.sink.emit(
                Event(
                    kind=Kind.NOTICE,
                    session=guest.session,
                    guest=guest.link.ifname,
                    details={
                        "warning": f"expose: nothing listens on port {port} of the guest "
                        f"({address}); LAN clients the rule names are let in and refused there",
                        "port": port,
                    },
                )
            )

    def _held_elsewhere(self, link: GuestLink, profile: Profile) -> Profile:
        """One uplink port leads to one guest: the first guest of an exposed profile holds its
        ports; another guest of that profile (a second session, prove's peer) joins without
        the ports already held, and says so in its join event."""
        held = {
            r.port
            for other in self.table
            if other.link.ifname != link.ifname
            for r in other.profile.expose
        }
        if not held & {r.port for r in profile.expose}:
            return profile
        return dataclasses.replace(
            profile, expose=tuple(r for r in profile.expose if r.port not in held)
        )

    # -- joining --------------------------------------------------------------------------------

    async def add(
        self, msg: dict[str, Any], *, index: int | None = None, canary: bool = False
    ) -> dict[str, Any]:
        t = _Phases()
        handed = msg.get("handed")  # a gateway VM's guest link: no namespace of ours
        # A namespace the runner took from the warm pool: its link is made already.
        warm = (
            None
            if handed or canary or index is not None
            else self.warm.claim(str(msg.get("netns")))
        )
        if warm is not None:  # no longer the pool's: reserved as a join's until it is done
            self._joining.add(warm.index)
        try:
            reply = await self._add(msg, index, canary, warm, t)
        except BaseException:
            if warm is not None:  # its link must not outlive the join: the index is free again
                with contextlib.suppress(Exception):
                    await self._nl(self.plumber.detach_guest, warm.link)
            raise
        finally:
            if warm is not None:
                self._joining.discard(warm.index)
            # The next warm one, once the runner's set-up and its first questions are past.
            self.warm.refill_soon(later=True)
        return reply

    async def _add(
        self,
        msg: dict[str, Any],
        index: int | None,
        canary: bool,
        warm: Warm | None,
        t: _Phases,
    ) -> dict[str, Any]:
        handed = msg.get("handed")
        async with self._lock:
            self.check.before_change()
            t.mark("lock")
            if warm is not None:
                index = warm.index
            elif index is None:
                index = self.table.free_index(self.warm.reserved() | self._joining)
            self._joining.add(index)  # a warm one's is already (add)
            try:
                link = (
                    GuestLink.handed(self.pool, index, str(handed))
                    if handed
                    else warm.link
                    if warm is not None
                    else GuestLink.from_pool(self.pool, index, guest_mac(index))
                )
                policy = load_policy(msg.get("policy"))
                self.check_wiring(policy)
                profile = self.profile_for(msg, policy, link)
                if profile.ask:
                    _ = self.approvals  # the resolver asks from now on (issue 14)
                netns = "" if handed else msg["netns"]
                if not handed:
                    ns.check_ours(netns)
                t.mark("policy")
                try:
                    guest = await self._join(msg, link, policy, profile, netns, canary, t, warm)
                finally:
                    self.check.note()  # joined, or undone: either way what the rules now are
                    t.mark("note")
                self.sites.update(guest.sites)
                if canary:
                    self.table.canary = guest
                    return {"guest": link.ifname, "address": str(link.guest)}
                self.table.add(guest)
                self.check.remember_policy(msg.get("policy"))
                if not handed:  # handed guests come back from the daemon's own configuration
                    registry.save(self.cfg.run_dir, link.ifname, index, msg)
                t.mark("table")
            finally:
                if warm is None:
                    self._joining.discard(index)
        self.sink.emit(
            Event(
                kind=Kind.GUEST,
                session=guest.session,
                guest=link.ifname,
                details={
                    "joined": True,
                    "profile": profile.name,
                    "mode": str(profile.mode),
                    "address": str(link.guest),
                    **({"exposed": [r.port for r in profile.expose]} if profile.expose else {}),
                },
            )
        )
        if profile.expose:
            task = asyncio.create_task(self._warn_unexposed(guest))
            self._detaching.add(task)
            task.add_done_callback(self._detaching.discard)
        return {
            "guest": link.ifname,
            "index": index,
            "address": str(link.guest),
            "gateway": str(link.gateway),
            "profile": profile.name,
            "mode": str(profile.mode),
            "policy": policy.source,
            "proxy": f"http://{link.gateway}:{EXPLICIT_PORT}",
            "guest_pool": str(self.pool),
            "host_addresses": [str(a) for a in self.host_addresses],
            "ipv6": str(link.guest6) if profile.uplink_ipv6 else None,  # issue 14 part 5
            "ca": self.proxy.ca_cert_pem().decode(),
            "secrets": sandbox_view(guest.proxy.secrets if guest.proxy else ()),
            "model_hosts": profile.model_hosts(),
            "host_loopback": [f"{link.gateway}:{p}" for p in _loopback_ports(profile)],
            # The file's profile, as the runner read it before: noexec and [limits] (so a
            # `run` loads no policy of its own, issue 13)
            **_session_settings(policy, profile.name),
            "warm": warm is not None,  # its namespace came from the warm pool (pool.py)
            "timing_ms": {**t.ms, "reply": t.since()},
        }

    async def _join(
        self,
        msg: dict[str, Any],
        link: GuestLink,
        policy: Policy,
        profile: Profile,
        netns: str,
        canary: bool,
        t: _Phases,
        warm: Warm | None = None,
    ) -> Guest:
        """Every part of a guest, in order; on any failure the parts made so far are undone."""
        loop = asyncio.get_running_loop()
        # The process hold starts meanwhile (its iptables restore is a subprocess). A handed
        # guest (a VM) has no namespace of ours to hold processes in: attributed by address.
        handed = bool(msg.get("handed"))
        holding = (
            None
            if canary or handed
            else loop.run_in_executor(
                None,
                self._start_hold,
                link.ifname,
                netns,
                msg.get("pid"),
                warm is not None and warm.hold,
            )
        )
        session = msg.get("session")
        undo: list[Callable[[], Any]] = []
        uidlog: NflogSocket | None = None
        try:
            if handed:
                await self._nl(self.plumber.adopt_guest, link)
                undo.append(lambda: self.netlink.submit(self.plumber.release_guest, link).result())
                t.mark("link")
            elif warm is not None:
                # Made before the join (pool.py), IPv6 as the uplink has it: so does the profile
                # (a wiring fact, profile_for). Anything else is refused, not patched up.
                if profile.uplink_ipv6 != self.cfg.uplink.has_ipv6:
                    raise SandgateError("a warm link made for another IPv6 wiring", "run again")
                t.mark("link")
            else:
                # The uid-log table goes into the guest's namespace while the link is made (it
                # names only lo): nothing runs in there before this join returns (issue 13).
                uid_log = loop.run_in_executor(None, _uid_log_in, netns, profile.uplink_ipv6)
                try:
                    await self._nl(self.plumber.attach_guest, link, netns, profile.uplink_ipv6)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await uid_log
                    raise
                undo.append(lambda: self.netlink.submit(self.plumber.detach_guest, link).result())
                t.mark("link")
                await uid_log
                t.mark("uid_log")
            cmds, sites = guest_add(link, profile, self.limits)
            self.nft.run(batch(*cmds))
            t.mark("rules")
            undo.append(lambda: self.nft.run(batch(*guest_remove(link, sites.values(), profile))))
            key = "|".join(
                map(
                    str,
                    (policy.source, profile.name, profile.mode, msg.get("allow"), msg.get("deny")),
                )
            )
            dns = GuestDNS(link, session, profile, key)
            await self.resolver.start_guest(dns)
            undo.append(lambda: Resolver.close_listeners(dns))
            t.mark("resolver")
            secrets = load_secrets(profile.secrets, session)
            pg = ProxyGuest(link, session, profile, secrets, self.processes.identity)
            if profile.ask:
                approvals = self.approvals
                pg.ask = lambda name: approvals.wait_blocking(link.ifname, session, name)
            self.proxy.start_guest(pg)
            undo.append(lambda: self.proxy.stop_guest(pg))
            self.hostlo.start_guest(link, _loopback_ports(profile))
            undo.append(lambda: self.hostlo.stop_guest(link))
            t.mark("proxy")
            if not handed:
                uidlog = NflogSocket.in_netns(ns.path(netns), GROUP_GUEST, qthresh=1, timeout_cs=1)
                undo.append(uidlog.close)
            hold = await holding if holding is not None else None
            t.mark("hold")
            if hold is not None:
                undo.append(hold.stop)
        except BaseException:
            for step in reversed(undo):
                with contextlib.suppress(Exception):
                    step()
            if holding is not None and not holding.done():
                holding.add_done_callback(_stop_hold)
            raise
        guest = Guest(
            link,
            netns,
            session,
            profile,
            sites,
            dns,
            msg.get("uid"),
            uidlog,
            pg,
            hold,
            msg=dict(msg),
        )
        if uidlog is not None:
            loop.add_reader(uidlog.fileno(), self.feed.read_guest, guest)
        return guest

    def _make_warm(self, link: GuestLink, netns: str) -> bool:
        """A warm pool entry (on the netlink thread): a fresh namespace, the link, the uid-log
        table, as a join without the pool makes them; and the process hold's queue rules, which
        a join otherwise installs with an iptables-restore (a subprocess: 5-15 ms of its
        add_guest, issue 13). Nothing runs in the namespace before its join starts the hold's
        reader, and the rules let packets by without one (``--queue-bypass``). True when the
        rules went in; without them the join installs them (or says why it cannot)."""
        if self.plumber.has_link(link.ifname):  # not ours to touch (nor to delete on failure)
            raise SandgateError(f"link {link.ifname} exists already")
        ipv6 = self.cfg.uplink.has_ipv6  # every guest's profile has it then (profile_for)
        ns.create(netns)
        try:
            self.plumber.attach_guest(link, netns, ipv6)
            _uid_log_in(netns, ipv6)
        except BaseException:
            with contextlib.suppress(Exception):
                self.plumber.detach_guest(link)  # made by the line above: the index is reserved
            with contextlib.suppress(Exception):
                ns.remove(netns)
            raise
        try:
            ns.run_in(netns, lambda: iptables.install_hold(HOLD_QUEUE))
        except (SandgateError, OSError):
            return False  # the join tries again, and says why it cannot
        return True

    def _drop_warm(self, link: GuestLink, netns: str) -> None:
        self.plumber.detach_guest(link)
        ns.remove(netns)

    def _start_hold(
        self, guest: str, netns: str, root_pid: int | None, rules_in: bool = False
    ) -> ProcessHold | None:
        """The process hold of a guest (on a worker thread); without it (no iptables, an odd
        kernel) only uids are known, which is said and is no reason to refuse the guest.
        ``rules_in``: its queue rules are in the namespace already (a warm one)."""
        loop = self.sink_loop

        def report(key: FlowKey, uid: int | None, process: dict[str, Any] | None) -> None:
            self.processes.put(key, process)  # for the proxy's process rules (issue 14)
            extra = {"process": process} if process is not None else {}
            loop.call_soon_threadsafe(lambda: self.feed.sender(key, uid, **extra))

        hold = ProcessHold(guest, netns, report, root_pid, rules_in=rules_in)
        try:
            hold.start()
        except (SandgateError, OSError) as exc:
            sys.stderr.write(f"sandgate gateway: no process attribution for {guest}: {exc}\n")
            return None
        return hold

    sink_loop: asyncio.AbstractEventLoop  # set by the daemon before the first guest

    # -- what an answer opens -------------------------------------------------------------------

    def pin(
        self, dns: GuestDNS, addresses: tuple[str, ...], ttl: int, tags: PinTags, inspect: bool
    ) -> int:
        """Before the guest hears an answer: put its addresses into the pin sets the policy
        names (policy/pins.py), and send TLS to them through the proxy when the name is
        inspected. One transaction. The seconds the kernel keeps them."""
        # AAAA answers (where the uplink has IPv6) join the rules' IPv6 pin sets; IPv6 TLS goes
        # to the proxy whatever the name (net/compile.py), so it needs no inspect element.
        v6 = tuple(a for a in addresses if ":" in a)
        addresses = tuple(a for a in addresses if ":" not in a)
        cmds = pin_elements(dns.link, addresses, ttl, tags, self.limits) if addresses else []
        if v6 and dns.profile.uplink_ipv6:
            cmds += pin_elements6(dns.link, v6, ttl, tags, self.limits)
        if inspect and addresses:
            cmds.append(inspect_elements(dns.link, addresses, ttl, self.limits))
        if cmds:
            self.nft.run(batch(*cmds))
        return self.limits.pin_timeout(ttl)

    # -- reloads --------------------------------------------------------------------------------

    def reload(self, path: str) -> dict[str, Any]:
        """Apply a changed policy file to its guests; raises (keeping the old rules) if invalid,
        or if it now asks for other wiring than the gateway's. Each changed guest's rules are
        swapped in one nftables batch; then its open flows the new profile refuses are cut,
        one event each. Says how many guests use the file, how many changed, how many flows
        were cut."""
        policy = load_policy(path)
        self.check_wiring(policy)
        using, changed = 0, []
        for guest in self.table:
            if not _same_file(guest.msg.get("policy"), path):
                continue
            using += 1
            profile = self.profile_for(guest.msg, policy, guest.link)
            if profile != guest.profile:
                changed.append((guest, profile))
        cut = 0
        for guest, profile in changed:
            names = self._swap(guest, profile)
            self.sink.emit(
                Event(
                    kind=Kind.NOTICE,
                    session=guest.session,
                    guest=guest.link.ifname,
                    details={"policy": "reloaded", "path": path},
                )
            )
            cut += self._cut_denied(guest, profile, names)
        self.check.note()
        return {"guests": using, "changed": len(changed), "cut": cut}

    def _swap(self, guest: Guest, profile: Profile) -> dict[str, set[str]]:
        """A guest's rules, pins, resolver and proxy moved to ``profile`` in one nftables
        batch; the names its resolver had answered (for cutting flows)."""
        before = self.counters(guest)
        cmds, sites = guest_add(guest.link, profile, self.limits)
        self.nft.run(batch(*guest_remove(guest.link, guest.sites.values(), guest.profile), *cmds))
        self._retire(guest.profile.name, before)
        guest.profile, guest.sites = profile, sites
        self.sites.update(sites)
        names = self.resolver.names(guest.dns)
        # New rules, new (empty) pin sets: nothing the resolver pinned or cached before
        # holds any more; its next answers pin again.
        self.resolver.forget(guest.dns.profile_key)
        guest.dns.pinned.clear()
        guest.dns.inspected.clear()
        guest.dns.profile = profile
        guest.dns.profile_key = f"{guest.dns.profile_key}|reload{time.monotonic()}"
        if guest.proxy is not None:
            guest.proxy.profile = profile
        if self.hostlo.ports(guest.link) != _loopback_ports(profile):
            self.hostlo.stop_guest(guest.link)
            self.hostlo.start_guest(guest.link, _loopback_ports(profile))
        return names

    # -- approvals (issue 14) -------------------------------------------------------------------

    @property
    def approvals(self) -> Approvals:
        if self._approvals is None:
            self._approvals = Approvals(
                self.sink_loop, self._grant, self.sink.emit, self._overlay_for
            )
            self.resolver.asks = lambda g, name, done: (
                self._approvals is not None
                and (self._approvals.ask(g.link.ifname, g.session, name, done))
            )
        return self._approvals

    def _grant(self, link: str, rule: str, name: str) -> None:
        """An approved name: the guest's own profile gains its rule (as --allow would)."""
        guest = self.table.by_link.get(link)
        if guest is None or rule in guest.msg.get("allow", ()):
            return
        guest.msg["allow"] = [*guest.msg.get("allow", ()), rule]
        profile = self.profile_for(guest.msg, load_policy(guest.msg.get("policy")), guest.link)
        self._swap(guest, profile)

    def _overlay_for(self, link: str) -> tuple[Path, str, str] | None:
        guest = self.table.by_link.get(link)
        if guest is None:
            return None
        policy = guest.msg.get("policy")
        stem = Path(policy).stem if policy else "default"
        extends = str(Path(policy).resolve()) if policy else BUILTIN
        # Beside the event store (SANDGATE_HOME): the gateway's, and the user's to review.
        home = home_of(self.cfg.store or None)
        return home / "approved" / f"{stem}.toml", extends, guest.profile.name

    def _cut_denied(self, guest: Guest, profile: Profile, names: dict[str, set[str]]) -> int:
        """Established flows outlive a rule swap (``ct state established`` accepts them): cut
        those the new profile refuses, with an event each."""
        try:
            # pyroute2's sync sockets run an event loop of their own: not on this one's thread.
            open_flows = self.netlink.submit(
                conntrack.flows, str(guest.link.guest), str(guest.link.guest6)
            ).result()
        except Exception as exc:
            print(f"sandgate: reading conntrack for {guest.link.ifname}: {exc}", file=sys.stderr)
            return 0
        netns = conntrack.netns_path(guest.netns)
        cut = 0
        for flow, decision in denied_flows(profile, open_flows, names):
            try:
                if not self.netlink.submit(conntrack.cut, flow, netns).result():
                    continue  # it ended on its own meanwhile
            except Exception as exc:
                print(f"sandgate: cutting {flow}: {exc}", file=sys.stderr)
                continue
            cut += 1
            self.sink.emit(
                Event.attempt(
                    Kind.CONN,
                    decision,
                    protocol=flow.proto,
                    port=flow.dport,
                    session=guest.session,
                    guest=guest.link.ifname,
                    src=flow.src,
                    dst=flow.dst,
                    details={"reload": True, "sport": flow.sport},
                )
            )
        return cut

    # -- leaving --------------------------------------------------------------------------------

    async def remove(self, name: str, quiet_since: float | None = None) -> dict[str, Any]:
        guest = self.table.get(name)
        if guest is None:
            raise SandgateError(f"no guest {name!r} on this gateway")
        t = _Phases()
        if self._approvals is not None:
            self._approvals.forget_guest(name)  # its waiters are refused at once
        # Its counters and events are final once every flow it started has met the gateway's
        # rules and those records are read: the barrier (logfeed.py ``barrier``) knows when,
        # mostly at once, where the kernel's log batches would wait 10 ms. A handed guest
        # (another machine: no uid log), or a barrier not met: its last records arrive within
        # NFLOG_SETTLE, and a caller that knows when the guest went quiet (its processes were
        # killed) saves the part waited.
        handed = bool(guest.msg.get("handed"))
        flushed = not handed and await self.feed.barrier(guest, NFLOG_SETTLE)
        if not flushed:
            quiet = time.time() - quiet_since if quiet_since is not None else 0.0
            if quiet < NFLOG_SETTLE:
                await asyncio.sleep(NFLOG_SETTLE - max(0.0, quiet))
        t.mark("settle")
        self.feed.read_all(guest)
        self.sink.attributor.flush(name, time.monotonic())
        t.mark("logs")
        counters = self.counters(guest)
        t.mark("counters")
        self._retire(guest.profile.name, counters)
        # From here the guest is gone for everyone who asks (status, site totals, a second
        # remove, the pool's free slots); its kernel objects and services follow after the
        # reply (``_leave``): the report needs its counters and events, not their undoing.
        self.table.draining.add(name)  # its slot stays taken until the link is deleted
        self.table.pop(name)
        registry.forget(self.cfg.run_dir, name)
        self.sink.emit(
            Event(
                kind=Kind.GUEST,
                session=guest.session,
                guest=name,
                details={"joined": False, "counters": counters},
            )
        )
        self.sink.flush()
        t.mark("events")
        task = asyncio.create_task(self._leave(guest, flushed))
        self._detaching.add(task)
        task.add_done_callback(self._detaching.discard)
        return {"guest": name, "counters": counters, "flushed": flushed, "timing_ms": t.ms}

    async def _leave(self, guest: Guest, flushed: bool) -> None:
        """What remove_guest undoes after its reply: the guest's logs, hold, resolver, proxy
        and rules, then its link. Its processes are gone and its counters read; until its
        rules go, what might still come from its address meets them as before (issue 13:
        ~3 ms a removal off the runner's wait, 2026-12-01)."""
        name = guest.link.ifname
        self.warm.left()
        try:
            async with self._lock:
                self.check.before_change()
                loop = asyncio.get_running_loop()
                if guest.uidlog is not None:
                    loop.remove_reader(guest.uidlog.fileno())
                    guest.uidlog.close()
                if guest.hold is not None and flushed:
                    guest.hold.stop(wait=False)  # the barrier saw every held packet go on
                elif guest.hold is not None:
                    await loop.run_in_executor(None, guest.hold.stop)
                await self.resolver.stop_guest(guest.dns)
                self.processes.forget(name)
                if guest.proxy is not None:
                    await loop.run_in_executor(None, self.proxy.stop_guest, guest.proxy)
                await loop.run_in_executor(None, self.hostlo.stop_guest, guest.link)
                with contextlib.suppress(SandgateError):
                    self.nft.run(
                        batch(*guest_remove(guest.link, guest.sites.values(), guest.profile))
                    )
                self._forget_inspected(name)
                self.check.note()
        except Exception as exc:  # said, never raised into nothing: the link still goes
            sys.stderr.write(f"sandgate gateway: removing {name}: {exc!r}\n")
        # Deleting a veth waits out an RCU grace period (~20 ms). The guest's rules are gone
        # (its traffic meets the default drop), so the link goes after the reply; its slot stays
        # taken until then.
        await self._detach(guest)

    async def _detach(self, guest: Guest) -> None:
        # Not under the lock: a veth's deletion waits out an RCU grace period (~20 ms), which
        # the next join must not wait for. Its slot stays taken (draining) until the link is
        # gone; no note(): the link's rules (its ingress chain too) went with its removal
        # batch, so deleting the link changes nothing the digest covers. The runner may delete
        # the guest's namespace meanwhile, which takes the link with it: gone already is fine.
        with contextlib.suppress(Exception):
            if guest.msg.get("handed"):  # handed to us: not ours to delete
                await self._nl(self.plumber.release_guest, guest.link)
            else:
                await self._nl(self.plumber.detach_guest, guest.link)
        # With its link gone nothing more comes from it: its tracked flows go before its slot,
        # and so its addresses, can be given to the next guest. If they cannot, the slot stays
        # taken rather than hand them on.
        addresses = [str(guest.link.guest), str(guest.link.guest6)]
        loop = asyncio.get_running_loop()
        try:
            # Not on the netlink worker: the dump walks the kernel's whole conntrack table
            # (~9 ms here, conntrack.py), which the next join's netlink calls must not wait for.
            await loop.run_in_executor(None, conntrack.forget, addresses)
        except Exception as exc:
            sys.stderr.write(f"sandgate gateway: forgetting the flows of {addresses}: {exc!r}\n")
            return
        self.table.draining.discard(guest.link.ifname)
        # What its join and leave freed goes back to the system (heap.py); off the loop.
        await loop.run_in_executor(None, heap.trim)

    async def remove_all(self) -> None:
        self.warm.stop()
        for name in [g.link.ifname for g in self.table]:
            with contextlib.suppress(Exception):
                await self.remove(name)
        if self._detaching:
            await asyncio.gather(*self._detaching, return_exceptions=True)
        await self.warm.close()

    def counters(self, guest: Guest) -> dict[str, dict[str, Any]]:
        """Exact per-site packet counts for one guest (the logs may be rate-limited)."""
        packets = self._guest_packets(guest)
        return {
            site.prefix: {
                "packets": packets[site.counter],
                "verdict": site.verdict,
                "reason": site.reason,
                "rule": site.rule,
            }
            for site in guest.sites.values()
            if packets.get(site.counter)
        }

    def _guest_packets(self, guest: Guest) -> dict[str, int]:
        """The packets of the guest's own counters, asked for by name (~0.1 ms, where a
        listing costs 1.2 ms and more with every guest); a listing if that fails. A name
        is asked in both families: the kernel answers the one that has it."""
        names = [(f, s.counter) for s in guest.sites.values() for f in ("inet", "netdev")]
        try:
            if self._counter_reader is None:
                self._counter_reader = CounterReader()
            found = self._counter_reader.packets(TABLE, names)
        except (OSError, ValueError) as exc:  # no answer, a refusal, a malformed answer
            sys.stderr.write(f"sandgate gateway: counters by name: {exc}; listing them\n")
            return self._counter_packets()
        out: dict[str, int] = {}
        for (_, name), packets in found.items():
            out[name] = out.get(name, 0) + packets
        return out

    def _counter_packets(self) -> dict[str, int]:
        """Every named counter of our tables (both families) with its packets. One listing of
        every family: a listing per family cost 2.2-4.3 ms against 1.2 (each fetches the
        kernel's tables and objects anew; 2026-12-01)."""
        out: dict[str, int] = {}
        try:
            listing = self.nft.run({"nftables": [{"list": {"counters": {}}}]})
        except SandgateError:
            return out
        for item in (listing or {}).get("nftables", []):
            c = item.get("counter")
            if c and c.get("table") == TABLE and c.get("family") in ("inet", "netdev"):
                out[c["name"]] = int(c.get("packets") or 0)
        return out

    def _retire(self, profile: str, counters: dict[str, dict[str, Any]]) -> None:
        """Fold the counts of sites about to be deleted into the totals, so that the totals
        `site_totals` reports only ever grow (Prometheus counters)."""
        for c in counters.values():
            key = (profile, c["rule"], c["verdict"], c["reason"])
            self.retired[key] = self.retired.get(key, 0) + int(c["packets"])

    def site_totals(self) -> list[dict[str, Any]]:
        """Exact packets per (profile, rule, verdict, reason) since the gateway started: the
        gateway-wide sites (profile ``gateway``), every guest's live sites, and those of guests
        that left or were reloaded. The watchdog's canary is not counted."""
        packets = self._counter_packets()
        totals = dict(self.retired)
        live = [("gateway", s) for s in self.sites.values() if s.guest is None]
        live += [(g.profile.name, s) for g in self.table for s in g.sites.values()]
        for profile, site in live:
            key = (profile, site.rule, site.verdict, site.reason)
            totals[key] = totals.get(key, 0) + packets.get(site.counter, 0)
        return [
            {"profile": p, "rule": r, "verdict": v, "reason": why, "packets": n}
            for (p, r, v, why), n in sorted(totals.items(), key=lambda kv: str(kv[0]))
        ]

    def _forget_inspected(self, ifname: str) -> None:
        """The next guest on this link must not inherit this one's inspected addresses."""
        target = {"family": "inet", "table": TABLE, "name": "inspect4"}
        try:
            listing = self.nft.run({"nftables": [{"list": {"set": target}}]})
        except SandgateError:
            return
        elems = []
        for item in (listing or {}).get("nftables", []):
            for elem in (item.get("set") or {}).get("elem", []):
                val = elem.get("elem", {}).get("val") if isinstance(elem, dict) else None
                concat = (val or {}).get("concat") if isinstance(val, dict) else None
                if concat and concat[0] == ifname:
                    elems.append({"concat": concat})
        if elems:
            with contextlib.suppress(SandgateError):
                self.nft.run(batch({"delete": {"element": {**target, "elem": elems}}}))

    # -- restarts and the canary ----------------------------------------------------------------

    async def reattach(self) -> None:
        """After a restart: give the guests that still exist their links and rules back.

        Their processes kept running while the gateway was gone (with no way out: their only
        link died with the old gateway's namespace); they get the same addresses again."""
        for name, index, msg in registry.load(self.cfg.run_dir):
            if not ns.exists(str(msg.get("netns"))):
                registry.forget(self.cfg.run_dir, name)
                continue
            try:
                await self.add(msg, index=index)
            except Exception as exc:  # a guest that cannot come back must not stop the rest
                sys.stderr.write(f"sandgate gateway: could not re-attach {name}: {exc}\n")
                registry.forget(self.cfg.run_dir, name)
                continue
            self.sink.emit(
                Event(
                    kind=Kind.GUEST,
                    session=msg.get("session"),
                    guest=name,
                    details={"reattached": True},
                )
            )

    async def start_canary(self) -> None:
        name = f"sg-{self.cfg.instance}-canary"
        with contextlib.suppress(SandgateError):
            ns.remove(name)
        ns.create(name)
        msg = {"netns": name, "canary": True, "session": None}
        await self.add(msg, index=self.table.canary_index(), canary=True)
        self.canary_worker = ns.NsThread(name)

    async def stop_canary(self) -> None:
        if self.canary_worker is not None:
            self.canary_worker.close()
            self.canary_worker = None
        canary = self.table.canary
        if canary is not None:
            self.table.canary = None
            self.table.add(canary)
            with contextlib.suppress(Exception):
                await self.remove(canary.link.ifname)
            with contextlib.suppress(SandgateError):
                ns.remove(canary.netns)


class _Phases:
    """Milliseconds per step of an operation (returned to the caller; the bench prints them)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def since(self) -> float:
        """Milliseconds since the last mark (not a mark itself)."""
        return round((time.perf_counter() - self._last) * 1000, 2)

    def mark(self, step: str) -> None:
        now = time.perf_counter()
        self.ms[step] = round((now - self._last) * 1000, 2)
        self._last = now


def _stop_hold(done: asyncio.Future[ProcessHold | None]) -> None:
    """A hold that finished starting after its guest failed: stop it."""
    if not done.cancelled() and done.exception() is None and (hold := done.result()):
        threading.Thread(target=hold.stop, daemon=True).start()


def _uid_log_in(netns: str, ipv6: bool) -> None:
    ns.run_in(netns, lambda: _apply_in_place(guest_uid_log(ipv6)))


def _apply_in_place(cmds: list[dict[str, Any]]) -> None:
    nft = Nft()
    try:
        nft.run(batch(*cmds))
    finally:
        nft.close_soon()  # freeing it waits ~11 ms in the kernel: not on the join's path


def _session_settings(policy: Policy, name: str) -> dict[str, Any]:
    """What the runner sets up around the sandbox from the file's profile ``name``: noexec
    writable places, and the ``[limits]`` table (unset ones: None). No such profile in the
    file (a profile made from flags): noexec and no limits, as the runner did itself."""
    spec = policy.file.profiles.get(name)
    if spec is None:
        return {"noexec": True, "limits": {"pids": None, "memory": None, "cpus": None}}
    return {"noexec": spec.noexec, "limits": dataclasses.asdict(spec.limits.limits())}


def _loopback_ports(profile: Profile) -> tuple[int, ...]:
    return tuple(sorted({p for r in profile.host_loopback() if (p := r.spec.host_loopback)}))


def _same_file(a: object, b: str) -> bool:
    """Whether a guest's policy path names the file ``b`` (written relative or through links)."""
    if not isinstance(a, str):
        return False
    return a == b or os.path.realpath(a) == os.path.realpath(b)


__all__ = ["Lifecycle"]
