"""NflogSocket against the real kernel, in two throwaway namespaces joined by a veth pair.

    guest  sg-tnflog-<pid>-c   sgv-c 10.77.0.2/24, default via 10.77.0.1
    gateway sg-tnflog-<pid>-g  sgv-g 10.77.0.1/24, forwards 203.0.113.0/24 to sg-ifb (a blackhole)

The guest's output chain logs and drops 203.0.113.0/25 (group 5, with a limit), a rate-limited
port (group 6), a burst port (group 9) and ARP (group 10); the gateway's forward chain logs and
drops everything (group 7). Packets go only to loopback and into these namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sandgate.net.netlink import NetlinkError, run_in_netns
from sandgate.net.nflog import NflogPacket, NflogSocket

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create namespaces"),
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("ip", "nft", "setpriv")),
        reason="needs ip, nft and setpriv",
    ),
]

PYTHON = "/usr/bin/python3"
NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
SO_NETNS_COOKIE = 71

GUEST_RULES = """
table inet sg_t {
  chain out {
    type filter hook output priority 0; policy accept;
    ip daddr 203.0.113.0/25 limit rate 1000/second burst 100 packets log prefix "sg-deny " group 5
    ip daddr 203.0.113.0/25 drop
    ip6 daddr ::1 udp dport 5353 log prefix "sg-deny6 " group 5 drop
    udp dport 9000 limit rate 10/second burst 5 packets log prefix "sg-limit " group 6
    udp dport 9000 drop
    udp dport 9999 log prefix "sg-burst " group 9 drop
  }
}
table arp sg_t {
  chain out {
    type filter hook output priority 0; policy accept;
    log prefix "sg-arp " group 10
  }
}
"""

GATEWAY_RULES = """
table inet sg_t {
  chain forward {
    type filter hook forward priority 0; policy drop;
    limit rate 1000/second burst 100 packets log prefix "sg-fwd " group 7
  }
}
"""


def sh(*argv: str, stdin: str | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Topology:
    guest: str
    gateway: str

    @property
    def guest_path(self) -> str:
        return f"/run/netns/{self.guest}"

    @property
    def gateway_path(self) -> str:
        return f"/run/netns/{self.gateway}"

    def ifindex(self, path: str, name: str) -> int:
        return run_in_netns(path, lambda: socket.if_nametoindex(name))

    def python(self, code: str, *args: str, as_nobody: bool = False) -> str:
        """Run ``code`` in the guest namespace, as uid/gid 65534 if asked."""
        prefix = NOBODY if as_nobody else []
        return sh("ip", "netns", "exec", self.guest, *prefix, PYTHON, "-I", "-c", code, *args)


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    tag = f"sg-tnflog-{os.getpid()}"
    t = Topology(guest=f"{tag}-c", gateway=f"{tag}-g")
    g, c = t.gateway, t.guest
    created: list[str] = []
    try:
        for ns in (g, c):
            sh("ip", "netns", "add", ns)
            created.append(ns)
            # No IPv6 on the links we add (no stray neighbour solicitations); lo keeps it.
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # The veth is made in the gateway with its peer placed straight into the guest: no end
        # of it ever exists in the root namespace.
        sh("ip", "-n", g, "link", "add", "sgv-g", "type", "veth", "peer", "sgv-c", "netns", c)
        sh("ip", "-n", g, "addr", "add", "10.77.0.1/24", "dev", "sgv-g")
        sh("ip", "-n", c, "addr", "add", "10.77.0.2/24", "dev", "sgv-c")
        sh("ip", "-n", g, "link", "set", "sgv-g", "up")
        sh("ip", "-n", c, "link", "set", "sgv-c", "up")
        sh("ip", "-n", c, "route", "add", "default", "via", "10.77.0.1")
        sh("ip", "-n", g, "link", "add", "sg-ifb", "type", "ifb")
        sh("ip", "-n", g, "link", "set", "sg-ifb", "up")
        sh("ip", "-n", g, "route", "add", "203.0.113.0/24", "dev", "sg-ifb")
        sh("ip", "netns", "exec", g, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        sh("ip", "netns", "exec", c, "sysctl", "-qw", "net.ipv4.ping_group_range=0 2147483647")
        sh("ip", "netns", "exec", c, "nft", "-f", "-", stdin=GUEST_RULES)
        sh("ip", "netns", "exec", g, "nft", "-f", "-", stdin=GATEWAY_RULES)
        yield t
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], check=False)


def collect(sock: NflogSocket, want: int, timeout: float = 3.0) -> list[NflogPacket]:
    """Read until ``want`` packets arrived or ``timeout`` passed."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    got: list[NflogPacket] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and (left := deadline - time.monotonic()) > 0:
        if poller.poll(int(left * 1000) + 1):
            got.extend(sock.read())
    return got


def netns_cookie(fd: int) -> int:
    sock = socket.socket(fileno=os.dup(fd))
    try:
        return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    finally:
        sock.close()


def probe_cookie(path: str) -> int:
    def probe() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            return netns_cookie(s.fileno())

    return run_in_netns(path, probe)


def test_socket_is_made_in_the_namespace_and_the_caller_stays(topo: Topology) -> None:
    before = os.readlink("/proc/thread-self/ns/net")
    with NflogSocket.in_netns(topo.guest_path, 5) as sock:
        assert os.readlink("/proc/thread-self/ns/net") == before
        assert netns_cookie(sock.fileno()) == probe_cookie(topo.guest_path)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as here:
            assert netns_cookie(sock.fileno()) != netns_cookie(here.fileno())
    assert os.readlink("/proc/thread-self/ns/net") == before


def test_a_group_has_one_listener(topo: Topology) -> None:
    with NflogSocket.in_netns(topo.guest_path, 5):
        with pytest.raises(NetlinkError) as refused:
            NflogSocket.in_netns(topo.guest_path, 5)
        assert refused.value.errno == errno.EPERM
    NflogSocket.in_netns(topo.guest_path, 5).close()  # released on close


SEND_TCP_UDP_ICMP = """
import socket
def attempt(f):
    try:
        f()
    except OSError:
        pass  # the output chain drops: EPERM
tcp = socket.socket()
tcp.setblocking(False)
attempt(lambda: tcp.connect(("203.0.113.7", 443)))
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt(lambda: udp.sendto(b"q" * 12, ("203.0.113.7", 53)))
icmp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
attempt(lambda: icmp.sendto(b"\\x08\\x00\\x00\\x00\\x00\\x01\\x00\\x01ping", ("203.0.113.7", 0)))
"""


def test_unprivileged_tcp_udp_icmp_are_logged_with_uid(topo: Topology) -> None:
    outdev = topo.ifindex(topo.guest_path, "sgv-c")
    with NflogSocket.in_netns(topo.guest_path, 5, qthresh=1) as sock:
        topo.python(SEND_TCP_UDP_ICMP, as_nobody=True)
        tcp, udp, icmp = collect(sock, 3)
        for pkt in (tcp, udp, icmp):
            assert (pkt.group, pkt.prefix, pkt.hook, pkt.family) == (5, "sg-deny ", 3, 2)
            assert (pkt.uid, pkt.gid) == (65534, 65534)
            assert (pkt.indev, pkt.outdev) == (None, outdev)
            assert (pkt.src, pkt.dst) == ("10.77.0.2", "203.0.113.7")
        assert (tcp.proto, tcp.dport, tcp.tcp_flags) == (6, 443, 0x02)  # a bare SYN
        assert tcp.sport is not None and tcp.sport >= 1024
        assert (udp.proto, udp.dport, udp.length) == (17, 53, 40)
        assert (icmp.proto, icmp.icmp_type, icmp.icmp_code) == (1, 8, 0)
        assert [p.seq for p in (tcp, udp, icmp)] == [0, 1, 2]
        assert sock.lost == 0


def test_ipv6_is_logged(topo: Topology) -> None:
    code = """
import socket
try:
    socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"six", ("::1", 5353))
except OSError:
    pass
"""
    with NflogSocket.in_netns(topo.guest_path, 5, qthresh=1) as sock:
        topo.python(code, as_nobody=True)
        [pkt] = collect(sock, 1)
    assert (pkt.family, pkt.prefix, pkt.proto) == (10, "sg-deny6 ", 17)
    assert (pkt.src, pkt.dst) == ("::1", "::1")
    assert (pkt.dport, pkt.uid, pkt.outdev, pkt.length) == (5353, 65534, 1, 51)


def test_forwarded_packet_is_logged_by_the_gateway(topo: Topology) -> None:
    indev = topo.ifindex(topo.gateway_path, "sgv-g")
    outdev = topo.ifindex(topo.gateway_path, "sg-ifb")
    code = "import socket; socket.socket(2, 2).sendto(b'fw', ('203.0.113.200', 9))"
    with NflogSocket.in_netns(topo.gateway_path, 7, qthresh=1) as sock:
        topo.python(code)
        [pkt] = collect(sock, 1)
    assert (pkt.prefix, pkt.hook, pkt.indev, pkt.outdev) == ("sg-fwd ", 2, indev, outdev)
    assert (pkt.uid, pkt.gid) == (None, None)  # no local socket behind a forwarded packet
    assert (pkt.src, pkt.dst, pkt.proto, pkt.dport) == ("10.77.0.2", "203.0.113.200", 17, 9)
    assert pkt.timestamp is not None and abs(pkt.timestamp - time.time()) < 60


def test_limit_caps_what_is_logged_not_what_is_dropped(topo: Topology) -> None:
    code = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(50):
    try:
        s.sendto(b"x", ("10.77.0.1", 9000))
    except OSError:
        pass
"""
    with NflogSocket.in_netns(topo.guest_path, 6, qthresh=1) as sock:
        topo.python(code)
        logged = collect(sock, 50, timeout=0.5)
    assert 5 <= len(logged) <= 10  # burst 5, then 10/s


def test_arp_is_logged(topo: Topology) -> None:
    sh("ip", "-n", topo.guest, "neigh", "flush", "dev", "sgv-c")
    with NflogSocket.in_netns(topo.guest_path, 10, qthresh=1) as sock:
        topo.python("import socket; socket.socket(2, 2).sendto(b'a', ('10.77.0.1', 9))")
        arp = collect(sock, 1)
    assert arp, "no ARP request logged"
    assert (arp[0].family, arp[0].hook, arp[0].src, arp[0].dst) == (3, 1, "10.77.0.2", "10.77.0.1")


def test_asyncio_reads_through_add_reader(topo: Topology) -> None:
    async def main(sock: NflogSocket) -> list[NflogPacket]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[NflogPacket]] = asyncio.Queue()
        loop.add_reader(sock.fileno(), lambda: queue.put_nowait(sock.read()))
        try:
            tx = run_in_netns(topo.guest_path, lambda: socket.socket(type=socket.SOCK_DGRAM))
            with tx, contextlib.suppress(PermissionError):  # logged, then dropped
                tx.sendto(b"a", ("127.0.0.1", 9999))
            while not (batch := await asyncio.wait_for(queue.get(), 2.0)):
                pass
            return batch
        finally:
            loop.remove_reader(sock.fileno())

    with NflogSocket.in_netns(topo.guest_path, 9, qthresh=1) as sock:
        [pkt] = asyncio.run(main(sock))
    assert (pkt.prefix, pkt.dport, pkt.uid) == ("sg-burst ", 9999, 0)


PACED_SENDER = """
import socket, sys, time
count, rate = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start, sent = time.monotonic(), 0
while sent < count:
    for _ in range(min(100, count - sent)):
        try:
            s.sendto(b"x", ("127.0.0.1", 9999))
        except OSError:
            pass  # dropped after logging
        sent += 1
    if rate:
        delay = start + sent / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
print(sent, time.monotonic() - start)
"""


def test_burst_of_20k_per_second_loses_nothing_at_qthresh_64(topo: Topology) -> None:
    count = 30_000
    with NflogSocket.in_netns(topo.guest_path, 9, qthresh=64) as sock:
        argv = ["ip", "netns", "exec", topo.guest, PYTHON, "-I", "-c", PACED_SENDER]
        sender = subprocess.Popen([*argv, str(count), "20000"], stdout=subprocess.PIPE, text=True)
        cpu = time.thread_time()
        got = collect(sock, count, timeout=8.0)
        cpu = time.thread_time() - cpu
        out, _ = sender.communicate(timeout=10)
        sent, seconds = int(out.split()[0]), float(out.split()[1])
        assert sent == count
        assert seconds < 2.0, "sender too slow to make the rate"
        assert len(got) == count
        assert [p.seq for p in got] == list(range(count))
        assert (sock.lost, sock.overruns, sock.kernel_drops()) == (0, 0, 0)
    print(f"\nnflog: {count} at {count / seconds:.0f}/s, reader {cpu / count * 1e6:.1f} us/event")


def test_loss_is_counted(topo: Topology) -> None:
    # A tiny receive buffer that nobody reads during a burst: the kernel must drop batches,
    # and the reader must say how many packets it missed.
    with NflogSocket.in_netns(topo.guest_path, 9, qthresh=64, rcvbuf=8192) as sock:
        topo.python(PACED_SENDER, "3000", "0")
        time.sleep(0.3)  # let the kernel flush the last batch (timeout 10 cs)
        got = collect(sock, 3000, timeout=0.3)
        assert len(got) < 3000
        assert sock.overruns >= 1 and sock.kernel_drops() >= 1
        topo.python(PACED_SENDER, "1", "0")  # the next packet reveals a gap at the tail too
        got += collect(sock, 1)
        assert got[-1].seq == 3000
        assert len(got) + sock.lost == 3001
