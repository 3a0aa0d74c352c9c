"""The open mode's kernel path alone: CPU per GB and per segment through a gateway namespace
with sandgate's rules, beside the same path through a plain router, variant by variant.

``PYTHONPATH=src:. python -m bench.kpath [ROUNDS] [VARIANT ...]`` as root (``KPATH_BULK=0``:
segments only). Three namespaces of our own, ``sg-kp<pid>-{c,g,s}``: a guest (``c``), a gateway
(``g``) and a server (``s``), joined by two veths, nothing else. ``g`` forwards; the variants
differ only in the rules (``VARIANTS``):

    plain      no table anywhere: ip_forward alone (bench/stack.py's peer gateway)
    sandgate   what a guest of an open profile has (bench/throughput.py's "direct" pair): in
               ``g`` the gateway's ``base_ruleset`` and the guest's ``guest_add`` (the netdev
               MAC pin, conntrack, masquerade) and the TLS gate's iptables rules; in ``c`` the
               uid log and the process hold's queue rules
    others     ``sandgate`` with one part taken away or changed, to price each part

Each round, under every variant in turn: 1 GiB each way (the guest downloads, then uploads)
and 200,000 64-byte segments from the guest (TCP_NODELAY), through two long-lived processes (a
client in ``c``, a server in ``s``). A veth hands a packet to the next namespace in the
sender's own softirq, so the forwarding, conntrack and NAT of a direction are charged to its
sender: bulk CPU per GB is both processes' (schedstat), the segment figure the sending thread's
CPU per packet the gateway received. On a shared 2-core machine rates move with the
neighbours; CPU per unit is what travels.

Measured 2026-12-01 (load 4-9 on 2 cores; CPU per 64-byte segment, median of 8-10 rounds):
plain 7.1-7.4 µs, sandgate 9.2-10.5 (+2.1..3.3). Taking one part away saved about 0.3-0.7 µs
each: masquerade (its per-packet rewrite, and the xfrm re-lookup NAT does per packet), the MAC
pin's ingress hook, the TLS gate's iptables tables, the gateway's conntrack (``gw-ct-only``
+0.2-0.4 over plain), the guest's table (0.3). The issue's suggestion, the guest's TCP
untracked and logged by SYN (``guest-notrack``), cost more, not less: 10.5 vs 10.2 µs (its
raw-priority chains are two more hooks, and UDP still needs conntrack). The gate declared only
the chains with rules and its deny tests behind native port tests: ``before`` 10.6 vs 10.3 µs,
lower in 9 of 10 pairs. Bulk (64 KiB GSO segments, ~17k packets per GiB plus ACKs): sandgate
0.45-0.48 vs plain 0.39-0.46 s/GB at load 2-3; at load 4.5, 6 rounds, download before 0.62,
now 0.58, plain 0.58; upload 0.66, 0.60, 0.51. The gateway's sysctls (``sysctls``, rp_filter
among them) cost nothing measurable. This kernel has no flowtable (CONFIG_NF_FLOW_TABLE is off),
the one thing that would let established flows skip conntrack, NAT and the chains.

BIG TCP (``*-big``: every link end's GSO/GRO limits, IPv4's too, at 185,000 bytes; ``*-512k`` at
veth's 524,280), 2026-12-07, idle, 6 rounds: download / upload MB/s and s/GB, plain 2,919 /
3,643 at 0.465 / 0.398, plain-big 4,934 / 4,671 at 0.251 / 0.280, sandgate 3,066 / 3,261 at
0.460 / 0.456, sandgate-big 4,305 / 4,084 at 0.294 / 0.328; 512k uploads were slower (2,787 /
2,884). A third as many packets a GB: every per-packet cost (the rules, conntrack, NAT, the
stack) shrinks with them. It only pays where every link of the path takes such segments (one
that does not cuts each into MSS-sized packets in software), which is why sandgate does not set
it on its links by default (bench/gso.py; docs/NOTES.md, 2026-12-07).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from ipaddress import IPv4Network
from typing import Any

from bench import gso
from sandgate import cleanup
from sandgate.net import iptables, ns
from sandgate.net.compile import GuestLink, base_ruleset, guest_add, guest_uid_log
from sandgate.net.links import GATEWAY_SYSCTLS, link_sysctl_values
from sandgate.net.netlink import run_in_netns
from sandgate.net.nft import Nft, batch
from sandgate.policy.load import parse_policy

SIZE = 1 << 30
PY = sys.executable
POOL = IPv4Network("10.201.0.0/16")
LINK = GuestLink.from_pool(POOL, 1, "02:00:0a:c9:00:06")
UPLINK, UP_GW, UP_SRV = "up0", "10.79.8.1", "10.79.8.2"
PORT = 9200

SERVER = """
import socket, sys
l = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
data, buf = bytes(1 << 20), bytearray(1 << 20)
while True:
    c, _ = l.accept()
    mode, n = c.recv(1), int(sys.argv[3])
    if mode == b"d":  # the guest downloads
        for _ in range(n >> 20):
            c.sendall(data)
    elif mode == b"p":  # small segments from the guest: read to EOF
        while c.recv_into(buf):
            pass
        c.sendall(b"k")
    else:  # the guest uploads: read to EOF
        while c.recv_into(buf):
            pass
        c.sendall(b"k")
    c.close()
"""
CLIENT = """
import socket, sys, time
data, buf = bytes(1 << 20), bytearray(1 << 20)
print("ready", flush=True)
for line in sys.stdin:
    mode, n = line.split()[0], int(sys.argv[3])
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
    c.sendall(mode.encode())
    t = time.perf_counter()
    if mode == "p":  # one small segment per send: CPU per packet of the sending thread
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg, t = b"x" * 64, time.thread_time()
        for _ in range(int(line.split()[1])):
            c.send(msg)
        t = time.thread_time() - t
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
        print(t, flush=True)
        continue
    elif mode == "d":
        got = 0
        while k := c.recv_into(buf):
            got += k
        assert got == n, got
    else:
        for _ in range(n >> 20):
            c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
    c.close()
    print(time.perf_counter() - t, flush=True)
"""

# As bench/throughput.py's "direct" pair: open mode, the LAN server allowed by host and port.
POLICY = f"""
[profiles.open]
internet = "open"
allow = [ {{ host = "{UP_SRV}", port = {PORT} }} ]
""".encode()


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def in_ns(netns: str, fn: Callable[[], Any]) -> Any:
    return run_in_netns(f"/run/netns/{netns}", fn)


def nft(netns: str, cmds: list[dict[str, Any]]) -> None:
    def go() -> None:
        n = Nft()
        try:
            n.run(batch(*cmds))
        finally:
            n.close()

    in_ns(netns, go)


def nft_text(netns: str, text: str) -> None:
    argv = ["ip", "netns", "exec", netns, "nft", "-f", "-"]
    done = subprocess.run(argv, input=text.encode(), capture_output=True, check=False)
    if done.returncode:
        raise RuntimeError(f"nft -f in {netns}: {done.stderr.decode()}")


@dataclasses.dataclass
class World:
    c: str
    g: str
    s: str


@contextlib.contextmanager
def world() -> Iterator[World]:
    tag = f"sg-kp{os.getpid()}"
    w = World(f"{tag}-c", f"{tag}-g", f"{tag}-s")
    made: list[str] = []
    try:
        for n in (w.c, w.g, w.s):
            cleanup.own(n)
            sh("ip", "netns", "add", n)
            made.append(n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "-n", w.g, "link", "add", LINK.ifname, "type", "veth", "peer", "eth0",
           "netns", w.c)  # fmt: skip
        sh("ip", "-n", w.c, "link", "set", "eth0", "address", LINK.mac)
        sh("ip", "-n", w.g, "link", "add", UPLINK, "type", "veth", "peer", "eth0", "netns", w.s)
        sh("ip", "-n", w.g, "addr", "add", f"{LINK.gateway}/30", "dev", LINK.ifname)
        sh("ip", "-n", w.c, "addr", "add", f"{LINK.guest}/30", "dev", "eth0")
        sh("ip", "-n", w.g, "addr", "add", f"{UP_GW}/24", "dev", UPLINK)
        sh("ip", "-n", w.s, "addr", "add", f"{UP_SRV}/24", "dev", "eth0")
        for n, dev in ((w.g, LINK.ifname), (w.g, UPLINK), (w.c, "eth0"), (w.s, "eth0")):
            sh("ip", "-n", n, "link", "set", dev, "up")
        sh("ip", "-n", w.c, "route", "add", "default", "via", str(LINK.gateway))
        sh("ip", "-n", w.s, "route", "add", str(POOL), "via", UP_GW)  # plain: no masquerade
        sh("ip", "netns", "exec", w.g, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        yield w
    finally:
        for n in made:
            subprocess.run(["ip", "netns", "del", n], check=False)
        for n in (w.c, w.g, w.s):
            cleanup.disown(n)


def profile() -> Any:
    p = parse_policy(POLICY, "kpath.toml").profile("open")
    return dataclasses.replace(p, guest_pool=POOL, gateway_address=LINK.gateway)


def gateway_cmds() -> list[dict[str, Any]]:
    cmds, _ = base_ruleset(UPLINK, POOL)
    more, _ = guest_add(LINK, profile())
    return [*cmds, *more, {"add": {"element": {"family": "inet", "table": "sandgate",
            "name": "fwd", "elem": [[LINK.ifname, {"jump": {"target": f"fwd_{LINK.ifname}"}}]]}}},
            ]  # fmt: skip


ENDS = ("c", "eth0"), ("g", LINK.ifname), ("g", UPLINK), ("s", "eth0")


def _gso(size: int) -> Callable[[World], None]:
    """Every link end's GSO/GRO limits (IPv4's too: BIG TCP above 64 KiB) set to ``size``."""

    def limit(dev: str) -> Callable[[], None]:
        return lambda: gso.set_gso_limits(socket.if_nametoindex(dev), size)

    def go(w: World) -> None:
        for side, dev in ENDS:
            in_ns(getattr(w, side), limit(dev))

    return go


def clear(w: World) -> None:
    _gso(65536)(w)
    for n in (w.c, w.g):
        subprocess.run(["ip", "netns", "exec", n, "nft", "flush", "ruleset"], check=True)
    in_ns(w.g, lambda: ns.write_sysctls(dict.fromkeys(RP_FILTER, "0")))  # a new netns's


RP_FILTER = [f"net.ipv4.conf.{d}.rp_filter" for d in ("all", "default", LINK.ifname, UPLINK)]


def _sysctls(w: World) -> None:
    """The gateway's namespace-wide and per-link settings (net/links.py), rp_filter among them."""
    values = {**GATEWAY_SYSCTLS, **link_sysctl_values(LINK.ifname), **link_sysctl_values(UPLINK)}
    in_ns(w.g, lambda: ns.write_sysctls(values))


def install_sandgate(w: World) -> None:
    nft(w.g, gateway_cmds())
    in_ns(w.g, lambda: iptables.install(iptables.TlsGate(queue_num=7)))
    nft(w.c, guest_uid_log())
    in_ns(w.c, lambda: iptables.install_hold(9))


def _then(*steps: Callable[[World], None]) -> Callable[[World], None]:
    def go(w: World) -> None:
        for step in steps:
            step(w)

    return go


def _no_gate(w: World) -> None:
    in_ns(w.g, iptables.remove)


def _no_guest(w: World) -> None:
    subprocess.run(["ip", "netns", "exec", w.c, "nft", "flush", "ruleset"], check=True)


def _no_ingress(w: World) -> None:
    nft_text(w.g, "delete table netdev sandgate\n")


def _no_nat(w: World) -> None:
    nft_text(w.g, "flush chain inet sandgate postrouting\n")


def _ct_only(w: World) -> None:
    nft_text(w.g, "table inet t { chain f { type filter hook forward priority 0; "
             "ct state established accept; }; }\n")  # fmt: skip


def _gate_before(w: World) -> None:
    """The TLS gate as it was before 2026-12-02: every built-in chain of both tables declared
    (iptables-nft hooked the empty ones too), the deny tests (xt connmark, nft_compat) on
    every forwarded packet."""
    x = iptables.DENIED
    mangle = iptables.restore_text(iptables.TlsGate(queue_num=7)).split("*filter\n")[0]
    chains = "".join(
        f":{c} ACCEPT [0:0]\n" for c in ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING")
    )
    text = mangle.replace("*mangle\n", "*mangle\n" + chains) + (
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
        f"-A FORWARD -p tcp -m connmark --mark {x:#x}/{x:#x} -j REJECT --reject-with tcp-reset\n"
        f"-A FORWARD -m connmark --mark {x:#x}/{x:#x} -j DROP\nCOMMIT\n"
    )  # fmt: skip
    in_ns(w.g, lambda: iptables._restore(text))


def _guest_notrack(w: World) -> None:
    """bench/guestct.py's experiment: the guest's TCP untracked (raw priority), logged by SYN."""
    from bench.guestct import variant

    _no_guest(w)
    nft(w.c, variant("untracked"))
    in_ns(w.c, lambda: iptables.install_hold(9))


VARIANTS: dict[str, Callable[[World], None]] = {
    "plain": lambda w: None,
    "sandgate": install_sandgate,
    "sysctls": _then(install_sandgate, _sysctls),  # and the gateway's sysctls (rp_filter)
    "before": _then(install_sandgate, _gate_before),  # the TLS gate before this change
    "no-gate": _then(install_sandgate, _no_gate),  # without the TLS gate's iptables tables
    "no-guest": _then(install_sandgate, _no_guest),  # without the guest's uid log and hold
    "guest-notrack": _then(install_sandgate, _guest_notrack),  # issue 13's suggestion
    "no-ingress": _then(install_sandgate, _no_ingress),  # without the MAC/address pin
    "no-nat": _then(install_sandgate, _no_nat),  # without masquerade
    "gw-ct-only": _ct_only,  # conntrack in the gateway and nothing else
    "plain-big": _gso(185_000),  # BIG TCP on every link, no rules
    "sandgate-big": _then(install_sandgate, _gso(185_000)),
    "plain-512k": _gso(524_280),
    "sandgate-512k": _then(install_sandgate, _gso(524_280)),
    "bare": _then(install_sandgate, _no_nat, _no_ingress, _no_gate, _no_guest),
}


def proc_cpu(pid: int) -> float:
    """Seconds on CPU (the scheduler's count, in ns: finer than /proc/PID/stat's ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def rx_packets(netns: str, dev: str) -> int:
    out = subprocess.run(["ip", "-j", "-s", "-n", netns, "link", "show", dev],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return int(json.loads(out)[0]["stats64"]["rx"]["packets"])


def main(rounds: int, names: list[str], segments: int = 200_000, bulk: int = 2) -> dict[str, Any]:
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {
        v: {"download": [], "upload": []} for v in names
    }
    per_packet: dict[str, list[float]] = {v: [] for v in names}
    limits: dict[str, dict[str, int]] = {}  # the guest link's limits under each variant, as read
    load0 = os.getloadavg()
    with world() as w:
        server = subprocess.Popen(
            ["ip", "netns", "exec", w.s, PY, "-c", SERVER, UP_SRV, str(PORT), str(SIZE)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        client = subprocess.Popen(
            ["ip", "netns", "exec", w.c, PY, "-c", CLIENT, UP_SRV, str(PORT), str(SIZE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout and client.stdout and client.stdin
            assert server.stdout.readline() == "ready\n" == client.stdout.readline()
            for _ in range(rounds):
                for v in names:
                    clear(w)
                    VARIANTS[v](w)
                    limits[v] = in_ns(w.c, lambda: gso.gso_limits(socket.if_nametoindex("eth0")))
                    time.sleep(0.2)
                    for mode, key in (("d", "download"), ("u", "upload"))[:bulk]:
                        c0, s0 = proc_cpu(client.pid), proc_cpu(server.pid)
                        client.stdin.write(f"{mode}\n")
                        client.stdin.flush()
                        seconds = float(client.stdout.readline())
                        cpu = proc_cpu(client.pid) - c0 + proc_cpu(server.pid) - s0
                        runs[v][key].append((SIZE / seconds / 1e6, cpu / (SIZE / 1e9)))
                    if segments:
                        p0 = rx_packets(w.g, LINK.ifname)
                        client.stdin.write(f"p {segments}\n")
                        client.stdin.flush()
                        cpu = float(client.stdout.readline())
                        sent = rx_packets(w.g, LINK.ifname) - p0
                        per_packet[v].append(cpu / max(sent, 1) * 1e9)
        finally:
            for p in (client, server):  # ours, by pid
                p.kill()
                p.wait()
    out: dict[str, Any] = {"rounds": rounds, "loadavg": [load0, os.getloadavg()]}
    for v, ways in runs.items():
        out[v] = {
            k: {
                "median_MB_s": round(statistics.median(r for r, _ in rs)),
                "cpu_s_per_GB": round(statistics.median(c for _, c in rs), 3),
                "cpu_runs": [round(c, 3) for _, c in rs],
            }
            for k, rs in ways.items()
            if rs
        }
        out[v]["guest_link"] = limits.get(v, {})
        if per_packet[v]:
            out[v]["segment_cpu_ns"] = round(statistics.median(per_packet[v]))
            out[v]["segment_cpu_runs"] = [round(x) for x in per_packet[v]]
    return out


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    bulk = 0 if os.environ.get("KPATH_BULK") == "0" else 2
    print(json.dumps(main(n, sys.argv[2:] or list(VARIANTS), bulk=bulk), indent=1))
