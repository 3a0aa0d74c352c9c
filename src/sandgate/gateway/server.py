"""The gateway daemon as a composition root: it builds the parts, wires them, serves the
control socket from a dispatch table, and owns the event loop.

Entered from ``gateway/daemon.py`` after the process has its own namespace. The parts:

* ``GuestTable`` (guests.py): who is on the gateway, by link and by address;
* ``EventSink`` (sink.py): where every event goes, joined with its flow's sender;
* ``Lifecycle`` (lifecycle.py): guests joining, leaving, reloading, the canary;
* ``LogFeed`` (logfeed.py): the kernel's logs into the sink;
* the resolver and the proxy (with the TLS gate), each handed the sink and lookups;
* ``SelfCheck`` and ``Watchdog``: the gateway checking and repairing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from sandgate.errors import SandgateError
from sandgate.events.store import Store
from sandgate.gateway import control, pool
from sandgate.gateway.collector import Passes, census
from sandgate.gateway.config import GatewayConfig
from sandgate.gateway.dns.resolver import Resolver
from sandgate.gateway.guests import Guest, GuestTable
from sandgate.gateway.handed import handed_links, own_listeners
from sandgate.gateway.lifecycle import NFLOG_SETTLE, Lifecycle
from sandgate.gateway.logfeed import LogFeed, inferred
from sandgate.gateway.logs.logreader import proto_name
from sandgate.gateway.proxy.lookup import Lookups
from sandgate.gateway.proxy.server import Proxy
from sandgate.gateway.proxy.tlsgate import GateReader
from sandgate.gateway.selfcheck import SelfCheck, inject_fault
from sandgate.gateway.sink import EventSink
from sandgate.gateway.watchdog import Watchdog, watchdog_status
from sandgate.net import iptables, ns
from sandgate.net.compile import Limits, Site, base_ruleset
from sandgate.net.handed import HEARTBEAT
from sandgate.net.handed import heartbeat as heartbeat_cmds
from sandgate.net.links import Plumber
from sandgate.net.nft import Nft, batch

T = TypeVar("T")
Op = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

FLUSH_INTERVAL = 0.1
SWITCH_INTERVAL = 0.0005  # seconds another thread may keep the GIL from the loop (serve)


class Gateway:
    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.pool = ipaddress.ip_network(cfg.guest_pool)
        self.public_override = tuple(ipaddress.ip_network(n) for n in cfg.public_override)
        self.limits = Limits(drop_log_rate=cfg.drop_log_rate, drop_log_burst=2 * cfg.drop_log_rate)
        self.sites: dict[str, Site] = {}
        self.table = GuestTable(self.pool)
        store = Store(cfg.store) if cfg.store else Store()
        self.sink = EventSink(
            store,
            self.table.session_of,
            self.table.is_canary,  # the canary's traffic is the watchdog's, not the log's
            lambda key, uid, ts: inferred(self.table, key, uid, ts),
            own_process=True,
        )
        self.feed = LogFeed(self.sink, self.sites, self.table)
        self.resolver = Resolver(list(cfg.upstream_dns), self.sink.flow, self._pin)
        self.sink.attributor.before.append(self.resolver.flush_log)  # its folded repeats
        self.proxy = Proxy(
            Lookups(self.resolver.answer_blocking),  # kept for the answer's TTL
            self.sink.from_thread,
            extra_ca=[Path(p) for p in cfg.extra_ca],
        )
        self.nft = Nft()
        # pyroute2's synchronous API runs an event loop of its own, which cannot run on the
        # thread of ours: every netlink call goes to this one thread (in our namespace too).
        self.netlink = ThreadPoolExecutor(1, thread_name_prefix="netlink")
        self.plumber: Plumber = self.netlink.submit(Plumber).result()
        self.gate: GateReader | None = None
        self.check = SelfCheck(self)
        self.watchdog: Watchdog | None = None
        self.guests_ = Lifecycle(
            cfg,
            self.table,
            self.sink,
            self.feed,
            self.nft,
            self.limits,
            self.sites,
            self.resolver,
            self.proxy,
            self.check,
            self.netlink,
            self.plumber,
            self._nl,
        )
        self.stop = asyncio.Event()
        self.collector = Passes()  # the collector's passes, for `metrics`
        self.ops: Mapping[str, Op] = {
            "ping": self._ping,
            "add_guest": self.guests_.add,
            "take_netns": self._take_netns,  # a warm guest namespace for add_guest (pool.py)
            "remove_guest": self._remove_guest,
            "flush": self._flush,
            "status": self._status,
            "metrics": self._metrics,
            "check": self._check,
            "snapshot": self._snapshot,
            "reload": self._reload,
            "approvals": self._approvals,  # issue 14: what waits for `sandgate approve`
            "approve": self._approve,
            "fault": self._fault,
            "shutdown": self._shutdown_op,
        }

    # -- what the self-check reads (selfcheck.Daemon) ---------------------------------------------

    @property
    def guests(self) -> Mapping[str, Guest]:
        return self.table.by_link

    @property
    def canary(self) -> Guest | None:
        return self.table.canary

    @property
    def canary_worker(self) -> ns.NsThread | None:
        return self.guests_.canary_worker

    def all_guests(self) -> list[Guest]:
        return self.table.everyone()

    def reload_policy(self, path: str) -> None:
        self.guests_.reload(path)

    def emit_event(self, event: Any) -> None:
        self.sink.emit(event)

    async def netlink_call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._nl(fn, *args)

    async def _nl(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.netlink, fn, *args)

    # -- start and stop -----------------------------------------------------------------------

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.sink.bind(loop)
        self.resolver.bind(loop)
        self.guests_.sink_loop = loop
        handed = self.cfg.handed
        ifnames = [name for name, _ in self.cfg.guest_links]
        if handed:
            problems = await self._nl(self.plumber.check_handed, [self.cfg.uplink.ifname, *ifnames])
            if problems:
                raise SandgateError("; ".join(problems), "nothing was applied; fix and start again")
        await self._nl(self.plumber.harden_gateway)
        # On a gateway VM the same base ruleset export gateway-vm writes (net/handed.py), with
        # the alive fence: the tables outlive this process there.
        cmds, sites = base_ruleset(
            self.cfg.uplink.ifname,
            self.pool,
            public_override=self.public_override,
            limits=self.limits,
            guest_ifnames=ifnames if handed else None,
            fence=handed,
            ipv6=self.cfg.uplink.has_ipv6,  # issue 14 part 5
        )
        self.nft.run(batch(*cmds))
        self.sites.update(sites)
        # The TLS gate: its reader is bound before forwarding starts, and its rule has no bypass.
        self.gate = GateReader(self.table.profile_at, self.sink.flow, ifaces=tuple(ifnames))
        iptables.install(self.gate.gate, allow_host=handed)
        loop.add_reader(self.gate.fileno(), self.gate.on_readable)
        await self._nl(self.plumber.make_uplink, self.cfg.uplink)
        if handed:
            await self._adopt_handed()
        # Rules first, forwarding second: never a moment of forwarding without a policy.
        await self._nl(self.plumber.enable_forwarding, self.cfg.uplink.has_ipv6)
        heartbeat = asyncio.ensure_future(self._heartbeat()) if handed else None
        self.feed.open(loop)
        self.check.note()
        self.check.watch_commits(loop)
        await self.guests_.reattach()
        # What a killed daemon of this instance left untaken, then this one's own.
        await self._nl(pool.sweep, self.cfg.run_dir)
        self.guests_.warm.refill()  # made while the rest starts and after, never on a join's path
        if self.cfg.watchdog:
            await self.guests_.start_canary()
            self.watchdog = Watchdog(self.check, self.cfg.watchdog)
            self.watchdog.start()
        server = await self._listen()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        ticker = asyncio.ensure_future(self._ticker())
        self.sink.notice(gateway="up", pid=os.getpid())
        # What start-up made (modules, the policy, ~50k objects) lives as long as the daemon:
        # out of the collector's sight, a full pass no longer walks it (~25 ms of loop stall
        # each, what the resolver's tail felt: issue 13).
        gc.collect()
        gc.freeze()
        self.collector.install()
        # The loop's other threads (the process holds, the netlink thread making warm
        # namespaces in pyroute2, the store's writer) take the GIL from it for up to a switch
        # interval each time they want it. 0.5 ms instead of CPython's 5: a session's first
        # 0.25 s of cached answers at 20k qps, p99 93 -> 43 ms (medians of 12 paired runs at
        # load 3-5), CPU a question the same (issue 13, 2026-12-02).
        sys.setswitchinterval(SWITCH_INTERVAL)
        ready = {"pid": os.getpid(), "control": str(self.cfg.control_path)}
        sys.stdout.write("READY " + json.dumps(ready) + "\n")
        sys.stdout.flush()
        try:
            await self.stop.wait()
        finally:
            ticker.cancel()
            if heartbeat is not None:
                heartbeat.cancel()
            server.close()
            await self._shutdown()

    async def _listen(self) -> asyncio.AbstractServer:
        sock_path = self.cfg.control_path
        sock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(sock_path.parent, 0o700)  # the control socket is root's only
        with contextlib.suppress(FileNotFoundError):
            sock_path.unlink()
        server = await asyncio.start_unix_server(
            lambda r, w: control.serve_client(r, w, self.ops, self.sink.watching),
            path=str(sock_path),
            limit=control.MAX_LINE,
        )
        os.chmod(sock_path, 0o600)
        (self.cfg.run_dir / "daemon.pid").write_text(str(os.getpid()))
        return server

    def _on_signal(self, sig: signal.Signals) -> None:
        sys.stderr.write(f"sandgate gateway {self.cfg.instance}: {sig.name}, stopping\n")
        self.stop.set()

    async def _shutdown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        await self.guests_.stop_canary()
        await self.guests_.remove_all()
        await self._nl(self.plumber.disable_forwarding)
        self.sink.notice(gateway="down")
        self.sink.flush()
        self.resolver.upstream.close()
        self.feed.close()
        for path in (self.cfg.control_path, self.cfg.run_dir / "daemon.pid"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.sink.close()

    async def _adopt_handed(self) -> None:
        """A gateway VM's guests, one per handed link, in slot order; then the proof that the
        resolver listens on guest links only (report 001's assertion), or no start at all."""
        for index, (ifname, profile) in enumerate(self.cfg.guest_links):
            msg = {"handed": ifname, "profile": profile, "policy": self.cfg.policy}
            await self.guests_.add({**msg, "session": None}, index=index)
        allowed = {str(g.link.gateway) for g in self.table}
        wrong = sorted(set(own_listeners(53)) - allowed)
        if wrong:
            raise SandgateError(
                f"the resolver would listen on {', '.join(wrong)}, not a guest link",
                "refusing to start: the resolver serves guest links only",
            )

    async def _heartbeat(self) -> None:
        """Keep vouching for the handed links (net/handed.py): if this stops, so does forwarding."""
        links = handed_links(self.cfg)
        while True:
            try:
                self.nft.run(batch(*heartbeat_cmds(links)))
            except SandgateError as exc:
                sys.stderr.write(f"sandgate gateway: heartbeat: {exc}\n")
            await asyncio.sleep(HEARTBEAT)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            self.sink.attributor.tick(time.monotonic())
            if self.gate is not None:
                self.gate.expire()
            self.sink.flush(wait=False)  # stored off the loop (sink.py)

    # -- what the resolver and the proxy are handed ----------------------------------------------

    def _pin(self, *args: Any) -> int:
        return self.guests_.pin(*args)

    # -- the control socket's operations ----------------------------------------------------------

    async def _ping(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "guests": len(self.table)}

    async def _remove_guest(self, msg: dict[str, Any]) -> dict[str, Any]:
        since = msg.get("quiet_since")
        quiet = float(since) if isinstance(since, int | float) else None
        return await self.guests_.remove(str(msg["guest"]), quiet)

    async def _flush(self, msg: dict[str, Any]) -> dict[str, Any]:
        if not self.feed.flush():  # no marker back: wait out the kernel's batches
            await asyncio.sleep(NFLOG_SETTLE)
        self.feed.read_all()
        self.sink.attributor.tick(time.monotonic() + 10)
        self.sink.flush()
        return {}

    async def _take_netns(self, msg: dict[str, Any]) -> dict[str, Any]:
        pid = msg.get("pid")
        return {"netns": self.guests_.warm.take(pid if isinstance(pid, int) else None)}

    async def _status(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "guests": {
                g.link.ifname: {
                    "address": str(g.link.guest),
                    "session": g.session,
                    "profile": g.profile.name,
                    "mode": str(g.profile.mode),
                    "uid": g.uid,
                }
                for g in self.table
            },
            "questions": self.resolver.questions,
            "attributed": self.sink.attributor.attributed,
            "unattributed": self.sink.attributor.unattributed,
            "nflog_lost": self.feed.lost,
            "integrity": self._integrity(),
            "warm": self.guests_.warm.status(),
        }

    async def _metrics(self, msg: dict[str, Any]) -> dict[str, Any]:
        # Exact totals since start (report/metrics.py renders them for Prometheus).
        return {
            "pid": os.getpid(),
            "store_writer_pid": self.sink.writer_pid,  # its CPU is the gateway's too
            "sites": self.guests_.site_totals(),
            "events": [[*key, n] for key, n in self.sink.tally.items()],
            "guests": len(self.table),
            "questions": self.resolver.questions,
            "attributed": self.sink.attributor.attributed,
            "unattributed": self.sink.attributor.unattributed,
            "nflog_lost": self.feed.lost,
            "queues": {
                "attribution": self.sink.attributor.waiting,
                "store": len(self.sink.pending),
                "watch": sum(q.qsize() for q in self.sink.watchers),
            },
            "watchers": len(self.sink.watchers),
            "gc": self.collector.report() | ({"census": census()} if msg.get("census") else {}),
        }

    async def _check(self, msg: dict[str, Any]) -> dict[str, Any]:
        # One watchdog round now (tests, `sandgate status` and session drift checks use it).
        if self.watchdog is None:
            self.watchdog = Watchdog(self.check, 0)  # not started: rounds on request only
        problems = await self.watchdog.check()
        return {"problems": problems, "integrity": self._integrity()}

    def _integrity(self) -> dict[str, Any]:
        return watchdog_status(self.watchdog, self.cfg.watchdog)

    async def _snapshot(self, msg: dict[str, Any]) -> dict[str, Any]:
        return await self.check.snapshot_settled(verify=bool(msg.get("verify")))

    async def _reload(self, msg: dict[str, Any]) -> dict[str, Any]:
        return self.guests_.reload(str(msg["policy"]))

    async def _approvals(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"pending": self.guests_.approvals.list()}

    async def _approve(self, msg: dict[str, Any]) -> dict[str, Any]:
        verdict = str(msg.get("verdict", "allow"))
        if verdict not in ("allow", "always", "deny"):
            raise SandgateError(f"{verdict!r} is not an answer", "answer allow, always or deny")
        return self.guests_.approvals.answer(str(msg["name"]), verdict, msg.get("guest"))

    async def _fault(self, msg: dict[str, Any]) -> dict[str, Any]:
        inject_fault(str(msg.get("what")), self.table.everyone(), self.resolver, self.proxy)
        return {"fault": msg.get("what")}

    async def _shutdown_op(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.stop.set()
        return {}


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
