"""The inspected path alone, on loopback: CPU per GB and per request through ``http1.serve``.

``PYTHONPATH=src:. python -m bench.proxyloop [ROUNDS]`` (only 127.0.0.1; no namespaces, no
gateway). The upstream is bench/tls_server.py (a child process), the client curl (a child
too), so this process's CPU (user + system) is the inspecting proxy's alone: TLS terminated
with a leaf from the gateway's own CA code (tls.Leaves), the request judged by ``decide()``
through http1.py as on the gateway, the upstream dialled over TLS (tlsio.TlsStream) with session
resumption. Events go to a list: the sink's share (the loop, attribution, the store) is not in
these figures, which is what makes them steady enough to compare two versions of the proxy on a
loaded machine. Per round: 1 GiB (``/bulk``), then ``SMALL`` keep-alive requests (``/small``)
through the proxy and straight to the upstream (``direct``: the added round trip is the
difference of the medians); per bulk, the cores the proxy, curl and the server kept busy.
``PROXYLOOP_NO_BULK=1``: the requests only; ``PROXYLOOP_PROFILE=FILE``: the requests only,
each connection under cProfile on thread CPU time (pstats dumped to FILE).

Figures (2026-12-01, load 3-4 on 2 cores, paired and interleaved with main as it was): CPU a
request 657 -> 468 µs, added round trip 654 -> 450 µs (flow.Judgements, tlsio's reads).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sandgate.events.schema import Event
from sandgate.gateway.proxy import http1
from sandgate.gateway.proxy.ca import make_ca
from sandgate.gateway.proxy.flow import ProxyGuest
from sandgate.gateway.proxy.tls import Leaves
from sandgate.gateway.proxy.tlsio import Sessions, Stream, TlsStream
from sandgate.net.compile import GuestLink
from sandgate.policy.load import parse_policy

NAME = "tls.loop.test"
LOOP = ipaddress.IPv4Address("127.0.0.1")
SIZE = 1 << 30
SMALL = 3000
CORES = ("proxy_cores", "curl_cores", "server_cores")
POLICY_TOML = f"""\
[profiles.p]
internet = "open"
allow = [{{ host = "127.0.0.1" }}]
inspect = ["{NAME}"]
"""
POLICY = parse_policy(POLICY_TOML.encode(), "proxyloop.toml")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _children_cpu() -> float:
    t = os.times()  # curl's, once subprocess.run has waited for it
    return t.children_user + t.children_system


def _pid_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Loop:
    """The proxy side: a listener on 127.0.0.1 whose connections are served as inspected TLS."""

    def __init__(self, up_port: int, ca_file: Path, leaves: Leaves) -> None:
        self.up_port = up_port
        self.leaves = leaves
        self.upstream = ssl.create_default_context(cafile=str(ca_file))
        self.upstream.set_alpn_protocols(["http/1.1"])
        self.sessions = Sessions()
        self.events: list[Event] = []
        link = GuestLink(
            0, "g0", ipaddress.IPv4Network("10.9.0.0/30"), ipaddress.IPv4Address("10.9.0.1"),
            ipaddress.IPv4Address("10.9.0.2"), "02:00:00:00:00:01",
        )  # fmt: skip
        self.guest = ProxyGuest(link, None, POLICY.profile("p"))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _dial(self, address: str, port: int, tls_name: str | None) -> Stream:
        sock = socket.create_connection((address, self.up_port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert tls_name is not None
        tls = TlsStream(
            sock, self.upstream, server_side=False, server_hostname=tls_name,
            session=self.sessions.get(tls_name, port),
            on_close=lambda s: self.sessions.put(tls_name, port, s),
        )  # fmt: skip
        tls.handshake(10)
        return tls

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        with conn:
            tls = TlsStream(conn, self.leaves.context(NAME), server_side=True)
            try:
                tls.handshake(10)
            except (ssl.SSLError, OSError):
                return
            ctx = http1.Ctx(
                guest=self.guest, door="transparent", client=peer,
                original_dst=("127.0.0.1", 443), resolve=lambda name: [LOOP], dial=self._dial,
                emit=lambda key, e: self.events.append(e), tls_name=NAME,
            )  # fmt: skip
            profile = None
            if os.environ.get("PROXYLOOP_PROFILE"):  # CPU, not wall: cProfile on thread_time
                import cProfile

                profile = cProfile.Profile(time.thread_time)
                profile.enable()
            with contextlib.suppress(OSError, ssl.SSLError):
                http1.serve(tls, ctx)
            if profile is not None:
                profile.disable()
                profile.dump_stats(os.environ["PROXYLOOP_PROFILE"])


def curl(port: int, ca: Path, *urls: str, fmt: str) -> list[str]:
    argv = [
        "curl", "-sS", "--http1.1", "--max-time", "120", "--cacert", str(ca),
        "--resolve", f"{NAME}:{port}:127.0.0.1", "-o", "/dev/null", "-w", fmt, *urls,
    ]  # fmt: skip
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return out.split()


def main(rounds: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sandgate-proxyloop-"))
    world = make_ca("proxyloop upstream CA", days=2)  # the upstream's CA (the "public" one)
    cert_pem, key_pem = world.issue([NAME], days=2)
    (tmp / "up.pem").write_bytes(cert_pem + world.cert_pem)
    (tmp / "up.key").write_bytes(key_pem)
    (tmp / "world.pem").write_bytes(world.cert_pem)
    gw = make_ca("proxyloop gateway CA", days=2)
    (tmp / "gw.pem").write_bytes(gw.cert_pem)
    probe = socket.create_server(("127.0.0.1", 0))
    up_port = probe.getsockname()[1]
    probe.close()
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("tls_server.py")), "127.0.0.1",
         str(up_port), str(tmp / "up.pem"), str(tmp / "up.key")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    server.stdout.readline()  # READY
    loop = Loop(up_port, tmp / "world.pem", Leaves(gw))
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(rounds):
            row: dict[str, Any] = {}
            if os.environ.get("PROXYLOOP_PROFILE") or os.environ.get("PROXYLOOP_NO_BULK"):
                for key in ("bulk_MB_s", "cpu_s_per_GB", *CORES):
                    row[key] = 0.0
            else:
                before, kids, srv = _cpu(), _children_cpu(), _pid_cpu(server.pid)
                code, size, total = curl(
                    loop.port, tmp / "gw.pem", f"https://{NAME}:{loop.port}/bulk?size={SIZE}",
                    fmt=r"%{http_code} %{size_download} %{time_total}\n",
                )  # fmt: skip
                cpu = _cpu() - before
                assert code == "200" and int(size) == SIZE, (code, size)
                row["bulk_MB_s"] = SIZE / float(total) / 1e6
                row["cpu_s_per_GB"] = cpu / (SIZE / 1e9)
                # Cores each side kept busy: the proxy near 1.0 is its one thread's ceiling; all
                # of them near the machine's cores (2 here), the CPU is (docs/NOTES.md).
                wall = float(total)
                row["proxy_cores"] = cpu / wall
                row["curl_cores"] = (_children_cpu() - kids) / wall
                row["server_cores"] = (_pid_cpu(server.pid) - srv) / wall
            for key, port, trust in (
                ("direct", up_port, tmp / "world.pem"),
                ("proxy", loop.port, tmp / "gw.pem"),
            ):
                before = _cpu()
                # The same URL each time, as bench/run proxy asks it (proxy_agents.py's rtt).
                urls = [f"https://{NAME}:{port}/small"] * SMALL
                out = curl(port, trust, *urls, fmt=r"T%{time_total}\n")  # -o: the first only
                times = [t[1:] for t in out if t.startswith("T")]
                cpu = _cpu() - before
                us = [float(t) * 1e6 for t in times[1:]]  # the first carries the handshake
                row[f"{key}_rtt_median_us"] = statistics.median(us)
                if key == "proxy":
                    row["cpu_us_per_request"] = cpu / len(times) * 1e6
            row["added_us"] = row["proxy_rtt_median_us"] - row["direct_rtt_median_us"]
            rows.append({k: round(v, 2) for k, v in row.items()})
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        loop.listener.close()
        loop.leaves.close()
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    keys = rows[0].keys()
    return {
        "rounds": rows,
        "median": {k: round(statistics.median(r[k] for r in rows), 2) for k in keys},
        "load": os.getloadavg(),
        "events": len(loop.events),
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3), indent=1))
