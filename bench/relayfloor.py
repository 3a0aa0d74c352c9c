"""The floor of a userspace relay here: sandgate's hub beside HAProxy and socat, on loopback.

``bench/run``'s python: ``PYTHONPATH=src:. python -m bench.relayfloor [ROUNDS] [BASE_TREE]``
(root: it makes a network namespace ``sg-rfloor-PID``, loopback only, and removes it). In it: an
echo server and a sink (forked children), sandgate's relay hub in a process of its own (and,
with BASE_TREE, a second hub imported from that checkout, for paired runs of a change), HAProxy
2.6 ``mode tcp`` without and with ``option splice-auto`` and socat (``fork``) if installed. Per
round, interleaved (the order reversed every other round): 2,000 64-byte round trips on one
connection (median; "+" is over no relay at all) and the relay's CPU per round trip, then 64 MiB
one way and the relay's CPU per GB. CPU from /proc/PID/task/*/schedstat (nanoseconds), socat's
with its live per-connection children. Every relay does the same work a message: a wake-up, one
read, one send (a second pass through TCP), so what is left between them is their own cost.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ECHO, SINK = 9000, 9100  # a relay listens at port + k to echo, port + 100 + k to the sink
N_RT = 2000
BULK = 64 << 20
MSG = b"x" * 64
HAPROXY = """\
global
    maxconn 256
defaults
    mode tcp
    timeout connect 5s
    timeout client 60s
    timeout server 60s
listen tcp
    bind 127.0.0.1:9003
    server echo 127.0.0.1:9000
listen tcp_bulk
    bind 127.0.0.1:9103
    server sink 127.0.0.1:9100
listen splice
    bind 127.0.0.1:9004
    option splice-auto
    server echo 127.0.0.1:9000
listen splice_bulk
    bind 127.0.0.1:9104
    option splice-auto
    server sink 127.0.0.1:9100
"""


def _serve(port: int, sink: bool) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # no zombies from the forks
    listener = socket.create_server(("127.0.0.1", port), backlog=64)
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if os.fork() == 0:
            listener.close()
            buf = bytearray(1 << 20)
            total = 0
            while got := conn.recv_into(buf):
                total += got
                if not sink:
                    conn.sendall(buf[:got])
            if sink:
                conn.sendall(b"%d\n" % total)
            os._exit(0)
        conn.close()


def _hub(tree: str, port: int) -> None:
    sys.path[:0] = [f"{tree}/src", tree]
    threading.Thread(target=serve_hub, args=("127.0.0.1", port + 100, "127.0.0.1", SINK),
                     daemon=True).start()  # fmt: skip
    serve_hub("127.0.0.1", port, "127.0.0.1", ECHO)


def serve_hub(host: str, port: int, to_host: str, to: int) -> None:
    """Accept, dial the peer, hand both to the hub: as the gateway's CONNECT does after its 200.
    (Also bench/run proxy's ``hub-tcp`` peer: ``python -m bench.relayfloor --hub H P TH TP``.)"""
    from sandgate.gateway.proxy import relay  # the first tree on sys.path: the caller's choice

    listener = socket.create_server((host, port), backlog=64)
    while True:
        client, _ = listener.accept()
        upstream = socket.create_connection((to_host, to))
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def done(_result: relay.RelayResult, c: socket.socket = client,
                 u: socket.socket = upstream) -> None:  # fmt: skip
            c.close()
            u.close()

        relay.start(client, upstream, done)


def _cpu_ns(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def _tree_ns(pid: int) -> int:
    """The process and its live children (socat's per-connection forks)."""
    total = _cpu_ns(pid)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                total += _cpu_ns(int(d.name))
    return total


def _round_trips(port: int, pid: int) -> tuple[float, float]:
    """(median µs, relay CPU µs per round trip)."""
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(50):  # warm: the relay's tunnel exists, the caches are hot
        conn.sendall(MSG)
        conn.recv(100)
    times = []
    cpu = _tree_ns(pid) if pid else 0
    for _ in range(N_RT):
        t0 = time.perf_counter_ns()
        conn.sendall(MSG)
        got = len(conn.recv(100))
        while got < len(MSG):
            got += len(conn.recv(100))
        times.append(time.perf_counter_ns() - t0)
    cpu = (_tree_ns(pid) - cpu) if pid else 0
    conn.close()
    return statistics.median(times) / 1e3, cpu / N_RT / 1e3


def _bulk(port: int, pid: int) -> tuple[float, float]:
    """(MB/s, relay CPU s per GB) for BULK bytes one way; the sink says how many it got."""
    conn = socket.create_connection(("127.0.0.1", port))
    chunk = memoryview(bytes(1 << 20))
    cpu = _tree_ns(pid) if pid else 0
    t0 = time.perf_counter()
    left = BULK
    while left:
        left -= conn.send(chunk[: min(left, len(chunk))])
    cpu = (_tree_ns(pid) - cpu) if pid else 0  # before the end: socat's child still lives
    conn.shutdown(socket.SHUT_WR)
    got = int(conn.recv(100).split()[0])
    seconds = time.perf_counter() - t0
    conn.close()
    if got != BULK:
        raise RuntimeError(f"the sink got {got} of {BULK} bytes through port {port}")
    return BULK / seconds / 1e6, cpu / 1e9 / (BULK / 1e9)


def inside(rounds: int, base: str | None) -> None:
    ctx = mp.get_context("fork")
    tree = str(Path(__file__).resolve().parents[1])
    kids = [ctx.Process(target=_serve, args=(p, p == SINK), daemon=True) for p in (ECHO, SINK)]
    kids.append(ctx.Process(target=_hub, args=(tree, 9001), daemon=True))
    if base:
        kids.append(ctx.Process(target=_hub, args=(base, 9002), daemon=True))
    for kid in kids:
        kid.start()
    procs: list[subprocess.Popen[bytes]] = []
    conf = Path(f"/tmp/sg-rfloor-{os.getpid()}.cfg")  # HAProxy's, removed at the end
    targets: dict[str, tuple[int, int]] = {"direct": (0, 0), "hub": (1, kids[2].pid or 0)}
    if base:
        targets["hub-base"] = (2, kids[3].pid or 0)
    if haproxy := shutil.which("haproxy"):
        conf.write_text(HAPROXY)
        procs.append(subprocess.Popen([haproxy, "-db", "-f", str(conf)]))
        targets["haproxy-tcp"] = (3, procs[-1].pid)
        targets["haproxy-splice"] = (4, procs[-1].pid)
    if socat := shutil.which("socat"):
        for k, to in ((5, ECHO), (105, SINK)):
            listen = f"TCP-LISTEN:{ECHO + k},bind=127.0.0.1,reuseaddr,fork"
            procs.append(subprocess.Popen([socat, listen, f"TCP:127.0.0.1:{to}"]))
        targets["socat"] = (5, procs[-2].pid)
    time.sleep(1.5)
    res: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in targets}
    try:
        for r in range(rounds):
            for key in list(targets)[:: 1 if r % 2 == 0 else -1]:
                k, pid = targets[key]
                bulk_pid = procs[-1].pid if key == "socat" else pid  # socat: a process a port
                res[key].append(
                    (*_round_trips(ECHO + k, pid), *_bulk(SINK + k, bulk_pid))
                )  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        for kid in kids:
            kid.kill()
        conf.unlink(missing_ok=True)
    med = statistics.median
    direct = med(x[0] for x in res["direct"])
    print(f"relayfloor: {rounds} rounds, {N_RT} round trips of {len(MSG)} B and {BULK >> 20} MiB"
          f" each a round; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for key, runs in res.items():
        rt = med(x[0] for x in runs)
        print(f"{key:15} rt {rt:6.1f} µs ({rt - direct:+5.1f})  relay CPU"
              f" {med(x[1] for x in runs):5.1f} µs/rt   {med(x[2] for x in runs):5.0f} MB/s"
              f"  relay CPU {med(x[3] for x in runs):.3f} s/GB")  # fmt: skip
    if base:
        diffs = [a[1] - b[1] for a, b in zip(res["hub"], res["hub-base"], strict=True)]
        print(f"hub - hub-base, paired per round: CPU/rt {med(diffs):+.2f} µs,"
              f" lower in {sum(d < 0 for d in diffs)}/{len(diffs)} rounds")  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--hub"]:
        host, port, to_host, to = sys.argv[2:6]
        serve_hub(host, int(port), to_host, int(to))
        return
    if os.environ.get("SG_RFLOOR_INSIDE"):
        inside(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
        return
    name = f"sg-rfloor-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        argv = [sys.executable, "-m", "bench.relayfloor", *(sys.argv[1:] or ["10"])]
        env = {**os.environ, "SG_RFLOOR_INSIDE": "1"}
        subprocess.run(["ip", "netns", "exec", name, *argv], check=True, env=env)
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


if __name__ == "__main__":
    main()
