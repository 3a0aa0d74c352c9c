"""Resolver queries per second, with logging on: sandgate's resolver beside dnsmasq.

The load generator is dnsperf (C, Debian package dnsperf), run from inside a sandbox for
sandgate and from the peer guest namespace for dnsmasq, on the same kind of link (a veth /30).
Four runs per resolver:

- ``cached max``: one name (example.com) over and over, as fast as answers come back;
- ``cached 20k``: the same, offered at 20,000 queries/s (latency at the goal's load);
- ``uncached max`` / ``uncached 20k``: every query a new name under the bench zone, each
  forwarded upstream (the fast dnsmasq upstream of bench/stack.py).

Latency percentiles come from dnsperf's per-query lines (``-v``). "Logged" is the number of DNS
events the gateway stored for the session (summing ``count``), against the queries dnsperf
sent; for dnsmasq, the ``query[A]`` lines of its ``--log-queries`` file.

One more run checks the generator: dnsperf against dnsmasq with logging off (cached). What it
reaches there is the least the generator can do, so a resolver slower than that is not held
back by the generator.

CPU: the resolver's process is sampled while dnsperf runs (user and kernel time), so the table
gives CPU microseconds per query and what one free core would answer, which holds even when
other work on this 2-core machine takes the cores (the qps figures do not).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Sampler, gateway_pids, log, median, pct, spawn, stop, wait_udp_port
from bench.stack import BENCH_ZONE, CACHED_NAME, PEER_LINK, UPSTREAM, BenchStack
from bench.stack import dnsmasq_argv as dnsmasq
from sandgate.events.schema import Kind
from sandgate.events.store import Store
from sandgate.session.runner import RunOptions, run_in
from sandgate.world.topology import HOSTS

UID = 61000
GOAL_QPS = 20_000


@dataclass
class Load:
    name: str  # "cached max", ...
    cached: bool
    rate: int | None  # offered qps, None: as fast as possible
    seconds: float
    clients: int = 4
    outstanding: int = 200


@dataclass
class DnsRun:
    resolver: str
    load: str
    sent: int = 0
    completed: int = 0
    lost: int = 0
    qps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    logged: int | None = None
    generator_cores: float = float("nan")
    resolver_cores: float = float("nan")
    resolver_sys_cores: float = float("nan")  # of which in the kernel (sending, receiving)
    # Time the resolver's loop thread was ready to run but waited for a CPU, per second: what
    # a loaded machine adds to every answer's latency, whatever the resolver does.
    resolver_wait_cores: float = float("nan")
    # The resolver's event loop thread alone (its main thread; for sandgate the rest is the
    # store's writer, the process hold, the proxy): what bounds one process's answers.
    resolver_loop_cores: float = float("nan")
    resolver_loop_sys_cores: float = float("nan")
    upstream_cores: float = float("nan")
    system_busy_cores: float = float("nan")
    softirq_cores: float = float("nan")
    rcodes: dict[str, int] = field(default_factory=dict)
    # The resolver's collector passes inside the window, by generation (sandgate's only: the
    # gateway's ``metrics`` op, which keeps gen-0 passes only from 1 ms), their count, and the
    # longest and all of them in ms
    gc_passes: list[int] | None = None
    gc_longest_ms: list[float] | None = None
    gc_ms: list[float] | None = None
    gc_census: dict[str, Any] | None = None  # what the collector tracked after the run, by type

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        # CPU microseconds per answered question: the whole resolver process, its loop thread
        q = self.qps if self.qps == self.qps and self.qps > 0 else None
        out["cpu_us_per_query"] = self.resolver_cores / q * 1e6 if q else None
        out["loop_cpu_us_per_query"] = self.resolver_loop_cores / q * 1e6 if q else None
        # What travels off this loaded 2-core machine: the answers one free core would give at
        # this CPU per question, and the cores the bench's own upstream and dnsperf (which share
        # the machine with the resolver) would need at the goal's rate at their cost per question
        # here (an upper bound: at low rates every packet wakes its reader; bench.resolverloop's
        # floor round measures them near 20k); 2 minus those is what is left for the resolver.
        out["free_core_qps"] = 1e6 / out["cpu_us_per_query"] if out["cpu_us_per_query"] else None
        up, gen = self.upstream_cores, self.generator_cores
        known = q is not None and not math.isnan(up) and not math.isnan(gen)
        out["upstream_cpu_us_per_query"] = up / q * 1e6 if known and q else None
        out["generator_cpu_us_per_query"] = gen / q * 1e6 if known and q else None
        out["bench_cores_at_goal"] = (up + gen) / q * GOAL_QPS if known and q else None
        return out


def loads(quick: bool) -> list[Load]:
    long, short = (1.5, 1.0) if quick else (5.0, 3.0)
    return [
        Load("cached max", True, None, long),
        Load("cached 20k", True, GOAL_QPS, short, outstanding=1000),
        Load("uncached max", False, None, long),
        Load("uncached 20k", False, GOAL_QPS, short, outstanding=2000),
    ]


def query_file(path: Path, load: Load) -> None:
    if load.cached:
        path.write_text(f"{CACHED_NAME} A\n")
        return
    # Enough new names for the whole run at up to 80k qps; each used once (dnsperf -n 1).
    tag = secrets.token_hex(3)
    count = int(80_000 * load.seconds)
    path.write_text("".join(f"q{i}.{tag}.{BENCH_ZONE} A\n" for i in range(count)))


def dnsperf_args(server: str, load: Load, qfile: str) -> list[str]:
    args = ["dnsperf", "-s", server, "-d", qfile, "-l", f"{load.seconds:g}", "-t", "2"]
    args += ["-c", str(load.clients), "-q", str(load.outstanding), "-v"]
    if load.rate is not None:
        args += ["-Q", str(load.rate)]
    if not load.cached:
        args += ["-n", "1"]
    return args


def parse_dnsperf(text: str, run: DnsRun) -> None:
    def num(label: str) -> float:
        m = re.search(rf"{label}:\s+([0-9.]+)", text)
        return float(m.group(1)) if m else float("nan")

    run.sent = int(num("Queries sent"))
    run.completed = int(num("Queries completed"))
    run.lost = int(num("Queries lost"))
    run.qps = num("Queries per second")
    lat: list[float] = []
    for line in text.splitlines():
        if line.startswith("> ") and not line.startswith("> T "):
            parts = line.split()
            run.rcodes[parts[1]] = run.rcodes.get(parts[1], 0) + 1
            lat.append(float(parts[-1]))
    if lat:
        run.p50_ms = median(lat) * 1e3
        run.p99_ms = pct(lat, 99) * 1e3


def parse_window(path: Path) -> tuple[float, float, float]:
    """(start, end, generator CPU s) from the wrapper script's timestamps and bash's ``time``."""
    start = end = cpu = float("nan")
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["START"]:
            start = float(parts[1])
        elif parts[:1] == ["END"]:
            end = float(parts[1])
        elif parts[:1] == ["CPU"]:
            cpu = float(parts[2]) + float(parts[3])
    return start, end, cpu


WRAPPER = """\
TIMEFORMAT='CPU %R %U %S'
server=${1:-$(awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf)}
shift
echo START $(date +%s.%N) > "$OUT.win"
{ time "$@" -s "$server" > "$OUT" 2>&1 ; } 2>> "$OUT.win"
echo END $(date +%s.%N) >> "$OUT.win"
"""


def sandgate_run(bs: BenchStack, load: Load, work: Path) -> DnsRun:
    qfile = work / f"q-{_slug(load.name)}.txt"
    query_file(qfile, load)
    out = work / f"out-sandgate-{_slug(load.name)}.txt"
    args = dnsperf_args("", load, f"/work/{qfile.name}")
    del args[1:3]  # -s comes from the wrapper (the sandbox's own resolv.conf)
    pids: dict[str, int | tuple[int, ...]] = {
        "resolver": gateway_pids(bs.stack.gateway),
        "upstream": bs.net.procs[0].pid,
    }
    opts = RunOptions(
        command=["bash", "/work/wrap.sh", "", *args],
        env={"OUT": f"/work/{out.name}"},
        mode="open",
        world="test",
        store=bs.store,
        workdir=work,
        timeout=load.seconds + 30,
        label=f"bench dns {load.name}",
    )
    with Sampler(pids, extra=_waits(bs.stack.gateway.pid)) as sampler:
        result = run_in(bs.stack, opts)
    run = DnsRun("sandgate", load.name)
    parse_dnsperf(out.read_text(), run)
    start, end, gen_cpu = parse_window(Path(f"{out}.win"))
    _cpu(run, sampler, start, end, gen_cpu)
    with bs.stack.gateway.client() as ctl:
        report = ctl.call("metrics", census=True).get("gc") or {}
    _collector(run, report, start, end)
    run.gc_census = report.get("census")
    store = Store(bs.store)
    try:
        run.logged = sum(e.count for e in store.events(session=result.session, kinds=[Kind.DNS]))
    finally:
        store.close()
    return run


def dnsmasq_run(bs: BenchStack, load: Load, work: Path, *, logging: bool = True) -> DnsRun:
    qfile = work / f"q-{_slug(load.name)}.txt"
    query_file(qfile, load)
    out = work / f"out-dnsmasq-{_slug(load.name)}.txt"
    qlog = work / f"dnsmasq-{_slug(load.name)}.log"
    server = PEER_LINK[0]
    proc = spawn(
        [
            "ip",
            "netns",
            "exec",
            bs.router_ns,
            *dnsmasq(
                server,
                f"--address=/{CACHED_NAME}/{HOSTS[CACHED_NAME]}",
                f"--server={UPSTREAM}",
                *(["--log-queries", f"--log-facility={qlog}"] if logging else []),
            ),
        ],
        stdout=open(work / "dnsmasq.stderr", "ab"),  # noqa: SIM115 - the child's
        stderr=subprocess.STDOUT,
    )
    try:
        wait_udp_port(bs.router_ns, server, 53)
        pids = {"resolver": proc.pid, "upstream": bs.net.procs[0].pid}
        env = {**os.environ, "OUT": str(out)}
        args = dnsperf_args("", load, str(qfile))
        del args[1:3]
        with Sampler(pids, extra=_waits(proc.pid)) as sampler:
            done = spawn(
                ["ip", "netns", "exec", bs.client_ns, "bash", str(work / "wrap.sh"), server, *args],
                env=env,
            )
            done.wait(timeout=load.seconds + 30)
    finally:
        stop(proc)
    run = DnsRun("dnsmasq" if logging else "dnsmasq (no log)", load.name)
    parse_dnsperf(out.read_text(), run)
    start, end, gen_cpu = parse_window(Path(f"{out}.win"))
    _cpu(run, sampler, start, end, gen_cpu)
    if logging:
        run.logged = sum(1 for line in qlog.read_text().splitlines() if " query[" in line)
    return run


def _cpu(run: DnsRun, sampler: Sampler, start: float, end: float, gen_cpu: float) -> None:
    w = sampler.window(start, end)
    run.resolver_cores = w.get("resolver_cores", float("nan"))
    run.resolver_sys_cores = w.get("resolver_sys_cores", float("nan"))
    run.resolver_wait_cores = w.get("resolver_wait_cores", float("nan"))
    run.resolver_loop_cores = w.get("resolver_loop_cores", float("nan"))
    run.resolver_loop_sys_cores = w.get("resolver_loop_sys_cores", float("nan"))
    run.upstream_cores = w.get("upstream_cores", float("nan"))
    run.system_busy_cores = w["system_busy_cores"]
    run.softirq_cores = w["softirq_cores"]
    run.generator_cores = gen_cpu / max(end - start, 1e-9)


def _collector(run: DnsRun, report: dict[str, Any], start: float, end: float) -> None:
    """The gateway's collector passes that began inside [start, end] (gateway/collector.py)."""
    run.gc_passes, run.gc_longest_ms, run.gc_ms = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    for generation, began, ms in report.get("recent", []):
        if start <= began <= end:
            run.gc_passes[generation] += 1
            run.gc_ms[generation] += ms
            run.gc_longest_ms[generation] = max(run.gc_longest_ms[generation], ms)


def _waits(pid: int) -> dict[str, Callable[[], tuple[float, float]]]:
    """The Sampler's extra reading: the run-queue wait of ``pid``'s main thread (the resolver's
    event loop; dnsmasq's only thread), from /proc/PID/schedstat's second field (ns)."""

    def read() -> tuple[float, float]:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9, 0.0
        except (OSError, ValueError, IndexError):
            return 0.0, 0.0

    def loop() -> tuple[float, float]:
        fields = _task_stat(pid)
        return (int(fields[11]) / _TCK, int(fields[12]) / _TCK) if fields else (0.0, 0.0)

    return {"resolver_wait": read, "resolver_loop": loop}


_TCK = os.sysconf("SC_CLK_TCK")


def _task_stat(pid: int) -> list[str] | None:
    """/proc/PID/task/PID/stat after the command name: the main thread's own counters."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _slug(name: str) -> str:
    return name.replace(" ", "-")


def measure(bs: BenchStack, quick: bool) -> dict[str, Any]:
    work = bs.base / "dns"
    work.mkdir(mode=0o755, exist_ok=True)
    os.chown(work, UID, UID)
    (work / "wrap.sh").write_text(WRAPPER)
    runs: list[DnsRun] = []
    plan = loads(quick)
    for load in plan:
        for resolver in ("sandgate", "dnsmasq"):
            log(f"dns: {resolver} {load.name} ({load.seconds:g} s)")
            fn = sandgate_run if resolver == "sandgate" else dnsmasq_run
            runs.append(fn(bs, load, work))
            time.sleep(0.2)
    log(f"dns: generator check, dnsmasq without logging, {plan[0].name}")
    runs.append(dnsmasq_run(bs, plan[0], work, logging=False))
    return {"goal_qps": GOAL_QPS, "runs": [r.as_dict() for r in runs]}
