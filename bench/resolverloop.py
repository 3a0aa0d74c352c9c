"""The resolver alone on loopback: CPU per question, what the store costs, and the loop's stalls.

``PYTHONPATH=src:. python -m bench.resolverloop [ROUNDS]`` (root: the resolver listens on port
53; needs dnsperf and dnsmasq, as bench/run foundation does; nothing but 127.9.0.0/16 on lo).
The resolver runs in this process as the gateway runs it (uvloop, a real event sink and hash-
chained store on its writer thread, the attributor); dnsmasq answers the bench zone upstream
at 127.9.1.2 and dnsperf asks from outside, so this process's CPU is the resolver's alone. Per
round, interleaved:

- ``uncached``: every question a new name, as fast as answers come (``-q 200``);
- ``uncached 20k``: the same offered at 20,000/s with 2,000 outstanding, as ``bench/run
  foundation``'s "uncached 20k": more than it answers, so whether a backlog costs more a question;
- ``uncached, no store``: the same with the store's write skipped: what the row costs;
- ``cached 20k``: one name offered at 20,000/s, with the loop's stalls: each 1 ms tick's wall
  gap beside this thread's own CPU in it (a gap without CPU is a wait for a core);
- ``uncached, full cache``: ``uncached`` with 40,000 answers already cached (made after the
  freeze, as a gateway's cache is after a while: until 2026-12-02 they were frozen with the
  rest and no pass walked them);
- ``uncached, split``: ``uncached`` with the loop thread's CPU split (``split_us_per_query``):
  a question (its upstream send apart), an answer (its send to the guest apart), the rest of
  the loop, and the other threads (the store's writer);
- ``floor``: a forwarder that only swaps ids, on the same loop, sockets and load: what the I/O
  alone costs one process (no parse, no policy, no event).

Every round gives the collector's CPU per question by generation (``gc_us_per_query``), its
passes in the window and the longest by generation (``gc_passes``, ``gc_max_ms``), what it
tracks after the load and one full pass over that timed (``gc_tracked_after``,
``gc_full_pass_after_ms``: the stall a full pass costs whenever its thresholds call one), and
what the upstream dnsmasq and dnsperf spent per question (``upstream_us_per_query``,
``generator_us_per_query``): the bench's own share of the machine at that rate.

No namespaces, no sandbox, no nftables: beside ``bench/run foundation --only dns`` this leaves
out the veth and the guest's netfilter, so it shows the Python work, and changes to it, with
less noise. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

import dns.message

from bench.common import machine, proc_cpu
from bench.stack import dnsmasq_argv
from sandgate.events.schema import Event, FlowKey
from sandgate.events.store import Store
from sandgate.gateway.dns import dnslogic
from sandgate.gateway.dns.resolver import GuestDNS, Resolver, _answer
from sandgate.gateway.server import SWITCH_INTERVAL
from sandgate.gateway.sink import EventSink
from sandgate.net.compile import GuestLink
from sandgate.policy.dnsnames import judge_question
from sandgate.policy.load import parse_policy

UPSTREAM = "127.9.1.2"
LINK = GuestLink.from_pool(IPv4Network("127.9.0.0/24"), 0, "02:00:00:00:00:03")
ZONE = "bench.test"
PUBLIC = (IPv4Network("198.51.100.0/24"),)  # the upstream's answers (TEST-NET-2) count as public
PROFILE = parse_policy(b'[profiles.p]\ninternet = "open"\n', "bench.toml").profile(
    "p", public_override=PUBLIC, gateway_address=LINK.gateway
)
SECONDS = 3.0
UID = 61000


_UPSTREAM_PID = [0]


def _others() -> tuple[float, float]:
    """CPU seconds so far of the upstream dnsmasq and of the finished dnsperf runs (children
    waited for): what the bench's own parts cost beside the resolver."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        with open(f"/proc/{_UPSTREAM_PID[0]}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        upstream = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        upstream = float("nan")
    return upstream, children.ru_utime + children.ru_stime


def _process_cpu(pid: int | None) -> float:
    """User and system CPU seconds of the store's writer process, 0 without one."""
    return sum(proc_cpu(pid)) if pid is not None else 0.0


def _bench_cost(before: tuple[float, float], n: int) -> dict[str, float]:
    upstream, generator = _others()
    return {
        "upstream_us_per_query": (upstream - before[0]) / n * 1e6,
        "generator_us_per_query": (generator - before[1]) / n * 1e6,
    }


@contextmanager
def _upstream() -> Iterator[None]:
    argv = dnsmasq_argv(UPSTREAM, f"--address=/{ZONE}/198.51.100.7", "--local-ttl=300")
    argv.remove("--except-interface=lo")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _UPSTREAM_PID[0] = proc.pid
    try:
        time.sleep(0.3)
        yield
    finally:
        proc.terminate()
        proc.wait(5)


async def _dnsperf(args: list[str], work: Path) -> str:
    """dnsperf's output, written to a file: read through a pipe, its line per answer (``-v``)
    was ~5 MB a cached round read on the resolver's own loop (~4% of its CPU, 2026-12-02)."""
    out = work / "dnsperf.out"
    with out.open("wb") as f:
        proc = await asyncio.create_subprocess_exec(*args, stdout=f)
        await proc.wait()
    return out.read_text()


def _percentiles(text: str) -> tuple[float, float]:
    lat = sorted(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("> ") and not line.startswith("> T ")
    )
    if not lat:
        return float("nan"), float("nan")
    return lat[len(lat) // 2] * 1e3, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3


async def _round(load: str, work: Path) -> dict[str, Any]:
    cached = load.startswith("cached")
    store = Store(work / f"events-{secrets.token_hex(3)}.db")
    no_store = load.endswith("no store")
    if no_store:
        store.add_rows = len  # type: ignore[method-assign,assignment]
    sink = EventSink(  # the store in a process of its own, as the gateway's (events/writer.py)
        store, lambda guest: "bench", lambda guest: False, lambda k, u, t: None,
        own_process=not no_store,
    )  # fmt: skip
    attributor = sink.attributor
    submit = attributor.submit

    def with_sender(key: FlowKey, event: Event, now: float) -> None:
        # dnsperf's sockets, as the guest's uid log reports them in a sandbox
        if key not in attributor._senders:
            attributor.sender(key, UID, now)
        submit(key, event, now)

    attributor.submit = with_sender  # type: ignore[method-assign]
    resolver = Resolver([UPSTREAM], sink.flow, lambda *a: 300)
    attributor.before.append(resolver.flush_log)
    loop = asyncio.get_running_loop()
    resolver.bind(loop)
    sink.bind(loop)
    guest = GuestDNS(LINK, "bench", PROFILE, "p")
    await resolver.start_guest(guest)
    split = _split(resolver, guest) if load.endswith("split") else None

    async def ticker() -> None:  # the gateway's (server.py _ticker)
        while True:
            await asyncio.sleep(0.1)
            attributor.tick(time.monotonic())
            sink.flush(wait=False)

    stalls: list[tuple[float, float]] = []

    async def ticks() -> None:
        last, cpu = time.perf_counter(), time.thread_time()
        while True:
            await asyncio.sleep(0.001)
            now, c = time.perf_counter(), time.thread_time()
            stalls.append((now - last, c - cpu))
            last, cpu = now, c

    passes: list[list[float]] = [[], [], []]  # each pass's wall seconds, by generation
    gc_cpu = [0.0, 0.0, 0.0]
    gc_started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        # The pass runs on the thread that allocated past the threshold: its own CPU time.
        if phase == "start":
            gc_started[:] = time.thread_time(), time.perf_counter()
        else:
            gc_cpu[info["generation"]] += time.thread_time() - gc_started[0]
            passes[info["generation"]].append(time.perf_counter() - gc_started[1])

    gc.collect()
    gc.freeze()  # as the gateway does before READY (server.py)
    if load.endswith("full cache"):  # made after the freeze, as a running gateway's cache is
        _fill(resolver, guest, FULL_CACHE)
    # Counted from here: the collect above is the bench's own (it was counted as the round's
    # "full pass" of 38-103 ms until 2026-12-02, when no pass of the load itself was full).
    gc.callbacks.append(on_gc)
    tasks = [asyncio.ensure_future(ticker())]
    if cached:
        tasks.append(asyncio.ensure_future(ticks()))
    names = work / "q.txt"
    if cached:
        names.write_text(f"example.{ZONE} A\n")
    else:
        tag = secrets.token_hex(3)
        names.write_text("".join(f"q{i}.{tag}.{ZONE} A\n" for i in range(int(40_000 * SECONDS))))
    args = ["dnsperf", "-s", str(LINK.gateway), "-d", str(names), "-l", f"{SECONDS:g}", "-t", "2"]
    if cached:
        args += ["-c", "4", "-v", "-q", "1000", "-Q", "20000"]
    elif load.endswith("20k"):  # offered past what it answers: bench/dnsperf.py's "uncached 20k"
        args += ["-c", "4", "-v", "-q", "2000", "-Q", "20000"]
    else:
        args += ["-c", "4", "-v", "-q", "200"]
    args += [] if cached else ["-n", "1"]
    before, asked = resource.getrusage(resource.RUSAGE_SELF), resolver.questions
    writer_before = _process_cpu(sink.writer_pid)
    others = _others()
    loop_before = time.thread_time()
    text = await _dnsperf(args, work)
    after, answered = resource.getrusage(resource.RUSAGE_SELF), resolver.questions - asked
    loop_cpu = time.thread_time() - loop_before
    writer_cpu = _process_cpu(sink.writer_pid) - writer_before
    for task in tasks:
        task.cancel()
    gc.callbacks.remove(on_gc)
    await asyncio.sleep(0.2)
    attributor.tick(time.monotonic() + 10)  # as the gateway's flush op: the repeats counted too
    sink.flush()
    Resolver.close_listeners(guest)
    # What one full pass walks after the load (the cache, and whatever else the round left):
    # the stall it costs whenever the collector's thresholds call one.
    tracked = sum(len(gc.get_objects(g)) for g in range(3))
    full = time.perf_counter()
    gc.collect()
    full_pass_after_ms = (time.perf_counter() - full) * 1e3
    gc.unfreeze()
    found = re.search(r"Queries per second:\s+([0-9.]+)", text)
    lost = re.search(r"Queries lost:\s+([0-9]+)", text)
    p50, p99 = _percentiles(text)
    n = max(answered, 1)
    stored = None
    if not no_store:
        stored = store._db.execute("SELECT sum(count) FROM events").fetchone()[0]
    worst = max(stalls, default=(0.0, 0.0))
    process_cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    process_cpu += writer_cpu
    split_us = None
    if split is not None:
        split_us = {k: v / n * 1e6 for k, v in split.items()}
        split_us["loop_rest"] = (loop_cpu - split["question"] - split["answer"]) / n * 1e6
        split_us["other_threads"] = (process_cpu - loop_cpu) / n * 1e6
    result = {
        "load": load,
        "answered": answered,
        "stored": stored,
        "qps": float(found.group(1)) if found else float("nan"),
        "lost": int(lost.group(1)) if lost else None,
        "p50_ms": p50,
        "p99_ms": p99,
        "cpu_us_per_query": process_cpu / n * 1e6,  # the writer process's too
        "sys_us_per_query": (after.ru_stime - before.ru_stime) / n * 1e6,
        "writer_us_per_query": writer_cpu / n * 1e6,
        **_bench_cost(others, n),
        "gc_us_per_query": [c / n * 1e6 for c in gc_cpu],
        "split_us_per_query": split_us,
        "gc_passes": [len(p) for p in passes],
        "gc_max_ms": [max(p, default=0.0) * 1e3 for p in passes],
        "gc_full_pass_after_ms": full_pass_after_ms,
        "gc_tracked_after": tracked,
        "gc_full_passes": len(passes[2]),
        "gc_full_max_ms": max(passes[2], default=0.0) * 1e3,
        "worst_stall_ms": worst[0] * 1e3 if cached else None,
        "worst_stall_own_cpu_ms": worst[1] * 1e3 if cached else None,
        "stalls_over_5ms": sum(1 for wall, _ in stalls if wall > 0.005) if cached else None,
    }
    sink.close()  # the writer process's CPU is counted above; its end is not the round's
    return result


FULL_CACHE = 40_000


def _fill(resolver: Resolver, guest: GuestDNS, count: int) -> None:
    """``count`` answers in the cache, each with its own verdict, as uncached questions leave
    them (on main until 2026-12-02, an entry and its Decision: two objects an answer that the
    collector walked)."""
    tag = secrets.token_hex(3)
    for i in range(count):
        wire = dns.message.make_query(f"f{i}.{tag}.{ZONE}", "A", id=i & 0xFFFF).to_wire()
        q = dnslogic.parse_question(wire)
        answer = _answer(
            wire,
            time.monotonic() + 300,
            q,
            judge_question(PROFILE, q.name, q.qtype),
            rcode=0,
            addresses=("198.51.100.7",),
            ttl=300,
        )
        resolver.remember(guest, wire, answer)


class _Timed:
    """A transport whose sendto's CPU is added up (the loop thread's own)."""

    def __init__(self, transport: Any, acc: dict[str, float], key: str) -> None:
        self.transport, self.acc, self.key = transport, acc, key

    def sendto(self, data: bytes, addr: Any = None) -> None:
        t = time.thread_time()
        self.transport.sendto(data, addr)
        self.acc[self.key] += time.thread_time() - t

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _split(resolver: Resolver, guest: GuestDNS) -> dict[str, float]:
    """Time the loop's two callbacks per question and the two sends inside them."""
    acc = {"question": 0.0, "question_send": 0.0, "answer": 0.0, "answer_send": 0.0}

    def timed(fn: Callable[[bytes, Any], None], key: str) -> Callable[[bytes, Any], None]:
        def run(data: bytes, addr: Any) -> None:
            t = time.thread_time()
            fn(data, addr)
            acc[key] += time.thread_time() - t

        return run

    front = guest.udp.get_protocol()
    front.transport = _Timed(front.transport, acc, "answer_send")
    front.datagram_received = timed(front.datagram_received, "question")
    upstream = resolver.upstream
    assert upstream._transport is not None
    back: Any = upstream._transport.get_protocol()
    back.datagram_received = timed(back.datagram_received, "answer")
    upstream._transport = _Timed(upstream._transport, acc, "question_send")  # type: ignore[assignment]
    return acc


async def _floor(work: Path) -> dict[str, Any]:
    """The I/O alone: questions forwarded under a random id, answers back under the asker's."""
    loop = asyncio.get_running_loop()
    waiting: dict[bytes, tuple[Any, bytes, Any]] = {}
    listen = str(LINK.gateway)

    class Back(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            asked = waiting.pop(data[:2], None)
            if asked is not None:
                asked[0].sendto(asked[1] + data[2:], asked[2])

    back, _ = await loop.create_datagram_endpoint(Back, local_addr=("0.0.0.0", 0))

    class Front(asyncio.DatagramProtocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: Any) -> None:
            qid = os.urandom(2)
            waiting[qid] = (self.transport, data[:2], addr)
            back.sendto(qid + data[2:], (UPSTREAM, 53))

    front, _ = await loop.create_datagram_endpoint(Front, local_addr=(listen, 53))
    names = work / "q.txt"
    tag = secrets.token_hex(3)
    names.write_text("".join(f"q{i}.{tag}.{ZONE} A\n" for i in range(int(60_000 * SECONDS))))
    args = ["dnsperf", "-s", listen, "-d", str(names), "-l", f"{SECONDS:g}", "-t", "2"]
    args += ["-c", "4", "-q", "200", "-n", "1"]
    before, others = resource.getrusage(resource.RUSAGE_SELF), _others()
    text = await _dnsperf(args, work)
    after = resource.getrusage(resource.RUSAGE_SELF)
    front.close()
    back.close()
    found = re.search(r"Queries per second:\s+([0-9.]+)", text)
    done = re.search(r"Queries completed:\s+([0-9]+)", text)
    n = max(int(done.group(1)) if done else 0, 1)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {
        "load": "floor",
        "answered": n,
        "qps": float(found.group(1)) if found else float("nan"),
        "cpu_us_per_query": cpu / n * 1e6,
        "sys_us_per_query": (after.ru_stime - before.ru_stime) / n * 1e6,
        **_bench_cost(others, n),
    }


LOADS = (
    "uncached",
    "uncached 20k",
    "uncached, no store",
    "uncached, full cache",
    "uncached, split",
    "cached 20k",
)


async def _main(rounds: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sg-resolverloop-") as d, _upstream():
        for _ in range(rounds):
            for load in LOADS:
                runs.append(await _round(load, Path(d)))
            runs.append(await _floor(Path(d)))
    summary: dict[str, Any] = {}
    for load in dict.fromkeys(r["load"] for r in runs):
        mine = [r for r in runs if r["load"] == load]
        summary[load] = {
            "cpu_us_per_query_median": statistics.median(r["cpu_us_per_query"] for r in mine),
            "qps_median": statistics.median(r["qps"] for r in mine),
        }
        if "p99_ms" in mine[0]:
            summary[load]["p50_ms_median"] = statistics.median(r["p50_ms"] for r in mine)
            summary[load]["p99_ms_median"] = statistics.median(r["p99_ms"] for r in mine)
            summary[load]["gc_passes"] = [sum(r["gc_passes"][g] for r in mine) for g in range(3)]
            summary[load]["gc_max_ms"] = [max(r["gc_max_ms"][g] for r in mine) for g in range(3)]
    return {
        "load_average": os.getloadavg(),
        "machine": machine(),
        "summary": summary,
        "runs": runs,
    }


def main() -> None:
    import uvloop

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sys.setswitchinterval(SWITCH_INTERVAL)  # as the gateway does (server.py)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(_main(rounds))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
