"""CPU per packet: through the gateway at N guests, and verdict map against jump list.

A veth hands its packet to the peer namespace in the sender's own softirq, so the CPU time of
the one thread that sends (user and system, ``time.thread_time``) covers the whole path the
packet takes on this host: the guest's uid log, the gateway's rules, conntrack and NAT. Sending
the same datagrams from the newest guest at 1 and at 100 guests shows whether a packet's cost
depends on how many guests there are (issue 11: "the per-packet CPU stays flat").

``dispatch`` compares the two ways a ruleset can reach one guest's chain among N, in a scratch
namespace of its own whose only route leads over a veth to a second one, which drops it all:
the output hook's chain either looks the interface up in a verdict map (what the gateway's
``fwd``/``in`` maps do) or walks a list of ``oifname X jump chain_X`` rules, the matching one
last. Nothing leaves the scratch namespace.
"""

from __future__ import annotations

import contextlib
import functools
import secrets
import socket
import statistics
import time
from typing import Any

from pyroute2 import IPRoute

from sandgate.net import ns
from sandgate.net.nft import Nft, batch

PAYLOAD = b"x" * 64
SINK = ("198.51.100.7", 9)  # documentation range, routed to the sink namespace (dropped there)
TABLE = "sg_dispatch"


def send_cpu_ns(count: int, target: tuple[str, int]) -> float:
    """CPU ns per datagram of one thread sending ``count`` datagrams to ``target`` (call it
    inside the namespace to measure)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _ in range(200):  # warm: the route, the flow's conntrack entry, ARP
            _send(s, target)
        time.sleep(0.05)
        t0 = time.thread_time_ns()
        for _ in range(count):
            _send(s, target)
        return (time.thread_time_ns() - t0) / count
    finally:
        s.close()


def _send(s: socket.socket, target: tuple[str, int]) -> None:
    with contextlib.suppress(OSError):  # a full queue, or an ICMP error: the packet was made
        s.sendto(PAYLOAD, target)


def guest_cpu_ns(netns: str, target: str, count: int, rounds: int = 3) -> float:
    """The median over ``rounds`` of a guest's CPU per datagram to ``target`` port 9."""
    runs = [ns.run_in(netns, lambda: send_cpu_ns(count, (target, 9))) for _ in range(rounds)]
    return round(statistics.median(runs), 1)


# -- verdict map against jump list ---------------------------------------------------------------


def _ruleset(kind: str, n: int) -> list[dict[str, Any]]:
    """A table whose output chain reaches chain ``c<n>`` (for the sink's interface) among ``n``
    guests' chains, by a verdict map or by a jump list with the match last."""
    t = {"family": "inet", "table": TABLE}
    cmds: list[dict[str, Any]] = [{"add": {"table": {"family": "inet", "name": TABLE}}}]
    names = [f"sgx{i}" for i in range(1, n)] + ["sgdisp"]
    for i in range(1, n + 1):
        cmds.append({"add": {"chain": {**t, "name": f"c{i}"}}})
        cmds.append(
            {
                "add": {
                    "rule": {
                        **t,
                        "chain": f"c{i}",
                        "expr": [
                            {
                                "match": {
                                    "op": "==",
                                    "left": {"payload": {"protocol": "ip", "field": "daddr"}},
                                    "right": SINK[0],
                                }
                            },
                            {"accept": None},
                        ],
                    }
                }
            }
        )
    hook = {**t, "name": "out", "type": "filter", "hook": "output", "prio": 0, "policy": "accept"}
    cmds.append({"add": {"chain": hook}})
    oif = {"meta": {"key": "oifname"}}
    if kind == "vmap":
        elems = [[name, {"jump": {"target": f"c{i}"}}] for i, name in enumerate(names, 1)]
        cmds.append(
            {
                "add": {
                    "map": {
                        **t,
                        "name": "guests",
                        "type": "ifname",
                        "map": "verdict",
                        "elem": elems,
                    }
                }
            }
        )
        cmds.append(
            {
                "add": {
                    "rule": {
                        **t,
                        "chain": "out",
                        "expr": [{"vmap": {"key": oif, "data": "@guests"}}],
                    }
                }
            }
        )
    else:
        for i, name in enumerate(names, 1):
            match = {"match": {"op": "==", "left": oif, "right": name}}
            expr = [match, {"jump": {"target": f"c{i}"}}]
            cmds.append({"add": {"rule": {**t, "chain": "out", "expr": expr}}})
    return cmds


def dispatch(counts: tuple[int, ...], packets: int) -> dict[str, Any]:
    """CPU ns per packet with no table, and with each kind of dispatch among each count."""
    tag = secrets.token_hex(3)
    name, sink = f"sg-dispatch-{tag}", f"sg-dispatch-{tag}-sink"
    ns.create(name)
    ns.create(sink)
    try:
        _wire(name, sink)

        def measure(kind: str, n: int) -> float:
            nft = Nft()
            try:
                if kind != "none":
                    nft.run(batch(*_ruleset(kind, n)))
                runs = [send_cpu_ns(packets, SINK) for _ in range(3)]
                if kind != "none":
                    nft.run(batch({"delete": {"table": {"family": "inet", "name": TABLE}}}))
                return round(statistics.median(runs), 1)
            finally:
                nft.close()

        out: dict[str, Any] = {"none": ns.run_in(name, lambda: measure("none", 0))}
        for kind in ("vmap", "jumps"):
            out[kind] = {
                str(n): ns.run_in(name, functools.partial(measure, kind, n)) for n in counts
            }
        return out
    finally:
        ns.remove(name)
        ns.remove(sink)


def _wire(name: str, sink: str) -> None:
    """A veth from ``name`` to ``sink``; the sink has no address, so it drops what it gets. The
    next hop's MAC is static: no ARP, every packet goes the same way. Each step runs on a
    thread inside its namespace (IPRoute's socket is made there)."""

    def make() -> None:
        with IPRoute() as ipr:
            ipr.link("add", ifname="sgdisp", kind="veth", peer="sgsink")
            peer = ipr.link_lookup(ifname="sgsink")[0]
            with open(ns.path(sink)) as target:
                ipr.link("set", index=peer, net_ns_fd=target.fileno())

    def far() -> str:
        with IPRoute() as ipr:
            peer = ipr.link_lookup(ifname="sgsink")[0]
            ipr.link("set", index=peer, state="up")
            return str(ipr.get_links(peer)[0].get_attr("IFLA_ADDRESS"))

    def near(mac: str) -> None:
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname="sgdisp")[0]
            ipr.link("set", index=idx, state="up")
            ipr.addr("add", index=idx, address="192.0.2.1", prefixlen=24)
            ipr.neigh("add", dst="192.0.2.2", lladdr=mac, ifindex=idx, state=0x80)  # permanent
            ipr.route("add", dst="198.51.100.0/24", gateway="192.0.2.2", oif=idx)

    ns.run_in(name, make)
    mac = ns.run_in(sink, far)
    ns.run_in(name, lambda: near(mac))
