"""ConntrackSocket against the real kernel, in two throwaway namespaces joined by a veth pair.

    guest   sg-tct-<pid>-c  sgv-c 10.77.0.2/24   (accounting and timestamps on, in here only)
    gateway sg-tct-<pid>-g  sgv-g 10.77.0.1/24   (a TCP server on 8080)

The guest's output chain marks and accepts new TCP flows to 8080, drops 8081, and puts UDP to
7777 in conntrack zone 7. Packets go only into these namespaces.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sandgate.net.conntrack import ConntrackSocket, CtEvent, CtEventType, CtStatus
from sandgate.net.netlink import run_in_netns

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create namespaces"),
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("ip", "nft", "conntrack")),
        reason="needs ip, nft and conntrack",
    ),
]

SO_NETNS_COOKIE = 71

GUEST_RULES = """
table inet sg_t {
  chain raw {
    type filter hook output priority -300; policy accept;
    udp dport 7777 ct zone set 7
  }
  chain out {
    type filter hook output priority 0; policy accept;
    ct state established,related accept
    tcp dport 8080 ct state new ct mark set 42 accept
    tcp dport 8081 drop
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


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    tag = f"sg-tct-{os.getpid()}"
    t = Topology(guest=f"{tag}-c", gateway=f"{tag}-g")
    g, c = t.gateway, t.guest
    created: list[str] = []
    try:
        for ns in (g, c):
            sh("ip", "netns", "add", ns)
            created.append(ns)
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # The veth is made in the gateway with its peer placed straight into the guest: no end
        # of it ever exists in the root namespace.
        sh("ip", "-n", g, "link", "add", "sgv-g", "type", "veth", "peer", "sgv-c", "netns", c)
        sh("ip", "-n", g, "addr", "add", "10.77.0.1/24", "dev", "sgv-g")
        sh("ip", "-n", c, "addr", "add", "10.77.0.2/24", "dev", "sgv-c")
        sh("ip", "-n", g, "link", "set", "sgv-g", "up")
        sh("ip", "-n", c, "link", "set", "sgv-c", "up")
        # Per-namespace conntrack sysctls, written from inside the guest namespace only.
        sh(
            "ip", "netns", "exec", c, "sysctl", "-qw",
            "net.netfilter.nf_conntrack_acct=1", "net.netfilter.nf_conntrack_timestamp=1",
        )  # fmt: skip
        sh("ip", "netns", "exec", c, "nft", "-f", "-", stdin=GUEST_RULES)
        yield t
    finally:
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], check=False)


def read_until(
    sock: ConntrackSocket, match: Callable[[CtEvent], bool], timeout: float = 3.0
) -> list[CtEvent]:
    """Every event read up to and including the first that matches; fails after ``timeout``."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    seen: list[CtEvent] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if poller.poll(int(left * 1000) + 1):
            for event in sock.read():
                seen.append(event)
                if match(event):
                    return seen
    raise AssertionError(f"no matching event in {timeout} s; saw {seen}")


def netns_cookie(fd: int) -> int:
    sock = socket.socket(fileno=os.dup(fd))
    try:
        return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")
    finally:
        sock.close()


def test_socket_is_made_in_the_namespace_and_the_caller_stays(topo: Topology) -> None:
    before = os.readlink("/proc/thread-self/ns/net")
    with ConntrackSocket.in_netns(topo.guest_path) as sock:
        assert os.readlink("/proc/thread-self/ns/net") == before
        helper_ns = run_in_netns(topo.guest_path, lambda: os.stat("/proc/thread-self/ns/net"))
        assert helper_ns.st_ino == os.stat(topo.guest_path).st_ino
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as here:
            assert netns_cookie(sock.fileno()) != netns_cookie(here.fileno())
    assert os.readlink("/proc/thread-self/ns/net") == before


def test_accepted_tcp_flow_new_then_destroy_with_counters(topo: Topology) -> None:
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(ConntrackSocket.in_netns(topo.guest_path))
        server = stack.enter_context(
            run_in_netns(topo.gateway_path, lambda: socket.create_server(("10.77.0.1", 8080)))
        )
        client = stack.enter_context(
            run_in_netns(topo.guest_path, lambda: socket.create_connection(("10.77.0.1", 8080)))
        )
        peer, _ = server.accept()
        stack.enter_context(peer)
        sport = client.getsockname()[1]
        client.sendall(b"hello")
        assert peer.recv(16) == b"hello"
        peer.sendall(b"world!")
        assert client.recv(16) == b"world!"

        new = read_until(sock, lambda e: e.type is CtEventType.NEW and e.dport == 8080)[-1]
        assert (new.family, new.proto, new.src, new.dst, new.sport) == (
            2, 6, "10.77.0.2", "10.77.0.1", sport,
        )  # fmt: skip
        assert new.reply is not None and (new.reply.src, new.reply.dport) == ("10.77.0.1", sport)
        assert new.mark == 42  # set by the accepting rule, before the event
        assert new.id is not None and CtStatus.CONFIRMED in CtStatus(new.status or 0)

        # End the flow now rather than after TIME_WAIT and the garbage collector.
        sh("ip", "netns", "exec", topo.guest, "conntrack", "-D", "-p", "tcp", "--sport", str(sport))
        end = read_until(sock, lambda e: e.type is CtEventType.DESTROY and e.id == new.id)[-1]
        assert end.orig_packets is not None and end.orig_packets >= 3  # SYN, ACK, data
        assert end.orig_bytes is not None and end.orig_bytes > 5
        assert end.reply_packets is not None and end.reply_packets >= 2
        assert end.start_ns is not None and end.stop_ns is not None
        assert end.stop_ns >= end.start_ns
        assert sock.lost == 0 and sock.overruns == 0


def test_dropped_flow_has_no_new_event_and_zones_are_reported(topo: Topology) -> None:
    with ConntrackSocket.in_netns(topo.guest_path) as sock:
        tcp = run_in_netns(topo.guest_path, socket.socket)
        udp = run_in_netns(topo.guest_path, lambda: socket.socket(type=socket.SOCK_DGRAM))
        with tcp, udp:
            tcp.setblocking(False)
            with contextlib.suppress(OSError):  # EPERM: the output chain drops the SYN
                tcp.connect(("10.77.0.1", 8081))
            udp.sendto(b"z", ("10.77.0.1", 7777))
            seen = read_until(sock, lambda e: e.dport == 7777)
        udp_new = seen[-1]
        assert udp_new.type is CtEventType.NEW
        assert (udp_new.proto, udp_new.zone) == (17, 7)
        # Events come in order, so by the time the later UDP flow arrived, a NEW event for the
        # earlier, dropped SYN would have come first. A dropped packet never confirms its entry.
        assert not [e for e in seen if e.dport == 8081]
