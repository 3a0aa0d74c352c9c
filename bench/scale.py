"""Scale on one host: many guests on one gateway, a 100,000-rule policy, and a session soak.

guests   bare network namespaces (no process) joined through the control socket (``add_guest``,
         mode open), up to 100 at once: add_guest ms (client-side, whole op), the ping round
         trip from the newest and the oldest guest to a test-world host (the kernel path: each
         guest's chains are reached through the ``fwd``/``in`` verdict maps keyed by ifname, so
         a packet's cost should not depend on how many guests there are), beside the peer
         guest's round trip through a plain router; the daemon's RSS, fds and threads.
rules    a policy of 50,000 domain and 50,000 CIDR rules: load_policy + profile() + guest_add
         (compile), the whole ruleset as one ``nft -j -f`` batch into a scratch namespace
         (apply, atomic), and ``explain`` on it.
soak     N sessions (``run_in``, a command that makes a known number of attempts: DNS
         questions and a TCP connection the policy drops), most back to back and a share
         four at a time; what is left afterwards (namespaces, links and nft objects in the
         gateway, mounts, cgroups), the daemon's fds, threads and RSS, events stored vs
         attempts made, sessions failed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import dispatch
from bench.common import log, median
from bench.stack import BenchStack, bench_stack
from sandgate.events.schema import Kind
from sandgate.events.store import Store
from sandgate.net import ns
from sandgate.net.netlink import run_in_netns
from sandgate.sandbox.workspace import SESSIONS_ROOT, our_mounts
from sandgate.session.runner import RunOptions, run_in
from sandgate.world import loadgen
from sandgate.world.topology import HOSTS

COUNTS = (1, 10, 50, 100)
PING_TARGET = HOSTS["example.com"]
DROPPED = ("10.77.0.20", 22)  # the NAS's ssh tripwire: the test world's policy drops it
SOAK_NAMES = 2  # DNS questions each soak session asks


# -- the daemon, seen from /proc ---------------------------------------------------------------


def daemon_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    return {
        "rss_mb": round(rss / 1024, 1),
        "threads": threads,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def _nft_objects(pid: int) -> dict[str, int]:
    """Chains, sets, rules and verdict-map elements in the gateway's namespace."""
    out = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "nft", "-j", "list", "ruleset"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    for item in json.loads(out)["nftables"]:
        for kind, body in item.items():
            if kind in ("chain", "set", "rule", "table"):
                counts[kind] = counts.get(kind, 0) + 1
            if kind == "map":
                counts["map_elements"] = counts.get("map_elements", 0) + len(body.get("elem", []))
    return counts


def _links(pid: int) -> int:
    out = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "link"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return len(out.splitlines())


def _guest_flows(bs: BenchStack) -> int:
    """Tracked flows in the gateway from a guest address of the pool, the canary's last /30
    left out (the watchdog's): a guest that left must leave none, or the next guest given its
    address inherits them."""
    from pyroute2 import NFCTSocket

    pool = ipaddress.ip_network(bs.stack.config.guest_pool if bs.stack.config else "10.201.0.0/16")
    first, canary = int(pool.network_address), int(pool.broadcast_address) - 3

    def count() -> int:
        with NFCTSocket() as ct:
            found = 0
            for msg in ct.dump():
                ip = msg.get_attr("CTA_TUPLE_ORIG").get_attr("CTA_TUPLE_IP")
                found += first <= int(ipaddress.ip_address(ip.get_attr("CTA_IP_V4_SRC"))) < canary
            return found

    return run_in_netns(f"/proc/{bs.stack.gateway.pid}/ns/net", count)


def _cgroups() -> list[str]:
    found: list[str] = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(root, d) for d in dirs if d.startswith("sandgate-")]
        dirs[:] = [d for d in dirs if not d.startswith("sandgate-")]  # don't descend into ours
    return found


def _pool_settled(bs: BenchStack, timeout: float = 10.0) -> int:
    """Wait until the gateway's warm pool is full and none of it is handed out (its ready
    namespaces' links are the gateway's, made ahead, not a session's); how many are ready."""
    deadline = time.monotonic() + timeout
    while True:
        with bs.stack.gateway.client() as ctl:
            warm = ctl.call("status").get("warm") or {}
        ready = len(warm.get("ready", []))
        full = ready >= int(warm.get("size", 0)) and not warm.get("making")
        if (full and not warm.get("taken")) or time.monotonic() > deadline:
            return ready
        time.sleep(0.1)


def kernel_objects(bs: BenchStack) -> dict[str, Any]:
    pid = bs.stack.gateway.pid
    warm = _pool_settled(bs)
    return {
        "warm_ready": warm,
        "session_netns": sorted(n for n in ns.list_ours() if n.startswith(f"sg-{bs.instance}-s")),
        "gateway_links": _links(pid),
        "nft": _nft_objects(pid),
        "mounts": [str(m) for m in our_mounts(SESSIONS_ROOT)],
        "cgroups": _cgroups(),
        "guest_flows": _guest_flows(bs),
        "session_dirs": sorted(p.name for p in SESSIONS_ROOT.glob("*"))
        if SESSIONS_ROOT.is_dir()
        else [],
    }


def leaked(
    before: dict[str, Any], after: dict[str, Any], ours: set[str] | None = None
) -> dict[str, int]:
    """What grew between two ``kernel_objects``: per kind, how many more (0 = nothing left).

    ``ours``: the bench's session ids; mounts, cgroups and session folders are then counted
    only when they name one of them (other people's sessions on a shared machine are not the
    gateway's leaks)."""
    out: dict[str, int] = {}
    for key in ("session_netns", "mounts", "cgroups", "session_dirs"):
        grown = set(after[key]) - set(before[key])
        if ours is not None and key != "session_netns":
            grown = {x for x in grown if any(sid in x for sid in ours)}
        out[key] = len(grown)
    # The warm pool's links are counted out: each ready namespace's is made ahead by design.
    links = [o["gateway_links"] - o.get("warm_ready", 0) for o in (before, after)]
    out["gateway_links"] = max(0, links[1] - links[0])
    out["guest_flows"] = max(0, after.get("guest_flows", 0) - before.get("guest_flows", 0))
    for kind in set(before["nft"]) | set(after["nft"]):
        out[f"nft_{kind}"] = max(0, after["nft"].get(kind, 0) - before["nft"].get(kind, 0))
    return out


# -- guests ------------------------------------------------------------------------------------


def ping_us(netns: str, target: str, count: int) -> list[float]:
    """Round trips in µs (the first, which carries ARP and the new flow's logging, dropped)."""
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            netns,
            "ping",
            "-n",
            "-c",
            str(count + 1),
            "-i",
            "0.01",
            "-W",
            "1",
            target,
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=30,
    ).stdout
    times = [float(m) * 1000 for m in re.findall(r"time=([\d.]+) ms", out)]
    return times[1:]


def part_guests(bs: BenchStack, quick: bool) -> dict[str, Any]:
    pid = bs.stack.gateway.pid
    pings = 50 if quick else 200
    made: list[str] = []
    joined: list[str] = []
    add_ms: list[float] = []
    at: dict[str, dict[str, Any]] = {}
    peer = ping_us(bs.client_ns, PING_TARGET, pings)
    packets = 10_000 if quick else 30_000
    peer_cpu_ns = dispatch.guest_cpu_ns(bs.client_ns, PING_TARGET, packets)
    kinds = dispatch.dispatch(COUNTS, packets)  # verdict map against jump list, apart
    try:
        with bs.stack.gateway.client(timeout=60) as ctl:
            for i in range(1, COUNTS[-1] + 1):
                name = f"sg-{bs.instance}-q{i}"
                ns.create(name)
                made.append(name)
                t0 = time.perf_counter()
                reply = ctl.call(
                    "add_guest", netns=name, session=f"scale-{i}", mode="open", uid=62000 + i
                )
                add_ms.append((time.perf_counter() - t0) * 1000)
                joined.append(reply["guest"])
                if i in COUNTS:
                    newest = ping_us(name, PING_TARGET, pings)
                    oldest = ping_us(made[0], PING_TARGET, pings)
                    cpu_ns = dispatch.guest_cpu_ns(name, PING_TARGET, packets)
                    lo = COUNTS[COUNTS.index(i) - 1] if i > 1 else 0
                    at[str(i)] = {
                        "add_guest_ms_p50": round(median(add_ms[lo:i]), 2),
                        "rtt_us_p50": round(median(newest), 1) if newest else None,
                        "rtt_us_p50_oldest": round(median(oldest), 1) if oldest else None,
                        "pings_answered": len(newest),
                        "packet_cpu_ns": cpu_ns,
                        "daemon": daemon_stats(pid),
                        "nft": _nft_objects(pid),
                    }
                    now = at[str(i)]
                    log(
                        f"guests {i}: add_guest {now['add_guest_ms_p50']} ms, "
                        f"rtt {now['rtt_us_p50']} µs, {cpu_ns} ns CPU a packet, "
                        f"rss {now['daemon']['rss_mb']} MB"
                    )
            remove_ms: list[float] = []
            for guest in joined:
                t0 = time.perf_counter()
                ctl.call("remove_guest", guest=guest)
                remove_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        for name in made:
            try:
                ns.remove(name)
            except Exception as exc:
                log(f"could not remove {name}: {exc}")
    peer_p50 = round(median(peer), 1) if peer else None
    return {
        "guests": len(joined),
        "add_guest_ms_p50": {k: v["add_guest_ms_p50"] for k, v in at.items()},
        "rtt_us_p50": {k: v["rtt_us_p50"] for k, v in at.items()},
        "rtt_us_p50_oldest_guest": {k: v["rtt_us_p50_oldest"] for k, v in at.items()},
        "rtt_us_p50_peer_router": peer_p50,
        "daemon_rss_mb": {k: v["daemon"]["rss_mb"] for k, v in at.items()},
        "daemon_fds": {k: v["daemon"]["fds"] for k, v in at.items()},
        "daemon_threads": {k: v["daemon"]["threads"] for k, v in at.items()},
        "remove_guest_ms_p50": round(median(remove_ms), 2) if remove_ms else None,
        "packet_cpu_ns": {k: v["packet_cpu_ns"] for k, v in at.items()},
        "packet_cpu_ns_peer_router": peer_cpu_ns,
        "per_guest_dispatch": "verdict maps fwd/in keyed by iifname (one lookup, not a jump list)",
        "dispatch_cpu_ns_per_packet": kinds,
        "at": at,
    }


# -- 100,000 rules ------------------------------------------------------------------------------


def big_policy(path: Path, domains: int, cidrs: int) -> None:
    """A profile with ``domains`` domain rules and ``cidrs`` /24 CIDR rules (a third on 443)."""
    lines = [
        '[gateway]\ndefault_profile = "big"\n',
        "[profiles.big]",
        'internet = "allowlist"',
        "allow = [",
    ]
    for i in range(domains):
        port = ", port = 443" if i % 3 == 0 else ""
        lines.append(f'  {{ domain = "d{i}.rules.bench.example"{port} }},')
    for i in range(cidrs):
        port = ", port = 443" if i % 3 == 0 else ""
        lines.append(f'  {{ cidr = "11.{i // 256 % 256}.{i % 256}.0/24"{port} }},')
    lines.append("]")
    path.write_text("\n".join(lines) + "\n")


def nft_listeners() -> int:
    """Netlink sockets, in any namespace, subscribed to NFNLGRP_NFTABLES (group 7): the kernel
    asks whether any exists, host-wide, before it builds a change's notifications."""
    found: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            lines = (proc / "net" / "netlink").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # sk, protocol (12: NETLINK_NETFILTER), pid, groups (the first 32, hex), ..., inode
            if len(cols) > 9 and cols[1] == "12" and int(cols[3], 16) & (1 << 6):
                found.add(cols[9])
    return len(found)


def part_rules(bs: BenchStack, quick: bool, n: int = 100_000) -> dict[str, Any]:
    from sandgate.errors import RulesetRejected
    from sandgate.explain import explain
    from sandgate.net.compile import GuestLink, base_ruleset, guest_add
    from sandgate.net.nft import CommitMonitor, Nft, batch
    from sandgate.policy.load import load_policy
    from sandgate.policy.model import Protocol

    folder = Path(tempfile.mkdtemp(prefix="sandgate-bench-rules-", dir=bs.base))
    path = folder / "big.toml"
    big_policy(path, n // 2, n - n // 2)
    # CPU seconds too: on a shared 2-core machine wall time is mostly waiting for a core.
    c0, t0 = time.process_time(), time.perf_counter()
    policy = load_policy(str(path))
    c1, t1 = time.process_time(), time.perf_counter()
    profile = policy.profile()
    t2 = time.perf_counter()
    import ipaddress

    pool = ipaddress.ip_network("10.201.0.0/16")
    link = GuestLink.from_pool(pool, 0, "02:00:00:00:00:01")
    base, _ = base_ruleset("up0", pool)
    cmds, sites = guest_add(link, profile)
    c3, t3 = time.process_time(), time.perf_counter()
    body = json.dumps(batch(*base, *cmds))
    (folder / "ruleset.json").write_text(body)
    scratch = f"sg-{bs.instance}-r"
    ns.create(scratch)
    apply_ms: float | None = None
    apply_cpu_ms: float | None = None
    apply_error: str | None = None
    objects: dict[str, int] = {}
    listeners = nft_listeners()
    monitor_lost: int | None = None
    try:
        # The guest's link must exist for its netdev ingress chain: a veth of that name.
        subprocess.run(
            [
                "ip",
                "-n",
                scratch,
                "link",
                "add",
                link.ifname,
                "type",
                "veth",
                "peer",
                "name",
                "p" + link.ifname,
            ],
            check=True,
        )
        # As the daemon applies (gateway/lifecycle.py: ``self.nft.run(batch(*cmds))``): the
        # batch as a Python object, serialised and handed to libnftables in the namespace,
        # one transaction. CPU: this process's, where libnftables and the kernel's commit
        # (on the worker thread's behalf) run; the kernel's share grows with every nftables
        # listener on the host (see rules_100k_nft_listeners).
        worker = ns.NsThread(scratch)
        # The gateway's own commit monitor listens in its namespace: the kernel delivers
        # every element's notification to it.
        monitor = worker.call(CommitMonitor)
        try:
            nft = Nft.on(worker)
            t4, c4 = time.perf_counter(), time.process_time()
            try:
                nft.run(batch(*base, *cmds))
            except RulesetRejected as exc:
                apply_error = exc.message[-500:]
            apply_ms = round((time.perf_counter() - t4) * 1000, 1)
            apply_cpu_ms = round((time.process_time() - c4) * 1000, 1)
            nft.close()
            for _ in range(200):  # drained to the commit's NEWGEN: an overrun shows on reading
                if worker.call(monitor.read) or monitor.overruns:
                    break
            monitor_lost = monitor.overruns
        finally:
            worker.call(monitor.close)
            worker.close()
        if apply_error is None:
            out = subprocess.run(
                ["ip", "netns", "exec", scratch, "nft", "-j", "list", "ruleset"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for item in json.loads(out)["nftables"]:
                for kind in item:
                    objects[kind] = objects.get(kind, 0) + 1
    finally:
        ns.remove(scratch)

    def no_names(name: str) -> list[Any]:
        return [ipaddress.ip_address("11.200.1.1")] if name.startswith("d4999") else []

    targets = [
        f"d{n // 2 - 1}.rules.bench.example:443",
        "11.195.80.9:443",
        "11.250.0.1:80",
        "d49999.rules.bench.example:80",
        "nothing.example:443",
    ]
    explain_ms: list[float] = []
    verdicts: dict[str, str] = {}
    for target in targets:
        e0 = time.perf_counter()
        e = explain(profile, target, Protocol.TCP, no_names)
        explain_ms.append((time.perf_counter() - e0) * 1000)
        verdicts[target] = f"{e.verdict} {e.reason}"
    return {
        "rules": n,
        "rules_100k_parse_ms": round((t1 - t0) * 1000, 1),
        "rules_100k_profile_ms": round((t2 - t1) * 1000, 1),
        "rules_100k_guest_add_ms": round((t3 - t2) * 1000, 1),
        "rules_100k_compile_ms": round((t3 - t0) * 1000, 1),
        # Its two halves: reading the file (TOML, validation, rule checks) and the ruleset.
        "rules_100k_load_ms": round((t1 - t0) * 1000, 1),
        "rules_100k_ruleset_ms": round((t3 - t1) * 1000, 1),
        "rules_100k_parse_cpu_ms": round((c1 - c0) * 1000, 1),
        "rules_100k_compile_cpu_ms": round((c3 - c0) * 1000, 1),
        "rules_100k_apply_ms": apply_ms,
        "rules_100k_apply_cpu_ms": apply_cpu_ms,  # libnftables and the kernel's commit
        # Sockets on the host listening for nftables changes (a gateway's commit monitor, `nft
        # monitor`): with any, the kernel builds a notification for every element it adds.
        "rules_100k_nft_listeners": listeners,
        # Notifications the commit monitor lost (its receive buffer overran): must be 0.
        "rules_100k_monitor_overruns": monitor_lost,
        "rules_100k_set_elements": sum(
            len(c["add"]["set"].get("elem", []))
            for c in cmds
            if "set" in c.get("add", {}) and c["add"]["set"]["name"].startswith("r")
        ),
        "rules_100k_apply_error": apply_error,
        "rules_100k_nft_commands": len(base) + len(cmds),
        # Verdict sites: grouped CIDR rules share one per scope (policy/groups.py), domain
        # rules one pin set and one site per list and scope (policy/pins.py).
        "rules_100k_sites": len(sites),
        "rules_100k_grouped_rules": sum(len(s.group.rules) for s in sites.values() if s.group),
        "rules_100k_pin_sets": sum(1 for s in sites.values() if s.pins is not None),
        "rules_100k_pinned_rules": sum(len(s.pins.rules) for s in sites.values() if s.pins),
        "rules_100k_nft_objects": objects,
        "rules_100k_batch_mb": round(len(body) / 1e6, 1),
        "rules_100k_explain_ms_max": round(max(explain_ms), 2),
        "rules_100k_explain_ms_p50": round(median(explain_ms), 2),
        "rules_100k_explain": verdicts,
    }


# -- soak --------------------------------------------------------------------------------------


def part_soak(bs: BenchStack, sessions: int, concurrent: int) -> dict[str, Any]:
    pid = bs.stack.gateway.pid

    def opts(i: int) -> RunOptions:
        return RunOptions(
            command=loadgen.command(SOAK_NAMES, DROPPED, "s", "soak.bench.example"),
            world="test",
            store=bs.store,
            timeout=60,
            echo=False,
            label=f"soak {i}",
        )

    def one(i: int) -> tuple[str | None, int, str | None]:
        try:
            r = run_in(bs.stack, opts(i))
            message = r.message
            if r.exit_code != 0 and message is None and r.report.output:
                with contextlib.suppress(OSError):  # what the command said, for the failure
                    message = Path(r.report.output).read_text(errors="replace")[-400:]
            return r.session, r.exit_code, message
        except Exception as exc:
            return None, -1, f"{type(exc).__name__}: {exc}"

    # One session first so the daemon's lazily made parts exist before the baseline.
    warm = one(0)
    before, objs_before = daemon_stats(pid), kernel_objects(bs)
    results: list[tuple[str | None, int, str | None]] = []
    back_to_back = sessions - concurrent
    t0 = time.monotonic()
    for i in range(1, back_to_back + 1):
        results.append(one(i))
        if i % 100 == 0:
            log(f"soak: {i} sessions, rss {daemon_stats(pid)['rss_mb']} MB")
    with concurrent_pool(4) as pool:
        results += list(pool.map(one, range(back_to_back + 1, sessions + 1)))
    wall = time.monotonic() - t0
    time.sleep(1.0)  # the last sessions' log lines reach the store
    after, objs_after = daemon_stats(pid), kernel_objects(bs)
    leaks = leaked(objs_before, objs_after, {sid for sid, _, _ in [warm, *results] if sid})
    store = Store(bs.store)
    try:
        short: list[dict[str, Any]] = []
        dns_events = conn_events = 0
        for sid, _, _ in results:
            if sid is None:
                continue
            events = store.events(session=sid)
            d = sum(1 for e in events if e.kind == Kind.DNS)
            c = sum(1 for e in events if e.kind == Kind.CONN and e.dst == DROPPED[0])
            dns_events += d
            conn_events += c
            if d != SOAK_NAMES or c != 1:
                short.append({"session": sid, "dns": d, "conn": c})
    finally:
        store.close()
    done = [r for r in results if r[0] is not None]
    failed = [{"session": s, "exit": code, "message": m} for s, code, m in results if code != 0]
    return {
        "soak_sessions": len(results),
        "soak_concurrent_share": concurrent,
        "soak_wall_s": round(wall, 1),
        "soak_sessions_per_s": round(len(results) / wall, 2) if wall else None,
        "soak_failed": len(failed),
        "soak_failures": failed[:10],
        "soak_warmup_exit": warm[1],
        "soak_leaked_objects": sum(leaks.values()),
        "soak_leaks": leaks,
        "soak_daemon_rss_mb": [before["rss_mb"], after["rss_mb"]],
        "soak_daemon_rss_growth_mb": round(after["rss_mb"] - before["rss_mb"], 1),
        "soak_daemon_fds": [before["fds"], after["fds"]],
        "soak_daemon_threads": [before["threads"], after["threads"]],
        "soak_attempts_made": len(done) * (SOAK_NAMES + 1),
        "soak_events_stored": dns_events + conn_events,
        "soak_sessions_events_differ": short[:10],
        "soak_sessions_events_differ_count": len(short),
    }


def concurrent_pool(n: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(n, "soak")


# -- the whole ---------------------------------------------------------------------------------


PARTS = ("guests", "rules", "soak")


def main_scale(
    quick: bool, sessions: int | None = None, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    n = sessions if sessions is not None else (50 if quick else 1000)
    result: dict[str, Any] = {"quick": quick}
    with bench_stack() as bs:
        result["daemon_at_start"] = daemon_stats(bs.stack.gateway.pid)
        if "guests" in parts:
            log("guests: 1 to 100 on one gateway")
            result.update(part_guests(bs, quick))
        if "rules" in parts:
            log("rules: 100,000 domain and CIDR rules")
            result.update(part_rules(bs, quick))
        if "soak" in parts:
            log(f"soak: {n} sessions")
            result.update(part_soak(bs, n, max(4, n // 10)))
    return result


def render(r: dict[str, Any]) -> str:
    rows = [
        f"{'guests':>7} {'add_guest ms':>13} {'rtt µs new':>11} {'rtt µs old':>11} "
        f"{'ns/packet':>10} {'RSS MB':>7} {'fds':>5} {'thr':>4}"
    ]
    for k in r.get("add_guest_ms_p50", {}):
        rows.append(
            f"{k:>7} {r['add_guest_ms_p50'][k]:>13} {r['rtt_us_p50'][k]!s:>11} "
            f"{r['rtt_us_p50_oldest_guest'][k]!s:>11} {r['packet_cpu_ns'][k]!s:>10} "
            f"{r['daemon_rss_mb'][k]:>7} {r['daemon_fds'][k]:>5} {r['daemon_threads'][k]:>4}"
        )
    if "add_guest_ms_p50" in r:
        d = r["dispatch_cpu_ns_per_packet"]
        rows.append(
            f"peer router (no sandgate): rtt {r.get('rtt_us_p50_peer_router')} µs, "
            f"{r.get('packet_cpu_ns_peer_router')} ns/packet; "
            f"remove_guest p50 {r.get('remove_guest_ms_p50')} ms"
        )
        rows.append(
            f"dispatch, ns/packet (no table {d['none']}): verdict map {d['vmap']}, "
            f"jump list {d['jumps']}"
        )
    if "rules_100k_compile_ms" in r:
        rows.append(
            f"100k rules: parse {r['rules_100k_parse_ms']} ms, "
            f"profile {r['rules_100k_profile_ms']} "
            f"ms, guest_add {r['rules_100k_guest_add_ms']} ms = compile "
            f"{r['rules_100k_compile_ms']} ms (CPU {r['rules_100k_compile_cpu_ms']} ms); "
            f"apply {r['rules_100k_apply_ms']} ms (CPU {r['rules_100k_apply_cpu_ms']} ms) "
            f"({r['rules_100k_nft_commands']} nft commands, {r['rules_100k_batch_mb']} MB)"
            + (f" ERROR {r['rules_100k_apply_error']}" if r["rules_100k_apply_error"] else "")
            + f"; explain ≤ {r['rules_100k_explain_ms_max']} ms"
        )
    if "soak_sessions" in r:
        rows.append(
            f"soak: {r['soak_sessions']} sessions ({r['soak_concurrent_share']} four at a time) in "
            f"{r['soak_wall_s']} s, failed {r['soak_failed']}, leaked {r['soak_leaked_objects']} "
            f"{r['soak_leaks']}, RSS {r['soak_daemon_rss_mb']} MB "
            f"(+{r['soak_daemon_rss_growth_mb']}),"
            f" fds {r['soak_daemon_fds']}, threads {r['soak_daemon_threads']}, events "
            f"{r['soak_events_stored']} / attempts {r['soak_attempts_made']}"
        )
    return "\n".join(rows)
