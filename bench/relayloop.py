"""The relays alone, on loopback: CPU per GB by pipe size, round trips, and event delays.

``PYTHONPATH=src:. python -m bench.relayloop [ROUNDS] [--trace]`` (nothing but 127.0.0.1; the kernel
relay, sockmap.py, needs root, else its rows are the hub's). The peers (a sender, a sink, an echo)
run in child processes, so this process's CPU is the relay's alone. Per round, interleaved: 1 GiB
through hub tunnels with 64 KiB, 256 KiB and 1 MiB pipes and through the kernel relay ("bpf"); 5,000
one-byte round trips through the hub, the kernel relay and no relay at all ("direct": the added
round trip is the difference); 500 small events 5 ms apart (their delay, one clock).

The kernel relay's work runs in softirq (the program, on the sender's CPU time) and in kworker
threads (the send to the peer): this process's CPU does not show it, so ``bpf`` also reports
every kworker thread's CPU during its runs (``kworker_s_per_GB``, ``kworker_us``: an upper bound,
the neighbours' kworker time is in it too). A round trip's ``cpu_us`` adds the peers' own CPU
(``peers_cpu_us``: client and echo, with the softirq work done in their syscalls), the hub's and
the kworkers': ``bpf``'s less ``direct``'s is what the relay costs on a free core. All from
schedstat and CLOCK_PROCESS_CPUTIME_ID (nanoseconds), not the 4 ms ticks of /proc/PID/stat.
Bulk rows count the same way per GB (``peers_s_per_GB``, ``all_s_per_GB``).

``--trace`` (root) also traces the kernel relay's round trips with ftrace: every work item the
sockmap queues (sk_psock_backlog, the kworker that sends a redirected skb on) per round trip, the
wait from queueing to the kworker starting it, and how long it runs. The tracing is done from the
peers' process, in its own mount namespace (its own tracefs mount) and its own ftrace instance,
removed at the end: nothing else's tracing is touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import queue
import re
import socket
import statistics
import sys
import threading
import time
from typing import Any

from sandgate.gateway.proxy import relay, sockmap

SIZES = {"64K": 1 << 16, "256K": 1 << 18, "1M": 1 << 20, "bpf": 0}  # 0: the kernel relay
GB = 1 << 30


def _nd(s: socket.socket) -> socket.socket:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _oncpu(path: str) -> float:
    """Seconds a thread has run (schedstat: nanoseconds, exact; stat's ticks are 4 ms)."""
    with open(path) as f:
        return int(f.read().split()[0]) / 1e9


def _hub_cpu() -> float:
    """The parent's (the hub's process) CPU seconds, every thread of it."""
    tasks = f"/proc/{os.getppid()}/task"
    total = 0.0
    for t in os.listdir(tasks):
        with contextlib.suppress(OSError):
            total += _oncpu(f"{tasks}/{t}/schedstat")
    return total


def _kworkers() -> dict[str, float]:
    """CPU seconds of every kworker thread now, by pid."""
    out: dict[str, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().startswith("kworker"):
                    out[d] = _oncpu(f"/proc/{d}/schedstat")
        except OSError:
            continue
    return out


def _kworkers_since(before: dict[str, float]) -> float:
    """kworker CPU seconds since ``before`` (one that exited meanwhile is not counted back)."""
    return sum(t - before.get(pid, 0.0) for pid, t in _kworkers().items())


class _Tracer:
    """sk_psock_backlog's work items, in an ftrace instance of this process's own tracefs."""

    EVENTS = ("workqueue_queue_work", "workqueue_execute_start", "workqueue_execute_end")
    _LINE = re.compile(r"\s(\d+\.\d+): (workqueue_\w+): work struct[= ](\w+)")

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        ns, rec, private = 0x00020000, 0x4000, 1 << 18  # CLONE_NEWNS, MS_REC, MS_PRIVATE
        if libc.unshare(ns) or libc.mount(None, b"/", None, rec | private, None):
            raise OSError(ctypes.get_errno(), "a private mount namespace")
        root = b"/sys/kernel/tracing"
        # EBUSY: tracefs is mounted there already (the copy this namespace inherited): use it.
        if libc.mount(b"none", root, b"tracefs", 0, None) and ctypes.get_errno() != 16:
            raise OSError(ctypes.get_errno(), "mounting tracefs")
        self.dir = f"/sys/kernel/tracing/instances/sg-relayloop-{os.getpid()}"
        os.mkdir(self.dir)
        with open("/proc/kallsyms") as f:  # the filter takes the function's address
            addr = next(ln.split()[0] for ln in f if ln.rstrip().endswith(" sk_psock_backlog"))
        for ev in self.EVENTS:
            self._write(f"events/workqueue/{ev}/filter", f"function == 0x{addr}")
            self._write(f"events/workqueue/{ev}/enable", "1")
        self._write("buffer_size_kb", "8192")

    def _write(self, name: str, value: str) -> None:
        with open(f"{self.dir}/{name}", "w") as f:
            f.write(value)

    def on(self) -> None:
        self._write("trace", "")  # empties the buffer
        self._write("tracing_on", "1")

    def off(self, round_trips: int) -> dict[str, Any]:
        self._write("tracing_on", "0")
        queued: dict[str, float] = {}
        started: dict[str, float] = {}
        waits, runs, n = [], [], 0
        with open(f"{self.dir}/trace") as f:
            for line in f:
                m = self._LINE.search(line)
                if m is None:
                    continue
                t, ev, work = float(m[1]), m[2], m[3].rstrip(":")
                if ev == "workqueue_queue_work":
                    queued[work], n = t, n + 1
                elif ev == "workqueue_execute_start" and work in queued:
                    waits.append((t - queued.pop(work)) * 1e6)
                    started[work] = t
                elif ev == "workqueue_execute_end" and work in started:
                    runs.append((t - started.pop(work)) * 1e6)
        return {
            "work_per_round_trip": round(n / round_trips, 2),
            "wait_us": {f"p{p}": _pct(waits, p) for p in (50, 90, 99)},
            "run_us": {f"p{p}": _pct(runs, p) for p in (50, 90)},
        }

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._write("tracing_on", "0")
            os.rmdir(self.dir)


def _pct(xs: list[float], p: int) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, len(xs) * p // 100)], 1) if xs else float("nan")


def _far_end(listener: socket.socket) -> None:
    """The upstream, in its own process (no GIL shared with the client), one connection at a
    time as the plan runs them: b = sink (reads to EOF, answers one byte), e = echo, s = event
    source."""
    while True:
        s, _ = listener.accept()
        mode = s.recv(1)
        if mode == b"b":
            buf = bytearray(1 << 20)
            while s.recv_into(buf):
                pass
            s.sendall(b"k")
        elif mode == b"e":
            while data := s.recv(100):
                s.sendall(data)
        else:
            for _ in range(500):
                s.sendall(b"%.9f\n" % time.time())
                time.sleep(0.005)
        s.close()


def _peers(plan: list[tuple[str, str, int]], far: int, q: Any, trace: bool) -> None:
    tracer = _Tracer() if trace else None  # before any thread: unshare(CLONE_NEWNS) needs that
    try:
        _run_plan(plan, far, q, tracer)
    finally:
        if tracer is not None:
            tracer.close()


def _run_plan(plan: list[tuple[str, str, int]], far: int, q: Any, tracer: _Tracer | None) -> None:
    out: list[tuple[Any, ...]] = []
    traced: list[dict[str, Any]] = []
    for kind, name, port in plan:
        c = _nd(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.01)  # the relay has joined the tunnel
        c0, k0, t0 = _hub_cpu(), _kworkers(), time.perf_counter()
        if kind == "bulk":
            p0 = time.process_time() + _oncpu(f"/proc/{far}/schedstat")
            c.sendall(b"b")
            data = bytes(1 << 20)
            for _ in range(GB >> 20):
                c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            c.recv(1)
            secs, k = time.perf_counter() - t0, _kworkers_since(k0)
            peers = time.process_time() + _oncpu(f"/proc/{far}/schedstat") - p0
            out.append((kind, name, GB / secs / 1e6, _hub_cpu() - c0, k, peers))
        elif kind == "rtt":
            c.sendall(b"e")
            times = []
            if tracer is not None and name == "bpf":
                tracer.on()
            # the peers' own CPU (client and echo), with the softirq work done in their syscalls
            p0 = time.process_time() + _oncpu(f"/proc/{far}/schedstat")
            for _ in range(5000):
                t = time.perf_counter()
                c.sendall(b"x")
                c.recv(100)
                times.append(time.perf_counter() - t)
            p1 = time.process_time() + _oncpu(f"/proc/{far}/schedstat")
            peers_us = (p1 - p0) / 5000 * 1e6
            if tracer is not None and name == "bpf":
                traced.append(tracer.off(5000))
            cpu_us = (_hub_cpu() - c0) / 5000 * 1e6
            k = _kworkers_since(k0) / 5000 * 1e6
            out.append((kind, name, statistics.median(times) * 1e6, cpu_us, k, peers_us))
        else:
            c.sendall(b"s")
            delays, buf = [], b""
            while data := c.recv(4096):
                now = time.time()
                *lines, buf = (buf + data).split(b"\n")
                delays += [(now - float(x)) * 1e3 for x in lines]
            delays.sort()
            out.append((kind, name, delays[len(delays) // 2], delays[int(len(delays) * 0.99)], 0))
        c.close()
    q.put((out, traced))


def main(rounds: int, trace: bool = False) -> dict[str, Any]:
    upstream = socket.create_server(("127.0.0.1", 0))
    uport = upstream.getsockname()[1]
    doors = {}
    sockmap.KERNEL.on = True  # the kernel relay is off in a gateway by default (sockmap.ON)
    for name, size in SIZES.items():
        door = socket.create_server(("127.0.0.1", 0))
        doors[name] = door

        def serve(door: socket.socket = door, size: int = size) -> None:
            while True:
                c, _ = door.accept()
                u = _nd(socket.create_connection(("127.0.0.1", uport)))
                if size:
                    relay.PIPE_SIZE = size  # read when the tunnel's pipes are made
                    relay.start(_nd(c), u, lambda _result: None)
                else:
                    sockmap.start(_nd(c), u, lambda _result: None)
                c.close()
                u.close()

        threading.Thread(target=serve, daemon=True).start()
    plan = []
    for _ in range(rounds):
        plan += [("bulk", n, doors[n].getsockname()[1]) for n in SIZES]
        plan += [("rtt", n, doors[n].getsockname()[1]) for n in ("1M", "bpf")]
        plan += [("rtt", "direct", uport)]
        plan += [("events", n, doors[n].getsockname()[1]) for n in ("1M", "bpf")]
    q: Any = mp.Queue()
    far = mp.Process(target=_far_end, args=(upstream,), daemon=True)
    far.start()
    assert far.pid is not None
    child = mp.Process(target=_peers, args=(plan, far.pid, q, trace))
    child.start()
    while True:  # a child that fails says so on stderr; waiting on for it would hang
        try:
            out, traced = q.get(timeout=1)
            break
        except queue.Empty:
            if not child.is_alive():
                far.kill()
                why = f"relayloop: the peers' process ended with {child.exitcode}"
                raise SystemExit(why) from None
    child.join()
    far.kill()
    far.join()
    res: dict[str, Any] = {"rounds": rounds, "loadavg": os.getloadavg(), "bulk": {}}
    for n in SIZES:
        runs = [r for r in out if r[0] == "bulk" and r[1] == n]
        res["bulk"][n] = {
            "MB_s": [round(r[2]) for r in runs],
            "cpu_s_per_GB": [round(r[3] / (GB / 1e9), 3) for r in runs],
            "kworker_s_per_GB": [round(r[4] / (GB / 1e9), 3) for r in runs],
            "peers_s_per_GB": [round(r[5] / (GB / 1e9), 3) for r in runs],
            "all_s_per_GB": [round((r[3] + r[4] + r[5]) / (GB / 1e9), 3) for r in runs],
        }

    def rtt(name: str) -> dict[str, Any]:
        rt = [r for r in out if r[0] == "rtt" and r[1] == name]
        return {
            "median_us": [round(r[2], 1) for r in rt],
            "hub_cpu_us": [round(r[3], 1) for r in rt],
            "kworker_us": [round(r[4], 1) for r in rt],
            "peers_cpu_us": [round(r[5], 1) for r in rt],
            # every CPU a round trip costs: against direct's, what the relay adds
            "cpu_us": [round(r[3] + r[4] + r[5], 1) for r in rt],
        }

    def events(name: str) -> dict[str, Any]:
        ev = [r for r in out if r[0] == "events" and r[1] == name]
        return {"p50_ms": [round(r[2], 2) for r in ev], "p99_ms": [round(r[3], 2) for r in ev]}

    res["rtt"], res["events"] = rtt("1M"), events("1M")  # the hub (keys as before)
    joined = sockmap.KERNEL.maps is not None  # else the "bpf" rows are the hub's
    res["bpf"] = {"rtt": rtt("bpf"), "events": events("bpf"), "kernel": joined}
    res["bpf"]["routes"] = sockmap.KERNEL.routes()  # every tunnel in the kernel, or why not
    if trace:
        res["bpf"]["trace"] = traced
    res["direct"] = {"rtt": rtt("direct")}
    return res


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--trace"]
    print(json.dumps(main(int(args[0]) if args else 3, "--trace" in sys.argv), indent=1))
