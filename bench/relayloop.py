"""The relays alone, on loopback: CPU per GB by pipe size, round trips, and event delays.

``PYTHONPATH=src:. python -m bench.relayloop [ROUNDS]`` (nothing but 127.0.0.1; the kernel relay,
sockmap.py, needs root, else its rows are the hub's). The peers (a sender, a sink, an echo) run
in a child process, so this process's CPU is the relay's alone. Per round, interleaved: 1 GiB
through hub tunnels with 64 KiB, 256 KiB and 1 MiB pipes and through the kernel relay ("bpf");
5,000 one-byte round trips through the hub, the kernel relay and no relay at all ("direct": the
added round trip is the difference); 500 small events 5 ms apart (their delay, one clock).

The kernel relay's work runs in softirq (the program, on the sender's CPU time) and in kworker
threads (the send to the peer): this process's CPU does not show it, so ``bpf`` also reports
every kworker thread's CPU during its runs (``kworker_s_per_GB``, ``kworker_us``: an upper bound,
the neighbours' kworker time is in it too).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
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


def _hub_cpu() -> float:
    """The parent's (the hub's process) user + system seconds."""
    with open(f"/proc/{os.getppid()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kworkers() -> float:
    """User + system seconds of every kworker thread now."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        head, tail = raw.rsplit(")", 1)
        if "(kworker" in head:
            fields = tail.split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _far_end(listener: socket.socket) -> None:
    """The upstream: b = sink (reads to EOF, answers one byte), e = echo, s = event source."""
    while True:
        s, _ = listener.accept()

        def talk(s: socket.socket = s) -> None:
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

        threading.Thread(target=talk, daemon=True).start()


def _peers(listener: socket.socket, plan: list[tuple[str, str, int]], q: Any) -> None:
    threading.Thread(target=_far_end, args=(listener,), daemon=True).start()
    out = []
    for kind, name, port in plan:
        c = _nd(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.01)  # the relay has joined the tunnel
        c0, k0, t0 = _hub_cpu(), _kworkers(), time.perf_counter()
        if kind == "bulk":
            c.sendall(b"b")
            data = bytes(1 << 20)
            for _ in range(GB >> 20):
                c.sendall(data)
            c.shutdown(socket.SHUT_WR)
            c.recv(1)
            secs, k = time.perf_counter() - t0, _kworkers() - k0
            out.append((kind, name, GB / secs / 1e6, _hub_cpu() - c0, k))
        elif kind == "rtt":
            c.sendall(b"e")
            times = []
            for _ in range(5000):
                t = time.perf_counter()
                c.sendall(b"x")
                c.recv(100)
                times.append(time.perf_counter() - t)
            cpu_us = (_hub_cpu() - c0) / 5000 * 1e6
            k = (_kworkers() - k0) / 5000 * 1e6
            out.append((kind, name, statistics.median(times) * 1e6, cpu_us, k))
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
    q.put(out)


def main(rounds: int) -> dict[str, Any]:
    upstream = socket.create_server(("127.0.0.1", 0))
    uport = upstream.getsockname()[1]
    doors = {}
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
    child = mp.Process(target=_peers, args=(upstream, plan, q))
    child.start()
    out = q.get()
    child.join()
    res: dict[str, Any] = {"rounds": rounds, "loadavg": os.getloadavg(), "bulk": {}}
    for n in SIZES:
        runs = [r for r in out if r[0] == "bulk" and r[1] == n]
        res["bulk"][n] = {
            "MB_s": [round(r[2]) for r in runs],
            "cpu_s_per_GB": [round(r[3] / (GB / 1e9), 3) for r in runs],
            "kworker_s_per_GB": [round(r[4] / (GB / 1e9), 3) for r in runs],
        }

    def rtt(name: str) -> dict[str, Any]:
        rt = [r for r in out if r[0] == "rtt" and r[1] == name]
        return {
            "median_us": [round(r[2], 1) for r in rt],
            "hub_cpu_us": [round(r[3], 1) for r in rt],
            "kworker_us": [round(r[4], 1) for r in rt],
        }

    def events(name: str) -> dict[str, Any]:
        ev = [r for r in out if r[0] == "events" and r[1] == name]
        return {"p50_ms": [round(r[2], 2) for r in ev], "p99_ms": [round(r[3], 2) for r in ev]}

    res["rtt"], res["events"] = rtt("1M"), events("1M")  # the hub (keys as before)
    joined = sockmap.KERNEL.maps is not None  # else the "bpf" rows are the hub's
    res["bpf"] = {"rtt": rtt("bpf"), "events": events("bpf"), "kernel": joined}
    res["direct"] = {"rtt": rtt("direct")}
    return res


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
