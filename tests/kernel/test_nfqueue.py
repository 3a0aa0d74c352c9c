"""NFQUEUE first-flight gate against the real kernel: client ↔ router ↔ server namespaces.

    client  sg-tq<pid>-c  sgq-c 10.88.1.2/24, default via 10.88.1.1
    router  sg-tq<pid>-r  g1 10.88.1.1/24, sgq-rs 10.88.2.1/24, ip_forward=1,
                          a gateway-like nft inet forward chain (priority 0, policy drop),
                          the iptables-nft gate rules (net/iptables.py) and the reader
    server  sg-tq<pid>-s  sgq-s 10.88.2.2/24 (TLS on 443), 10.88.2.3/24 (raw TCP on 443)

The reader runs as its own process in the router namespace, as the gateway daemon would; it
holds each flow's data segments until the ClientHello's SNI is known (``FirstFlights``, judging
with the proxy's ``parse_client_hello``), allows "allowed.test" and denies everything else.
Client, server and reader are functions of this module run with ``ip netns exec``. Packets go
only to addresses inside these namespaces.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandgate import cleanup
from sandgate.errors import NetError
from sandgate.gateway.proxy.ca import make_ca, write_pair
from sandgate.gateway.proxy.firstflight import FirstFlights
from sandgate.gateway.proxy.sni import NeedMore, parse_client_hello
from sandgate.net import iptables
from sandgate.net.iptables import DECIDED, DENIED, Action, TlsGate
from sandgate.net.netlink import NetlinkError
from sandgate.net.nfqueue import NF_ACCEPT, NfqueueSocket, QueuedPacket, pack_verdict
from sandgate.net.ns import NsThread

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create namespaces"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("ip", "nft", "iptables-nft-restore")),
        reason="needs ip, nft and iptables-nft-restore (apt-get install iptables)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
QUEUE = 7
TLS_ADDR, RAW_ADDR = "10.88.2.2", "10.88.2.3"
MIB = 1 << 20

GATEWAY_NFT = """
table inet sg_tq {
  counter marked_at_gateway { }
  counter big_at_gateway { }
  chain forward {
    type filter hook forward priority 0; policy drop;
    ct state new ct mark set ct mark or 0x80000000
    iifname "g1" tcp dport 443 meta mark & 0x40000000 == 0x40000000 counter name marked_at_gateway
    iifname "g1" tcp dport 443 meta length > 200 counter name big_at_gateway
    ct state established,related accept
    iifname "g1" oifname "sgq-rs" tcp dport 443 accept
  }
}
"""


# --- the judge: the proxy's own ClientHello parser ----------------------------------------------


def judge_sni(first: object, first_flight: bytes) -> bool | None:
    """Allow "allowed.test" only; ``None`` while the hello is incomplete; ``Malformed`` raises
    (``FirstFlights`` turns that into a deny)."""
    hello = parse_client_hello(first_flight)
    return None if isinstance(hello, NeedMore) else hello.sni == "allowed.test"


def client_hello(sni: str) -> bytes:
    """A real ClientHello from this Python's OpenSSL, without a socket."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=sni)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


# --- processes: reader (router), server, client ------------------------------------------------


def reader_main() -> None:
    """The gate reader, as the gateway daemon would run it: one loop, one queue, one log."""
    queue, log_path = int(sys.argv[1]), sys.argv[2]
    gate = TlsGate(queue)
    flights = FirstFlights(judge_sni, timeout=2.0)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with NfqueueSocket(queue) as q, open(log_path, "w", buffering=1) as log:
        poller = select.poll()
        poller.register(q.fileno(), select.POLLIN)
        log.write('{"ready": true}\n')
        arrived: dict[int, float] = {}
        while not stop.is_set():
            poller.poll(50)
            now = time.monotonic()
            actions: list[tuple[QueuedPacket, Action]] = []
            for p in q.read():
                arrived[p.id] = time.perf_counter()
                actions += flights.feed(p, now)
            actions += flights.expire(now)
            done = []
            for p, action in actions:
                sent = time.perf_counter()
                q.verdict(p.id, **gate.verdict_args(p, action))
                done.append((p, action, sent, time.perf_counter()))
            for p, action, sent, t in done:
                came = arrived.pop(p.id)
                entry = {
                    "sport": p.sport,
                    "seq": p.tcp_seq,
                    "len": len(p.data),
                    "action": action.value,
                }
                times = {"arrived": came, "released": t, "held_us": (t - came) * 1e6,
                         "verdict_us": (t - sent) * 1e6}  # fmt: skip
                log.write(json.dumps({**entry, **times}) + "\n")
        log.write(json.dumps({"errors": q.errors, "overruns": q.overruns}) + "\n")


def server_main() -> None:
    """``tls CERT KEY``: TLS on TLS_ADDR:443, a thread per connection (request "N\\n" -> N bytes).
    ``raw``: raw TCP on RAW_ADDR:443, one connection at a time on one thread, so round trips
    measure the network and not thread start-up or the GIL (its own process for that reason)."""
    if sys.argv[1] == "raw":
        lsock = socket.create_server((RAW_ADDR, 443), backlog=256)
        print("ready", flush=True)
        while True:
            conn, _ = lsock.accept()
            conn.settimeout(5.0)  # a client that never finishes must not stall later tests
            with contextlib.suppress(OSError), conn:
                head = _recv_exact(conn, 5)
                _recv_exact(conn, int.from_bytes(head[3:5], "big"))
                conn.sendall(b"H")
                while cmd := conn.recv(1):
                    if cmd == b"p":
                        conn.sendall(b"p")
                    elif cmd == b"s":
                        _stream(conn, int.from_bytes(_recv_exact(conn, 8), "big"))
                        break
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[2], sys.argv[3])

    def tls_conn(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), ctx.wrap_socket(conn, server_side=True) as s:
            line = b""
            while not line.endswith(b"\n"):
                chunk = s.recv(64)
                if not chunk:
                    return
                line += chunk
            _stream(s, int(line))

    lsock = socket.create_server((TLS_ADDR, 443), backlog=256)
    print("ready", flush=True)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=tls_conn, args=(conn,), daemon=True).start()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return buf


def _stream(s: socket.socket, n: int) -> None:
    block = memoryview(bytes(MIB))
    while n > 0:
        s.sendall(block[: min(n, MIB)])
        n -= MIB


def client_main() -> None:
    spec = json.loads(sys.argv[1])
    out = {"tls": _client_tls, "raw_rtt": _client_raw_rtt, "raw_stream": _client_raw_stream}[
        spec["mode"]
    ](spec)
    print(json.dumps(out), flush=True)


def _connect(spec: dict[str, Any], addr: str) -> socket.socket:
    s = socket.socket()
    if spec.get("maxseg"):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, spec["maxseg"])
    s.settimeout(spec.get("timeout", 5.0))
    # Close with a reset: a failed client must not leave an orphan retransmitting its
    # ClientHello into later tests (a reset carries no payload, so it skips the queue).
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.connect((addr, 443))
    return s


def _client_tls(spec: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=spec["ca"])
    s = _connect(spec, TLS_ADDR)
    sport = s.getsockname()[1]
    print(json.dumps({"sport": sport}), flush=True)  # lets a test find this flow while it runs
    t0 = time.perf_counter()
    try:
        tls = ctx.wrap_socket(s, server_hostname=spec["sni"])
    except (OSError, ssl.SSLError) as exc:
        return {"ok": False, "error": type(exc).__name__, "elapsed": time.perf_counter() - t0}
    t1 = time.perf_counter()
    time.sleep(spec.get("pause", 0))
    n, got = spec.get("nbytes", 0), 0
    tls.sendall(b"%d\n" % n)
    t2 = time.perf_counter()
    buf = bytearray(MIB)
    while got < n:
        k = tls.recv_into(buf)
        if not k:
            break
        got += k
    t3 = time.perf_counter()
    tls.close()
    return {"ok": got == n, "sport": sport, "handshake_s": t1 - t0, "transfer_s": t3 - t2,
            "bytes": got}  # fmt: skip


def _client_raw_rtt(spec: dict[str, Any]) -> dict[str, Any]:
    hello = client_hello(spec["sni"])
    firsts, pings, sports = [], [], []
    for _ in range(spec["n"]):
        with _connect(spec, RAW_ADDR) as s:
            sports.append(s.getsockname()[1])
            t0 = time.perf_counter()
            s.sendall(hello)
            _recv_exact(s, 1)
            firsts.append(time.perf_counter() - t0)
            for _ in range(spec.get("pings", 1)):
                t0 = time.perf_counter()
                s.sendall(b"p")
                _recv_exact(s, 1)
                pings.append(time.perf_counter() - t0)
                time.sleep(spec.get("gap", 0))
    return {"first_s": firsts, "ping_s": pings, "sports": sports}


def _client_raw_stream(spec: dict[str, Any]) -> dict[str, Any]:
    with _connect(spec, RAW_ADDR) as s:
        s.sendall(client_hello(spec["sni"]))
        _recv_exact(s, 1)
        n, got = spec["nbytes"], 0
        t0 = time.perf_counter()
        s.sendall(b"s" + n.to_bytes(8, "big"))
        buf = bytearray(4 * MIB)
        while got < n and (k := s.recv_into(buf)):
            got += k
        return {"bytes": got, "seconds": time.perf_counter() - t0}


# --- fixtures ---------------------------------------------------------------------------------


def sh(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _certificates(tmp: Path) -> tuple[str, str, str]:
    """A test CA (the world's helper) and a leaf for both names: (CA, cert, key) paths."""
    ca = make_ca("sg-tq test CA", days=1)
    cert, key = write_pair(tmp, "leaf", *ca.issue(["allowed.test", "denied.test"], days=1))
    return str(write_pair(tmp, "ca", ca.cert_pem, ca.key_pem)[0]), str(cert), str(key)


def _py(fn: str, *args: str) -> list[str]:
    return [PY, "-c", f"from tests.kernel.test_nfqueue import {fn}; {fn}()", *args]


@dataclass
class Topo:
    client: str
    router: str
    server: str
    ca: str
    tmp: Path
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def router_path(self) -> str:
        return f"/run/netns/{self.router}"

    def run_client(self, **spec: Any) -> dict[str, Any]:
        spec.setdefault("ca", self.ca)
        done = subprocess.run(
            ["ip", "netns", "exec", self.client, *_py("client_main", json.dumps(spec))],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        return result

    def start_client(self, **spec: Any) -> subprocess.Popen[str]:
        spec.setdefault("ca", self.ca)
        argv = ["ip", "netns", "exec", self.client, *_py("client_main", json.dumps(spec))]
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def in_router(self, fn: Any) -> Any:
        with NsThread(self.router) as t:
            return t.call(fn)

    def counter(self, name: str) -> int:
        out = json.loads(sh("ip", "netns", "exec", self.router, "nft", "-j", "list", "counter",
                            "inet", "sg_tq", name))  # fmt: skip
        return int(next(x["counter"]["packets"] for x in out["nftables"] if "counter" in x))

    def conntrack(self) -> str:
        return sh("ip", "netns", "exec", self.router, "cat", "/proc/net/nf_conntrack")

    def gateway_table(self) -> None:
        """(Re)create the gateway-like table: its base chain registers after any existing one."""
        sh("ip", "netns", "exec", self.router, "nft", "-f", "-",
           stdin="table inet sg_tq\ndelete table inet sg_tq\n" + GATEWAY_NFT)  # fmt: skip


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topo]:
    tag = f"sg-tq{os.getpid()}"
    tmp = tmp_path_factory.mktemp("nfqueue")
    ca, cert, key = _certificates(tmp)
    t = Topo(client=f"{tag}-c", router=f"{tag}-r", server=f"{tag}-s", ca=ca, tmp=tmp)
    created: list[str] = []
    try:
        for ns in (t.router, t.client, t.server):
            cleanup.own(ns)  # a concurrent `sandgate cleanup` must leave these alone
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        r, c, s = t.router, t.client, t.server
        # Each veth is made in the router with its peer placed straight into the other namespace.
        sh("ip", "-n", r, "link", "add", "g1", "type", "veth", "peer", "sgq-c", "netns", c)
        sh("ip", "-n", r, "link", "add", "sgq-rs", "type", "veth", "peer", "sgq-s", "netns", s)
        for ns, dev, addrs in (
            (r, "g1", ["10.88.1.1/24"]),
            (r, "sgq-rs", ["10.88.2.1/24"]),
            (c, "sgq-c", ["10.88.1.2/24"]),
            (s, "sgq-s", [f"{TLS_ADDR}/24", f"{RAW_ADDR}/24"]),
        ):
            for addr in addrs:
                sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", c, "route", "add", "default", "via", "10.88.1.1")
        sh("ip", "-n", s, "route", "add", "default", "via", "10.88.2.1")
        sh("ip", "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        t.gateway_table()
        for args in (["tls", cert, key], ["raw"]):
            server = subprocess.Popen(
                ["ip", "netns", "exec", s, *_py("server_main", *args)],
                cwd=ROOT, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            t.procs.append(server)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        yield t
    finally:
        for proc in t.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        for ns in created:
            subprocess.run(["ip", "netns", "delete", ns], check=False)
            cleanup.disown(ns)


@pytest.fixture
def rules(topo: Topo) -> Iterator[TlsGate]:
    gate = TlsGate(QUEUE)
    topo.in_router(lambda: iptables.install(gate))
    try:
        yield gate
    finally:
        topo.in_router(iptables.remove)


class Reader:
    """The reader process in the router namespace, and the per-packet log it writes."""

    def __init__(self, topo: Topo) -> None:
        self.log = topo.tmp / f"reader-{time.monotonic_ns()}.jsonl"
        argv = ["ip", "netns", "exec", topo.router, *_py("reader_main", str(QUEUE), str(self.log))]
        self.proc = subprocess.Popen(argv, cwd=ROOT)
        deadline = time.monotonic() + 10
        while not (self.log.exists() and self.log.read_text().startswith('{"ready"')):
            assert self.proc.poll() is None, "reader died"
            assert time.monotonic() < deadline, "reader never became ready"
            time.sleep(0.01)

    def entries(self) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()[1:]
        return [e for e in map(json.loads, lines) if "sport" in e]

    def for_port(self, sport: int) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e["sport"] == sport]

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(5)
        last: dict[str, Any] = json.loads(self.log.read_text().splitlines()[-1])
        return last

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def reader(topo: Topo, rules: TlsGate) -> Iterator[Reader]:
    r = Reader(topo)
    try:
        yield r
    finally:
        if r.proc.poll() is None:
            summary = r.stop()
            assert summary.get("errors") == 0, summary


def next_queued(q: NfqueueSocket, dst: str = RAW_ADDR) -> QueuedPacket:
    """The next packet queued for ``dst``; anything else (a stray retransmission) is dropped."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        select.select([q.fileno()], [], [], 0.1)
        for p in q.read():
            if p.dst == dst:
                return p
            q.verdict(p.id, False)
    raise AssertionError(f"nothing queued for {dst}")


# --- tests ------------------------------------------------------------------------------------


def test_rules_land_in_the_forking_threads_namespace(topo: Topo) -> None:
    gate = TlsGate(QUEUE)
    with pytest.raises(NetError, match="host"):
        iptables.install(gate)  # this thread is in the host namespace: refused before forking
    with NsThread(topo.client) as t:  # a thread that entered the client namespace forks the child
        t.call(lambda: iptables.install(gate))
        try:
            client_rules = sh("ip", "netns", "exec", topo.client, "iptables-nft-save")
            router_rules = sh("ip", "netns", "exec", topo.router, "iptables-nft-save")
            assert f"NFQUEUE --queue-num {QUEUE}" in client_rules
            assert "NFQUEUE" not in router_rules
        finally:
            t.call(iptables.remove)
    assert sh("ip", "netns", "exec", topo.client, "nft", "list", "tables").strip() == ""


def test_allowed_flow_is_queued_once_then_runs_in_the_kernel(topo: Topo, reader: Reader) -> None:
    marked = topo.counter("marked_at_gateway")
    res = topo.run_client(mode="tls", sni="allowed.test", nbytes=100 * MIB)
    assert res["ok"], res
    queued = reader.for_port(res["sport"])
    print(f"\nallowed: handshake {res['handshake_s'] * 1e3:.2f} ms, 100 MiB in "
          f"{res['transfer_s']:.3f} s, queued {len(queued)}: {queued}")  # fmt: skip
    assert 1 <= len(queued) <= 4
    assert all(e["action"] == "allow" for e in queued)
    # The gateway's chain (priority 0) saw the ClientHello already carrying the verdict's mark:
    # the queue (mangle, -150) ran before it.
    assert topo.counter("marked_at_gateway") > marked
    # The ct mark kept the gateway's own bit (0x80000000) next to the decided bit.
    line = next(ln for ln in topo.conntrack().splitlines() if f"sport={res['sport']} " in ln)
    assert f"mark={0x80000000 | DECIDED}" in line


def test_denied_flow_gets_a_reset_fast(topo: Topo, reader: Reader) -> None:
    res = topo.run_client(mode="tls", sni="denied.test", timeout=3.0)
    print(f"\ndenied: {res}")
    assert not res["ok"] and res["error"] == "ConnectionResetError", res
    assert res["elapsed"] < 1.0  # a drop would wait out the 3 s timeout; 1 s spares a loaded CI


def test_split_client_hello_is_held_until_whole(topo: Topo, reader: Reader) -> None:
    res = topo.run_client(mode="tls", sni="allowed.test", nbytes=MIB, maxseg=120)
    assert res["ok"], res
    queued = reader.for_port(res["sport"])
    print(f"\nsplit: {len(queued)} segments queued: {queued}")
    assert len(queued) >= 2 and all(e["action"] == "allow" for e in queued)
    # Released in sequence order, none before the last segment had arrived.
    assert [e["seq"] for e in queued] == sorted(e["seq"] for e in queued)
    assert min(e["released"] for e in queued) >= max(e["arrived"] for e in queued)
    denied = topo.run_client(mode="tls", sni="denied.test", maxseg=120, timeout=3.0)
    assert denied["error"] == "ConnectionResetError" and denied["elapsed"] < 1.0, denied


def test_no_reader_means_no_passage(topo: Topo, rules: TlsGate) -> None:
    big = topo.counter("big_at_gateway")
    res = topo.run_client(mode="tls", sni="allowed.test", timeout=1.0)
    assert not res["ok"] and res["error"] in ("TimeoutError", "timeout"), res
    # Neither the ClientHello nor its retransmissions ever reached the gateway's chain.
    assert topo.counter("big_at_gateway") == big


def test_socket_contract(topo: Topo, rules: TlsGate) -> None:
    with pytest.raises(NetlinkError) as info:
        NfqueueSocket.in_netns(topo.router_path, QUEUE, conntrack=True).close()
    assert info.value.errno == errno.EOPNOTSUPP  # this kernel: no NETLINK_GLUE_CT
    q = NfqueueSocket.in_netns(topo.router_path, QUEUE)
    try:
        with pytest.raises(NetlinkError) as info:
            NfqueueSocket.in_netns(topo.router_path, QUEUE)
        assert info.value.errno == errno.EPERM  # one listener per queue and namespace
        q.verdict(123456, True)  # nobody holds this id: the error arrives later
        select.select([q.fileno()], [], [], 1.0)
        assert q.read() == [] and (q.errors, q.last_errno) == (1, errno.ENOENT)
        # A packet held when the socket closes is dropped, not released.
        client = topo.start_client(mode="raw_rtt", sni="allowed.test", n=1, timeout=1.0)
        next_queued(q)
    finally:
        q.close()
    assert client.wait(10) != 0  # its ClientHello never reached the server: timeout


def test_killing_the_reader_spares_decided_flows(topo: Topo, rules: TlsGate) -> None:
    r = Reader(topo)
    try:
        running = topo.start_client(mode="tls", sni="allowed.test", nbytes=20 * MIB, pause=0.6)
        assert running.stdout is not None
        sport = json.loads(running.stdout.readline())["sport"]
        deadline = time.monotonic() + 5
        # By port: the log may hold other flows (an earlier client's retransmission, say).
        while not any(e["action"] == "allow" for e in r.for_port(sport)):
            assert time.monotonic() < deadline, "the flow never got its verdict"
            time.sleep(0.01)
    finally:
        r.kill()  # SIGKILL: the queue is unbound by the kernel, nothing is flushed by us
    out, _ = running.communicate(timeout=30)
    res = json.loads(out.splitlines()[-1])
    assert res["ok"] and res["bytes"] == 20 * MIB, res
    late = topo.run_client(mode="tls", sni="allowed.test", timeout=1.0)
    assert not late["ok"], late


def test_gateway_chain_registered_after_iptables_filter(topo: Topo, reader: Reader) -> None:
    # Same priority 0, other registration order: an accept is not final, the REJECT still runs.
    topo.gateway_table()
    try:
        denied = topo.run_client(mode="tls", sni="denied.test", timeout=3.0)
        assert denied["error"] == "ConnectionResetError" and denied["elapsed"] < 1.0, denied
        assert topo.run_client(mode="tls", sni="allowed.test", nbytes=MIB)["ok"]
    finally:
        topo.gateway_table()


def test_a_denied_flows_replies_are_reset_too(topo: Topo, rules: TlsGate) -> None:
    """The deny bit stops a flow's packets both ways (the filter rules test the gate's port at
    either end, issue 13): set on the server's SYN-ACK here, as a verdict sets it on the flow,
    the SYN-ACK is reset, so the connection never opens: the retransmitted SYN meets the other
    rule's reset, "refused". Without the reply-side rule the SYN-ACK passes and the handshake
    completes (then its ACK is reset: "reset by peer", or a connect that succeeds)."""
    marks = f"{DECIDED | DENIED:#x}"
    sh("ip", "netns", "exec", topo.router, "nft", "-f", "-", stdin=(
        "table inet sg_tq_x { chain f { type filter hook forward priority -200;"
        f" ip saddr {RAW_ADDR} tcp sport 443 ct mark set ct mark or {marks}; }}; }}\n"
    ))  # fmt: skip
    try:
        code = f"import socket; socket.create_connection(({RAW_ADDR!r}, 443), timeout=4)"
        done = subprocess.run(
            ["ip", "netns", "exec", topo.client, PY, "-c", code],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode != 0 and "ConnectionRefusedError" in done.stderr, done.stderr
    finally:
        sh("ip", "netns", "exec", topo.router, "nft", "delete", "table", "inet", "sg_tq_x")


def test_verdict_ct_mark_is_ignored_but_repeat_sets_it(topo: Topo, rules: TlsGate) -> None:
    q = NfqueueSocket.in_netns(topo.router_path, QUEUE)
    try:
        client = topo.start_client(mode="raw_rtt", sni="allowed.test", n=1, pings=2, gap=0.2)

        hello = next_queued(q)
        assert judge_sni(hello, hello.data) is True
        # NFQA_CT with CTA_MARK, sent raw: the kernel (no NETLINK_GLUE_CT) ignores it ...
        os.write(q.fileno(), pack_verdict(QUEUE, hello.id, NF_ACCEPT, ct_mark=DECIDED))
        ping = next_queued(q)  # ... so the flow's next data segment is queued again
        assert ping.data == b"p" and ping.sport == hello.sport
        q.verdict(ping.id, True, mark=rules.allow_mark(ping.mark), repeat=True)
        out, _ = client.communicate(timeout=10)
        assert len(json.loads(out)["ping_s"]) == 2
        # The second ping skipped the queue: repeat + CONNMARK set the ct bit.
        assert not [p for p in q.read() if p.sport == hello.sport]
        assert q.errors == 0
    finally:
        q.close()


def test_measure(topo: Topo, rules: TlsGate) -> None:
    """Figures for the report, gated and plain runs interleaved so drift hits both alike."""
    gated: dict[str, list[float]] = {"mbps": [], "first": [], "ping": []}
    plain: dict[str, list[float]] = {"mbps": [], "first": [], "ping": []}
    sports: list[int] = []

    def run(into: dict[str, list[float]]) -> None:
        res = topo.run_client(mode="raw_stream", sni="allowed.test", nbytes=384 * MIB)
        assert res["bytes"] == 384 * MIB
        into["mbps"].append(res["bytes"] / res["seconds"] / 1e6)
        res = topo.run_client(mode="raw_rtt", sni="allowed.test", n=30, pings=3)
        into["first"] += res["first_s"]
        into["ping"] += res["ping_s"]
        if into is gated:
            sports.extend(res["sports"])

    r = Reader(topo)
    try:
        for _ in range(3):
            run(gated)
            topo.in_router(iptables.remove)
            run(plain)
            topo.in_router(lambda: iptables.install(rules))
        per_conn = [len(r.for_port(p)) for p in sports]
        held = statistics.median(e["held_us"] for e in r.entries())
        verdict = statistics.median(e["verdict_us"] for e in r.entries())
    finally:
        assert r.stop()["errors"] == 0

    def med(d: dict[str, list[float]], key: str, scale: float = 1e6) -> float:
        return statistics.median(d[key]) * (1 if key == "mbps" else scale)

    def pct(xs: list[float]) -> list[int]:
        q = statistics.quantiles(xs, n=10)
        return [round(q[0] * 1e6), round(statistics.median(xs) * 1e6), round(q[-1] * 1e6)]

    ratio = med(gated, "mbps") / med(plain, "mbps")
    print(
        f"\nthroughput MB/s: gated {med(gated, 'mbps'):.0f} {[round(x) for x in gated['mbps']]}"
        f" plain {med(plain, 'mbps'):.0f} {[round(x) for x in plain['mbps']]} ratio {ratio:.2f}"
        f"\nfirst-flight round trip p10/p50/p90 us: gated {pct(gated['first'])}, plain"
        f" {pct(plain['first'])}"
        f"\nfirst-flight round trip: gated {med(gated, 'first'):.0f} us, plain"
        f" {med(plain, 'first'):.0f} us, added {med(gated, 'first') - med(plain, 'first'):.0f} us;"
        f" later round trips {med(gated, 'ping'):.0f} vs {med(plain, 'ping'):.0f} us"
        f"\nreader: read to verdict {held:.0f} us, of which the verdict write {verdict:.0f} us"
        f"\nqueued packets per connection: {sorted(set(per_conn))} over {len(per_conn)}"
    )
    # The first flight only: one packet per connection, or two where the client's TCP resent
    # its ClientHello while the verdict was pending (a loaded machine: 14 of 90 in one CI run,
    # so how many is timing, not asserted beyond most); every later packet of a connection
    # (its three pings) passes in the kernel.
    assert set(per_conn) <= {1, 2} and per_conn.count(1) >= 0.5 * len(per_conn), per_conn
    assert ratio > 0.3  # a sanity bound: on a shared 2-vCPU VM the figure swings 0.6-1.6
