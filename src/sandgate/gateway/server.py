"""The gateway's event loop: rules, links, resolver, logs and the control socket.

Entered from ``gateway/daemon.py`` after the process has its own namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from sandgate.errors import SandgateError
from sandgate.events.schema import Event, FlowKey, Kind
from sandgate.events.store import Store
from sandgate.gateway import control, dnslogic, registry
from sandgate.gateway.config import GatewayConfig
from sandgate.gateway.logs.attribution import Attributor
from sandgate.gateway.logs.logreader import gateway_event, guest_flow, proto_name
from sandgate.gateway.logs.prochold import ProcessHold
from sandgate.gateway.proxy.credentials import load_secrets, sandbox_view
from sandgate.gateway.proxy.flow import ProxyGuest
from sandgate.gateway.proxy.server import EXPLICIT_PORT, Proxy
from sandgate.gateway.proxy.tlsgate import GateReader
from sandgate.gateway.resolver import GuestDNS, PinTags, Resolver
from sandgate.gateway.selfcheck import SelfCheck
from sandgate.gateway.watchdog import Watchdog
from sandgate.net import iptables, ns
from sandgate.net.compile import (
    GROUP_ACCEPT,
    GROUP_DROP,
    GROUP_GUEST,
    TABLE,
    GuestLink,
    Limits,
    Site,
    base_ruleset,
    guest_add,
    guest_remove,
    guest_uid_log,
    inspect_elements,
    pin_elements,
)
from sandgate.net.links import Plumber, guest_mac
from sandgate.net.nflog import NflogPacket, NflogSocket
from sandgate.net.nft import Nft, batch
from sandgate.policy.decide import Attempt, decide
from sandgate.policy.load import Policy, load_policy
from sandgate.policy.model import Mode, Protocol
from sandgate.policy.profile import Profile

T = TypeVar("T")

FLUSH_INTERVAL = 0.1
RESOLVE_TIMEOUT = 6.0
NFLOG_SETTLE = 0.015  # our NFLOG groups flush their batches after 10 ms (timeout 1 cs)


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
    hold: ProcessHold | None = None  # which process made each flow (prochold.py)
    started: float = field(default_factory=time.time)
    msg: dict[str, Any] = field(default_factory=dict)  # how it was added (for reloads, restarts)


class Gateway:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.pool = ipaddress.ip_network(cfg.guest_pool)
        self.public_override = tuple(ipaddress.ip_network(n) for n in cfg.public_override)
        self.limits = Limits(drop_log_rate=cfg.drop_log_rate, drop_log_burst=2 * cfg.drop_log_rate)
        self.guests: dict[str, Guest] = {}
        self.by_address: dict[str, Guest] = {}
        self.sites: dict[str, Site] = {}
        self.pending: list[Event] = []
        self.watchers: list[asyncio.Queue[Event]] = []
        self.stop = asyncio.Event()
        self.store = Store(cfg.store) if cfg.store else Store()
        self.attributor = Attributor(self._emit, self._infer)
        self.resolver = Resolver(list(cfg.upstream_dns), self._emit_flow, self._pin)
        self.proxy = Proxy(
            self._resolve_blocking, self._emit_from_thread, extra_ca=[Path(p) for p in cfg.extra_ca]
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.nft = Nft()
        # pyroute2's synchronous API runs an event loop of its own, which cannot run on the
        # thread of ours: every netlink call goes to this one thread (in our namespace too).
        self.netlink = ThreadPoolExecutor(1, thread_name_prefix="netlink")
        self.plumber: Plumber = self.netlink.submit(Plumber).result()
        self._readers: list[NflogSocket] = []
        self._lock = asyncio.Lock()
        self.gate: GateReader | None = None
        self.check = SelfCheck(self)
        self.watchdog: Watchdog | None = None
        self.draining: set[str] = set()  # removed guests whose links are still being deleted
        self._detaching: set[asyncio.Task[None]] = set()
        self.canary: Guest | None = None
        self.canary_worker: ns.NsThread | None = None

    # -- start and stop -----------------------------------------------------------------------

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        await self._nl(self.plumber.harden_gateway)
        cmds, sites = base_ruleset(
            self.cfg.uplink.ifname,
            self.pool,
            public_override=self.public_override,
            limits=self.limits,
        )
        self.nft.run(batch(*cmds))
        self.sites.update(sites)
        # The TLS gate: its reader is bound before forwarding starts, and its rule has no bypass.
        self.gate = GateReader(self._guest_profile, self._emit_flow_or_plain)
        iptables.install(self.gate.gate)
        loop.add_reader(self.gate.fileno(), self.gate.on_readable)
        await self._nl(self.plumber.make_uplink, self.cfg.uplink)
        # Rules first, forwarding second: never a moment of forwarding without a policy.
        await self._nl(self.plumber.enable_forwarding)
        for group in (GROUP_DROP, GROUP_ACCEPT):
            sock = NflogSocket(group, timeout_cs=1)
            self._readers.append(sock)
            loop.add_reader(sock.fileno(), self._on_gateway_log, sock)
        self.check.note()
        await self._reattach()
        if self.cfg.watchdog:
            await self._start_canary()
            self.watchdog = Watchdog(self.check, self.cfg.watchdog)
            self.watchdog.start()

        run_dir = self.cfg.run_dir
        sock_path = self.cfg.control_path
        sock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(sock_path.parent, 0o700)  # the control socket is root's only
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        server = await asyncio.start_unix_server(
            self._client, path=str(sock_path), limit=control.MAX_LINE
        )
        os.chmod(sock_path, 0o600)
        (run_dir / "daemon.pid").write_text(str(os.getpid()))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        ticker = asyncio.ensure_future(self._ticker())
        self._emit(Event(kind=Kind.NOTICE, details={"gateway": "up", "pid": os.getpid()}))
        sys.stdout.write(
            "READY " + json.dumps({"pid": os.getpid(), "control": str(sock_path)}) + "\n"
        )
        sys.stdout.flush()
        try:
            await self.stop.wait()
        finally:
            ticker.cancel()
            server.close()
            await self._shutdown()

    def _on_signal(self, sig: signal.Signals) -> None:
        sys.stderr.write(f"sandgate gateway {self.cfg.instance}: {sig.name}, stopping\n")
        self.stop.set()

    async def _shutdown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        await self._stop_canary()
        for name in list(self.guests):
            with contextlib.suppress(Exception):
                await self.remove_guest(name)
        if self._detaching:
            await asyncio.gather(*self._detaching, return_exceptions=True)
        await self._nl(self.plumber.disable_forwarding)
        self._emit(Event(kind=Kind.NOTICE, details={"gateway": "down"}))
        self._flush_events()
        self.resolver.upstream.close()
        for sock in self._readers:
            sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.cfg.control_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.cfg.run_dir / "daemon.pid").unlink()
        self.store.close()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            self.attributor.tick(time.monotonic())
            if self.gate is not None:
                self.gate.expire()
            self._flush_events()

    async def _nl(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.netlink, fn, *args)

    netlink_call = _nl

    def all_guests(self) -> list[Guest]:
        return [*self.guests.values(), *([self.canary] if self.canary else [])]

    def _profile_for(self, msg: dict[str, Any], policy: Any, link: GuestLink) -> Profile:
        if msg.get("canary"):
            # The canary: locked, no exemption; a denied probe must stay denied.
            return Profile(
                name="canary",
                mode=Mode.LOCKED,
                guest_pool=self.pool,
                gateway_address=link.gateway,
                public_override=self.public_override,
            )
        return cast(
            Profile,
            policy.profile(
                msg.get("profile"),
                mode=Mode(msg["mode"]) if msg.get("mode") else None,
                extra_allow=msg.get("allow", ()),
                extra_deny=msg.get("deny", ()),
                public_override=self.public_override,
                gateway_address=link.gateway,
                guest_pool=self.pool,
            ),
        )

    def _check_wiring(self, policy: Policy) -> None:
        """A guest's policy that asks for another wiring than this gateway's is refused: the
        daemon reads ``[gateway]`` once, at start (session/stack.py), and uses only that."""
        spec = policy.file.gateway
        given = spec.model_fields_set
        mine = {"guest_pool": str(self.pool), "upstream_dns": list(self.cfg.upstream_dns)}
        theirs = {"guest_pool": str(spec.pool), "upstream_dns": spec.upstream_dns}
        for key in sorted(given & mine.keys()):
            if theirs[key] != mine[key]:
                raise policy.gateway_problem(
                    key,
                    f"{key} = {theirs[key]} differs from the running gateway "
                    f"'{self.cfg.instance}' ({mine[key]}, from {self.cfg.policy or 'its start'})",
                    f"stop it (sandgate down --instance {self.cfg.instance}) and start it with "
                    "this policy (sandgate up --policy FILE), or drop the key",
                )

    # -- restarts, the canary, reloads ---------------------------------------------------------

    async def _reattach(self) -> None:
        """After a restart: give the guests that still exist their links and rules back.

        Their processes kept running while the gateway was gone (with no way out: their only
        link died with the old gateway's namespace); they get the same addresses again."""
        for name, index, msg in registry.load(self.cfg.run_dir):
            if not ns.exists(str(msg.get("netns"))):
                registry.forget(self.cfg.run_dir, name)
                continue
            try:
                await self.add_guest(msg, index=index)
            except Exception as exc:  # a guest that cannot come back must not stop the rest
                sys.stderr.write(f"sandgate gateway: could not re-attach {name}: {exc}\n")
                registry.forget(self.cfg.run_dir, name)
                continue
            self._emit(
                Event(
                    kind=Kind.GUEST,
                    session=msg.get("session"),
                    guest=name,
                    details={"reattached": True},
                )
            )

    async def _start_canary(self) -> None:
        name = f"sg-{self.cfg.instance}-canary"
        with contextlib.suppress(SandgateError):
            ns.remove(name)
        ns.create(name)
        index = self.pool.num_addresses // 4 - 1  # the pool's last /30
        await self.add_guest(
            {"netns": name, "canary": True, "session": None}, index=index, canary=True
        )
        self.canary_worker = ns.NsThread(name)

    async def _stop_canary(self) -> None:
        if self.canary_worker is not None:
            self.canary_worker.close()
            self.canary_worker = None
        if self.canary is not None:
            canary, self.canary = self.canary, None
            self.guests[canary.link.ifname] = canary
            with contextlib.suppress(Exception):
                await self.remove_guest(canary.link.ifname)
            with contextlib.suppress(SandgateError):
                ns.remove(canary.netns)

    def reload_policy(self, path: str) -> None:
        """Apply a changed policy file to its guests; raises (keeping the old rules) if invalid."""
        policy = load_policy(path)
        changed = []
        for guest in self.guests.values():
            if guest.msg.get("policy") != path:
                continue
            profile = self._profile_for(guest.msg, policy, guest.link)
            if profile != guest.profile:
                changed.append((guest, profile))
        for guest, profile in changed:
            cmds, sites = guest_add(guest.link, profile, self.limits)
            self.nft.run(
                batch(*guest_remove(guest.link, guest.sites.values(), guest.profile), *cmds)
            )
            guest.profile, guest.sites = profile, sites
            self.sites.update(sites)
            guest.dns.profile = profile
            guest.dns.profile_key = f"{guest.dns.profile_key}|reload{time.monotonic()}"
            if guest.proxy is not None:
                guest.proxy.profile = profile
            self._emit(
                Event(
                    kind=Kind.NOTICE,
                    session=guest.session,
                    guest=guest.link.ifname,
                    details={"policy": "reloaded", "path": path},
                )
            )
        self.check.note()

    def emit_event(self, event: Event) -> None:
        self._emit(event)

    def _integrity_status(self) -> dict[str, Any]:
        wd = self.watchdog
        return {
            "watchdog": self.cfg.watchdog,
            "cut": bool(wd and wd.cut),
            "drifts": wd.drifts if wd else 0,
            "problems": wd.problems if wd else [],
            "last_check": wd.last_check if wd else None,
        }

    def _snapshot(self) -> dict[str, Any]:
        """What an agent might change to get online, as the gateway holds it (session drift)."""
        return {
            "ruleset": self.check.ruleset_lines(),
            "digest": self.check.ruleset_digest(),
            "expected": self.check.expected_digest(),
            "resolver": {
                "upstream": list(self.resolver.upstream.servers),
                "cut": self.resolver.cut,
                "forward_everything": self.resolver.forward_everything,
            },
            "proxy": {"cut": self.proxy.cut},
            "forwarding": self.plumber.forwarding(),
        }

    def _fault(self, what: str) -> dict[str, Any]:
        """Break a part on purpose (tests only: needs SANDGATE_FAULTS=1 in the daemon's env)."""
        if os.environ.get("SANDGATE_FAULTS") != "1":
            raise SandgateError(
                "fault injection is off", "start the gateway with SANDGATE_FAULTS=1"
            )
        if what == "resolver":
            for guest in self.all_guests():
                _close_listeners(guest.dns)
        elif what == "proxy":
            for guest in self.all_guests():
                if guest.proxy is not None:
                    self.proxy.stop_guest(guest.proxy)
        elif what == "resolver-open":
            self.resolver.forward_everything = True
        else:
            raise SandgateError(f"unknown fault {what!r}", "resolver, proxy or resolver-open")
        return {"fault": what}

    # -- guests -------------------------------------------------------------------------------

    async def add_guest(
        self, msg: dict[str, Any], *, index: int | None = None, canary: bool = False
    ) -> dict[str, Any]:
        async with self._lock:
            if index is None:
                index = next(
                    i
                    for i in range(self.pool.num_addresses // 4 - 1)
                    if f"g{i}" not in self.guests and f"g{i}" not in self.draining
                )
            link = GuestLink.from_pool(self.pool, index, guest_mac(index))
            policy = load_policy(msg.get("policy"))
            self._check_wiring(policy)
            profile = self._profile_for(msg, policy, link)
            netns = msg["netns"]
            ns.check_ours(netns)
            # The process hold starts meanwhile (its iptables restore is a subprocess).
            loop = asyncio.get_running_loop()
            holding = (
                None
                if canary
                else loop.run_in_executor(
                    None, self._start_hold, link.ifname, netns, msg.get("pid"), loop
                )
            )
            undo: list[Any] = []
            try:
                await self._nl(self.plumber.attach_guest, link, netns)
                undo.append(lambda: self.netlink.submit(self.plumber.detach_guest, link).result())
                ns.run_in(netns, lambda: _apply_in_place(guest_uid_log()))
                cmds, sites = guest_add(link, profile, self.limits)
                self.nft.run(batch(*cmds))
                undo.append(
                    lambda: self.nft.run(batch(*guest_remove(link, sites.values(), profile)))
                )
                key = "|".join(
                    map(
                        str,
                        (
                            policy.source,
                            profile.name,
                            profile.mode,
                            msg.get("allow"),
                            msg.get("deny"),
                        ),
                    )
                )
                dns = GuestDNS(link, msg.get("session"), profile, key)
                await self.resolver.start_guest(dns)
                undo.append(lambda: _close_listeners(dns))
                secrets = load_secrets(profile.secrets, msg.get("session"))
                pg = ProxyGuest(link, msg.get("session"), profile, secrets)
                self.proxy.start_guest(pg)
                undo.append(lambda: self.proxy.stop_guest(pg))
                uidlog = NflogSocket.in_netns(ns.path(netns), GROUP_GUEST, qthresh=1, timeout_cs=1)
                undo.append(uidlog.close)
                hold = await holding if holding is not None else None
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
                msg.get("session"),
                profile,
                sites,
                dns,
                msg.get("uid"),
                uidlog,
                pg,
                hold,
                msg=dict(msg),
            )
            asyncio.get_running_loop().add_reader(uidlog.fileno(), self._on_guest_log, guest)
            self.sites.update(sites)
            self.check.note()
            if canary:
                self.canary = guest
                return {"guest": link.ifname, "address": str(link.guest)}
            self.guests[link.ifname] = guest
            self.by_address[str(link.guest)] = guest
            self.check.remember_policy(msg.get("policy"))
            registry.save(self.cfg.run_dir, link.ifname, index, msg)
        self._emit(
            Event(
                kind=Kind.GUEST,
                session=guest.session,
                guest=link.ifname,
                details={
                    "joined": True,
                    "profile": profile.name,
                    "mode": str(profile),
                    "address": str(link.guest),
                },
            )
        )
        return {
            "guest": link.ifname,
            "index": index,
            "address": str(link.guest),
            "gateway": str(link.gateway),
            "profile": profile.name,
            "mode": str(profile),
            "policy": policy.source,
            "proxy": f"http://{link.gateway}:{EXPLICIT_PORT}",
            "guest_pool": str(self.pool),
            "ca": self.proxy.ca_cert_pem().decode(),
            "secrets": sandbox_view(secrets),
            "model_hosts": profile.model_hosts(),
        }

    async def remove_guest(self, name: str, quiet_since: float | None = None) -> dict[str, Any]:
        guest = self.guests.get(name)
        if guest is None:
            raise SandgateError(f"no guest {name!r} on this gateway")
        t = _Phases()
        # The last packets' log records arrive within NFLOG_SETTLE; a caller that knows when
        # the guest went quiet (its processes were killed) saves the part already waited.
        quiet = time.time() - quiet_since if quiet_since is not None else 0.0
        if quiet < NFLOG_SETTLE:
            await asyncio.sleep(NFLOG_SETTLE - max(0.0, quiet))
        t.mark("settle")
        for sock in self._readers:
            self._on_gateway_log(sock)
        if guest.uidlog is not None:
            self._on_guest_log(guest)
        self.attributor.flush(name, time.monotonic())
        t.mark("logs")
        counters = self._counters(guest)
        t.mark("counters")
        async with self._lock:
            loop = asyncio.get_running_loop()
            if guest.uidlog is not None:
                loop.remove_reader(guest.uidlog.fileno())
                guest.uidlog.close()
            if guest.hold is not None:
                await loop.run_in_executor(None, guest.hold.stop)
            t.mark("hold")
            await self.resolver.stop_guest(guest.dns)
            t.mark("resolver")
            if guest.proxy is not None:
                await asyncio.get_running_loop().run_in_executor(
                    None, self.proxy.stop_guest, guest.proxy
                )
            t.mark("proxy")
            with contextlib.suppress(SandgateError):
                self.nft.run(batch(*guest_remove(guest.link, guest.sites.values(), guest.profile)))
            t.mark("rules")
            self._forget_inspected(guest.link.ifname)
            del self.guests[name]
            self.by_address.pop(str(guest.link.guest), None)
            registry.forget(self.cfg.run_dir, name)
            self.check.note()
        # Deleting a veth waits out an RCU grace period (~20 ms). The guest's rules are gone
        # (its traffic meets the default drop), so the link goes after the reply; its slot stays
        # taken until then.
        self.draining.add(name)
        task = asyncio.create_task(self._detach(guest))
        self._detaching.add(task)
        task.add_done_callback(self._detaching.discard)
        self._emit(
            Event(
                kind=Kind.GUEST,
                session=guest.session,
                guest=name,
                details={"joined": False, "counters": counters},
            )
        )
        self._flush_events()
        t.mark("events")
        return {"guest": name, "counters": counters, "timing_ms": t.ms}

    async def _detach(self, guest: Guest) -> None:
        try:
            async with self._lock:
                # The runner may delete the guest's namespace meanwhile, which takes the link
                # with it: a link already gone is fine.
                with contextlib.suppress(Exception):
                    await self._nl(self.plumber.detach_guest, guest.link)
                self.check.note()
        finally:
            self.draining.discard(guest.link.ifname)

    def _counters(self, guest: Guest) -> dict[str, dict[str, Any]]:
        """Exact per-site packet counts for one guest (the logs may be rate-limited)."""
        out: dict[str, dict[str, Any]] = {}
        for family in ("inet", "netdev"):
            try:
                listing = self.nft.run({"nftables": [{"list": {"counters": {"family": family}}}]})
            except SandgateError:
                continue
            for item in (listing or {}).get("nftables", []):
                c = item.get("counter")
                if not c or c.get("table") != TABLE:
                    continue
                for site in guest.sites.values():
                    if site.counter == c["name"] and c.get("packets"):
                        out[site.prefix] = {
                            "packets": c["packets"],
                            "verdict": site.verdict,
                            "reason": site.reason,
                            "rule": site.rule,
                        }
        return out

    # -- logs -----------------------------------------------------------------------------------

    def _on_gateway_log(self, sock: NflogSocket) -> None:
        for pkt in sock.read():
            site = self.sites.get(pkt.prefix)
            if site is None:
                continue
            key, event = gateway_event(pkt, site, self._guest_of)
            if key is None:
                self._emit(event)
            else:
                self.attributor.submit(key, event, time.monotonic())

    def _on_guest_log(self, guest: Guest) -> None:
        if guest.uidlog is None:
            return
        for pkt in guest.uidlog.read():
            self._sender(guest, pkt)

    def _sender(self, guest: Guest, pkt: NflogPacket) -> None:
        key, uid = guest_flow(guest.link.ifname, pkt)
        self._flow_sender(key, uid)

    def _flow_sender(self, key: FlowKey, uid: int | None, **extra: object) -> None:
        """A guest-side record of a new flow: its uid (uid log), its process (the hold)."""
        now = time.monotonic()
        self.attributor.sender(key, uid, now, **extra)
        guest = self.guests.get(key[0])
        gateway = str(guest.link.gateway) if guest is not None else None
        if key[4] == 53 and key[1] in ("udp", "tcp") and gateway and key[3] != gateway:
            # A DNS packet to another server is redirected: the resolver sees it at the gateway.
            alias: FlowKey = (key[0], key[1], key[2], gateway, 53)
            self.attributor.sender(alias, uid, now, **extra)

    def _start_hold(
        self, guest: str, netns: str, root_pid: int | None, loop: asyncio.AbstractEventLoop
    ) -> ProcessHold | None:
        """The process hold of a guest (on a worker thread); without it (no iptables, an odd
        kernel) only uids are known, which is said and is no reason to refuse the guest."""

        def report(key: FlowKey, uid: int | None, process: dict[str, Any] | None) -> None:
            extra = {"process": process} if process is not None else {}
            loop.call_soon_threadsafe(lambda: self._flow_sender(key, uid, **extra))

        hold = ProcessHold(guest, netns, report, root_pid)
        try:
            hold.start()
        except (SandgateError, OSError) as exc:
            sys.stderr.write(f"sandgate gateway: no process attribution for {guest}: {exc}\n")
            return None
        return hold

    def _forget_inspected(self, ifname: str) -> None:
        """The next guest on this link must not inherit this one's inspected addresses."""
        try:
            listing = self.nft.run(
                {
                    "nftables": [
                        {"list": {"set": {"family": "inet", "table": TABLE, "name": "inspect4"}}}
                    ]
                }
            )
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
                self.nft.run(
                    batch(
                        {
                            "delete": {
                                "element": {
                                    "family": "inet",
                                    "table": TABLE,
                                    "name": "inspect4",
                                    "elem": elems,
                                }
                            }
                        }
                    )
                )

    def _guest_profile(self, address: str) -> tuple[str, str | None, Profile] | None:
        guest = self.by_address.get(address)
        return (guest.link.ifname, guest.session, guest.profile) if guest else None

    def _emit_flow_or_plain(self, key: FlowKey | None, event: Event) -> None:
        if key is None:
            self._emit(event)
        else:
            self._emit_flow(key, event)

    def _guest_of(self, address: str | None) -> tuple[str, str | None] | None:
        guest = self.by_address.get(address or "")
        return (guest.link.ifname, guest.session) if guest else None

    def _infer(self, key: FlowKey, uid: int | None, ts: float) -> Event | None:
        """A flow the guest sent that the gateway did not report (its log was rate-limited)."""
        guest = self.guests.get(key[0])
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
        base = Event(
            kind=Kind.CONN,
            session=guest.session,
            guest=name,
            src=str(guest.link.guest),
            dst=dst,
            port=port,
            protocol=proto,
        )
        if d.allowed:
            # Every accepted flow is logged at the gateway; an allowed flow it never logged never
            # reached it (dropped at the link, or failed inside the guest). Claim nothing.
            return dataclasses.replace(
                base, reason="unseen", details={"inferred": True, "sport": sport, "would_be": d.key}
            )
        return dataclasses.replace(
            base,
            verdict=d.verdict.value,
            rule=d.rule_ref,
            reason=d.key,
            details={"inferred": True, "sport": sport},
        )

    def _pin(
        self, dns: GuestDNS, addresses: tuple[str, ...], ttl: int, tags: PinTags, inspect: bool
    ) -> None:
        """Before the guest hears an answer: put its addresses into the pin sets the policy
        names (policy/pins.py), and send TLS to them through the proxy when the name is
        inspected. One transaction."""
        cmds = pin_elements(dns.link, addresses, ttl, tags, self.limits)
        if inspect:
            cmds.append(inspect_elements(dns.link, addresses, ttl, self.limits))
        if cmds:
            self.nft.run(batch(*cmds))

    # -- the proxy's needs (it runs on threads) ------------------------------------------------

    def _resolve_blocking(self, name: str) -> list[ipaddress.IPv4Address]:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._resolve_a(name), self._loop)
        try:
            return future.result(RESOLVE_TIMEOUT)
        except (TimeoutError, OSError):
            return []

    async def _resolve_a(self, name: str) -> list[ipaddress.IPv4Address]:
        query = dnslogic.address_query(name, self.resolver.upstream.new_id())
        try:
            reply = await self.resolver.upstream.ask(query)
        except (TimeoutError, OSError):
            return []
        return dnslogic.a_records(reply)

    def _emit_from_thread(self, key: FlowKey | None, event: Event) -> None:
        assert self._loop is not None
        if key is None:
            self._loop.call_soon_threadsafe(self._emit, event)
        else:
            self._loop.call_soon_threadsafe(self._emit_flow, key, event)

    # -- events -------------------------------------------------------------------------------

    def _emit_flow(self, key: FlowKey, event: Event) -> None:
        self.attributor.submit(key, event, time.monotonic())

    def _emit(self, event: Event) -> None:
        if self.canary is not None and event.guest == self.canary.link.ifname:
            return  # the canary's own traffic is the watchdog's business, not the log's
        if event.session is None and event.guest in self.guests:
            event = dataclasses.replace(event, session=self.guests[event.guest].session)
        if event.category is None and event.kind is Kind.CONN:
            from sandgate.events.schema import category_of

            event = dataclasses.replace(
                event, category=category_of(event.protocol, event.port).value
            )
        self.pending.append(event)
        for q in self.watchers:
            q.put_nowait(event)

    def _flush_events(self) -> None:
        if not self.pending:
            return
        events, self.pending = self.pending, []
        try:
            self.store.add(events)
        except Exception:  # the store must never take the gateway down
            traceback.print_exc(file=sys.stderr)

    # -- control ------------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    msg = control.decode(line)
                    op = msg.get("op")
                    if op == "watch":
                        await self._watch(writer)
                        return
                    reply = {"ok": True, **await self._dispatch(str(op), msg)}
                except SandgateError as exc:
                    reply = {"ok": False, "error": exc.message, "fix": exc.fix}
                except (ValueError, KeyError, TypeError) as exc:
                    reply = {"ok": False, "error": f"bad request: {exc}"}
                except Exception as exc:  # report, never die of one request
                    traceback.print_exc(file=sys.stderr)
                    reply = {"ok": False, "error": f"internal error: {exc}"}
                writer.write(control.encode(reply))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _dispatch(self, op: str, msg: dict[str, Any]) -> dict[str, Any]:
        if op == "ping":
            return {"pid": os.getpid(), "guests": len(self.guests)}
        if op == "add_guest":
            return await self.add_guest(msg)
        if op == "remove_guest":
            since = msg.get("quiet_since")
            return await self.remove_guest(
                str(msg["guest"]), float(since) if isinstance(since, int | float) else None
            )
        if op == "flush":
            await asyncio.sleep(NFLOG_SETTLE)
            for sock in self._readers:
                self._on_gateway_log(sock)
            for guest in self.guests.values():
                self._on_guest_log(guest)
            self.attributor.tick(time.monotonic() + 10)
            self._flush_events()
            return {}
        if op == "status":
            return {
                "pid": os.getpid(),
                "guests": {
                    n: {
                        "address": str(g.link.guest),
                        "session": g.session,
                        "profile": g.profile.name,
                        "mode": str(g.profile),
                        "uid": g.uid,
                    }
                    for n, g in self.guests.items()
                },
                "questions": self.resolver.questions,
                "attributed": self.attributor.attributed,
                "unattributed": self.attributor.unattributed,
                "nflog_lost": sum(s.lost for s in self._readers),
                "integrity": self._integrity_status(),
            }
        if op == "check":
            # One watchdog round now (tests, `sandgate status` and session drift checks use it).
            if self.watchdog is None:
                self.watchdog = Watchdog(self.check, 0)  # not started: rounds on request only
            problems = await self.watchdog.check()
            return {"problems": problems, "integrity": self._integrity_status()}
        if op == "snapshot":
            return self._snapshot()
        if op == "reload":
            self.reload_policy(str(msg["policy"]))
            return {}
        if op == "fault":
            return self._fault(str(msg.get("what")))
        if op == "shutdown":
            self.stop.set()
            return {}
        raise SandgateError(f"unknown control op {op!r}")

    async def _watch(self, writer: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[Event] = asyncio.Queue()
        self.watchers.append(q)
        try:
            while True:
                event = await q.get()
                writer.write(control.encode(event.as_json()))
                await writer.drain()
        finally:
            self.watchers.remove(q)


class _Phases:
    """Milliseconds per step of an operation (returned to the caller; the bench prints them)."""

    def __init__(self) -> None:
        self._last = time.perf_counter()
        self.ms: dict[str, float] = {}

    def mark(self, step: str) -> None:
        now = time.perf_counter()
        self.ms[step] = round((now - self._last) * 1000, 2)
        self._last = now


def _stop_hold(done: asyncio.Future[ProcessHold | None]) -> None:
    """A hold that finished starting after its guest failed: stop it."""
    if not done.cancelled() and done.exception() is None and (hold := done.result()):
        threading.Thread(target=hold.stop, daemon=True).start()


def _close_listeners(dns: GuestDNS) -> None:
    if dns.udp is not None:
        dns.udp.close()
    if dns.tcp is not None:
        dns.tcp.close()


def _apply_in_place(cmds: list[dict[str, Any]]) -> None:
    nft = Nft()
    try:
        nft.run(batch(*cmds))
    finally:
        nft.close()


def run(config_path: str) -> int:
    cfg = GatewayConfig.load(Path(config_path).read_text())
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = asyncio.new_event_loop

    async def main() -> None:
        await Gateway(cfg).serve()

    try:
        # uvloop for our loop only: the default policy stays, so pyroute2's own loops
        # (which open netlink sockets uvloop cannot) are plain asyncio ones.
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main())
    except SandgateError as exc:
        sys.stderr.write(f"sandgate gateway: {exc}\n")
        return 1
    return 0


__all__ = ["Gateway", "proto_name", "run"]
