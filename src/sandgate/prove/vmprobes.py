"""Probes for a VM guest, whose driver runs as root in its own kernel (issue 9 part 5).

A namespace guest's "sandbox" probes (nft, ip link, raw sockets, unshare, sudo refused inside)
mean nothing in a VM: root there may do all of it, to its own kernel. What must hold instead is
that nothing it does on the wire gets past the gateway: frames with another source address (the
gateway's, another guest's, 0.0.0.0 as DHCP sends), another MAC, ARP claiming other addresses,
IPv6 and other ethertypes are dropped by the gateway's ingress chain and logged there; ARP for
LAN addresses is answered by no one (arp_ignore); a route of its own reaches nothing. The
driver crafts the frames with an AF_PACKET socket (driver.py, action ``raw``), so the guest's
own configuration never changes while other probes run.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from sandgate.policy.decide import Reason
from sandgate.prove.catalogue import EXAMPLE, MODEL, NAS, ROUTER, Context, Match, Probe

GROUP = "vm root"
# Probes a namespace sandbox passes for want of a capability (nft, ip link/route/addr, raw
# sockets, unshare, sudo): root in a VM has them all, for its own kernel. Left out in a VM;
# what they guarded (addresses, raw frames) is attacked on the wire below instead.
NAMESPACE_ONLY = "sandbox: no"
FAKE_MAC = "02:00:5e:10:00:01"


def in_vm(probes: list[Probe], ctx: Context) -> list[Probe]:
    """The catalogue for a VM guest: the namespace-only probes out, the root attacks in."""
    kept = [p for p in probes if not (p.action == "local" and p.why.startswith(NAMESPACE_ONLY))]
    return kept + root_attacks(ctx)


def root_attacks(ctx: Context) -> list[Probe]:
    gw = ctx.gateway
    # Another guest: the peer if there is one, else the next /30's guest address.
    other = ctx.peer or str(ipaddress.ip_address(gw) + 4)
    deny = "deny"
    out: list[Probe] = []

    def spoof(pid: str, src: str, dst: str, port: int, reason: Reason, **raw: str) -> None:
        out.append(
            Probe(
                pid,
                GROUP,
                f"{src} -> {dst}:{port}/tcp",
                "raw",
                {"kind": "tcp", "src": src, "dst": dst, "port": port, **raw},
                deny,
                reason.key,
                Match(("conn",), dst, port, by_sport=True),
                needs_world=True,
            )
        )

    # The model server is reachable in every mode: only the spoof check can stop these.
    spoof("source: the gateway's address", gw, MODEL, 8000, Reason.SPOOF_IP)
    spoof("source: another guest's address", other, MODEL, 8000, Reason.SPOOF_IP)
    spoof("source: a LAN address (the router)", ROUTER, MODEL, 8000, Reason.SPOOF_IP)
    # TEST-NET-1, outside the guest pool: no guest has it.
    spoof("source: outside the guest pool", "192.0.2.77", MODEL, 8000, Reason.SPOOF_IP)
    spoof("source MAC not the guest's", "own", MODEL, 8000, Reason.SPOOF_MAC, mac=FAKE_MAC)
    out += [
        Probe(
            "DHCP discover (from 0.0.0.0)",
            GROUP,
            "0.0.0.0:68 -> 255.255.255.255:67/udp",
            "raw",
            {"kind": "dhcp"},
            deny,
            Reason.SPOOF_IP.key,
            Match(("conn",), "255.255.255.255", 67),
        ),
        Probe(
            "ARP claiming the gateway's address",
            GROUP,
            f"ARP reply {gw} is-at own MAC",
            "raw",
            {"kind": "arp", "claim": gw, "ask": gw},
            deny,
            Reason.SPOOF_ARP.key,
            Match(("conn",), gw),  # the ingress chain logs ARP by its target address
        ),
        Probe(
            "ARP who-has the router (a LAN address)",
            GROUP,
            f"ARP who-has {ROUTER}",
            "raw",
            {"kind": "arp", "claim": "own", "ask": ROUTER},
            deny,
            "arp_ignore=1: the gateway answers ARP only for its own link address",
            None,
            no_log_why="the guest's own ARP is let in; no one on its link has that address",
        ),
        Probe(
            "ARP who-has the NAS (a LAN address)",
            GROUP,
            f"ARP who-has {NAS}",
            "raw",
            {"kind": "arp", "claim": "own", "ask": NAS},
            deny,
            "arp_ignore=1: the gateway answers ARP only for its own link address",
            None,
            no_log_why="the guest's own ARP is let in; no one on its link has that address",
        ),
        Probe(
            "raw IPv6 to the link's all-nodes group",
            GROUP,
            "ff02::1 (ICMPv6 echo, ethertype 0x86dd)",
            "raw",
            {"kind": "ipv6", "dst6": "ff02::1"},
            deny,
            Reason.IPV6.key,
            Match(("conn",), "ff02::1"),
        ),
        Probe(
            "raw IPv6 link-local to the gateway",
            GROUP,
            "fe80::1 (ICMPv6 echo, ethertype 0x86dd)",
            "raw",
            {"kind": "ipv6", "dst6": "fe80::1"},
            deny,
            Reason.IPV6.key,
            Match(("conn",), "fe80::1"),
        ),
        Probe(
            "another ethertype (0x88b5, local experimental)",
            GROUP,
            "ethertype 0x88b5",
            "raw",
            {"kind": "ethertype", "type": 0x88B5},
            deny,
            Reason.ETHERTYPE.key,
            None,
            no_log_why="the ingress chain drops it (deny.ethertype); it has no address to log",
        ),
        Probe(
            "a route of its own: the LAN on-link",
            GROUP,
            f"ip route add {NAS}/32 dev eth0; tcp {NAS}:22",
            "rootnet",
            {
                "setup": f"ip route add {NAS}/32 dev eth0",
                "undo": f"ip route del {NAS}/32",
                "address": NAS,
                "port": 22,
            },
            deny,
            "the gateway's link holds no LAN address: ARP for it goes unanswered",
            None,
            no_log_why="no frame for the NAS ever reaches an IP layer: ARP goes unanswered",
            needs_world=True,
        ),
    ]
    return out


# -- --nic none: the host channel is the only way out -------------------------------------------
CHANNEL_GROUP = "vm channel"
NO_ROUTE = "no route: --nic none (the guest's NIC ends in QEMU's restricted user-mode stack)"
NO_PACKET = "no packet leaves the guest but through the channel's two forwards"
# QEMU's user-mode stack: its host side, its built-in DNS, the forwards' door.
SLIRP_HOST, SLIRP_DNS = "10.0.2.2", "10.0.2.3"


def in_channel(probes: list[Probe], ctx: Context, door: str) -> list[Probe]:
    """The catalogue for a NIC-less VM whose ``ctx.proxy`` is the channel's proxy door: what
    goes through the proxy or the resolver is judged and logged as for any guest; everything
    else has no route, is refused inside the guest, and leaves no record (nothing left)."""
    out = []
    for p in in_vm(probes, ctx):
        if p.group == GROUP:
            continue  # frames for the guest link: there is no guest link
        if _through_channel(p):
            # The forwards carry TCP only: a DNS probe asks over TCP.
            out.append(replace(p, args={**p.args, "tcp": True}) if p.action == "dns" else p)
        elif p.match is None and p.expected == "deny":
            out.append(p)  # refused inside already (IPv6 off, files)
        else:
            out.append(replace(p, expected="deny", why=NO_ROUTE, match=None, no_log_why=NO_PACKET))
    return out + channel_attacks(ctx, door)


def _through_channel(p: Probe) -> bool:
    if p.action == "connect" or (p.action == "http" and p.args.get("proxy")):
        return True
    return p.action == "dns" and not p.args.get("server")


def channel_attacks(ctx: Context, door: str) -> list[Probe]:
    """Root in the guest against the channel itself: every other door of QEMU's stack shut."""
    out: list[Probe] = []

    def add(pid: str, target: str, action: str, args: dict[str, object], why: str) -> None:
        out.append(Probe(pid, CHANNEL_GROUP, target, action, args, "deny", why, None, NO_PACKET))

    restrict = "restrict=on: QEMU's user-mode stack routes nothing of the guest's"
    # A connection QEMU does not forward it resets itself ("reset_by_qemu"): nothing contacted.
    add(
        "QEMU's host side, ssh",
        f"{SLIRP_HOST}:22/tcp",
        "tcp",
        {"address": SLIRP_HOST, "port": 22, "reset_by_qemu": True},
        restrict,
    )
    add(
        "QEMU's host side, http",
        f"{SLIRP_HOST}:80/tcp",
        "tcp",
        {"address": SLIRP_HOST, "port": 80, "reset_by_qemu": True},
        restrict,
    )
    add(
        "QEMU's host side, tftp",
        f"{SLIRP_HOST}:69/udp",
        "udp",
        {"address": SLIRP_HOST, "port": 69},
        restrict,
    )
    add(
        "QEMU's built-in DNS (udp)",
        f"{SLIRP_DNS}:53/udp",
        "dns",
        {"name": "example.com", "server": SLIRP_DNS, "expect": "gateway-answers"},
        restrict,
    )
    add(
        "QEMU's built-in DNS (tcp)",
        f"{SLIRP_DNS}:53/tcp",
        "dns",
        {"name": "example.com", "server": SLIRP_DNS, "tcp": True, "expect": "gateway-answers"},
        restrict,
    )
    add(
        "the door on another port",
        f"{door}:22/tcp",
        "tcp",
        {"address": door, "port": 22, "reset_by_qemu": True},
        "only the proxy and resolver ports are forwarded",
    )
    add(
        "the door's resolver over UDP",
        f"{door}:53/udp",
        "dns",
        {"name": "example.com", "server": door, "expect": "gateway-answers"},
        "the forwards carry TCP only",
    )
    add(
        "the gateway's own address, directly",
        f"{ctx.gateway}:53/tcp",
        "tcp",
        {"address": ctx.gateway, "port": 53},
        NO_ROUTE,
    )
    add(
        "a route of its own via QEMU's host side",
        f"default via {SLIRP_HOST}; tcp {EXAMPLE}:80",
        "rootnet",
        {
            "setup": f"ip route add default via {SLIRP_HOST}",
            "undo": "ip route del default",
            "address": EXAMPLE,
            "port": 80,
            "reset_by_qemu": True,
        },
        restrict,
    )
    return out
