"""Links of the gateway: the uplink, and one point-to-point veth per guest.

Runs inside the gateway daemon, whose every thread is in the gateway namespace; code that must
act in another namespace (a guest's, the test world's LAN, the host's) does so through a
verified pyroute2 handle (``ns.iproute``) or an ``NsThread``.

Hardening follows report 001: IPv6 off on every link we make (the kernel would otherwise put
fe80:: addresses on them and talk), ``arp_ignore=1``/``arp_announce=2`` so the gateway
answers ARP on a guest link only for that link's own address, strict ``rp_filter``, no
redirects, no proxy ARP. The netdev ingress chain (net/compile.py) is the second wall.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from sandgate import TYPE_CHECKING
from sandgate.errors import NetError
from sandgate.net import ns

if TYPE_CHECKING:  # the compiler pulls in policy/ and pydantic, which `run` does not need
    from typing import Any, Literal

    from sandgate.net.compile import GuestLink

GUEST_IFNAME = "eth0"


@dataclass(frozen=True)
class Uplink:
    """How the gateway reaches the outside.

    kind "netns": a veth whose far end goes into namespace ``peer_netns`` (the test world's
    LAN), enslaved to ``peer_master`` there; the gateway takes ``address`` and routes via
    ``via``.
    kind "pasta": the real uplink of this host, through pasta (package passt), which gives the
    gateway a tap device and carries its traffic out as ordinary sockets of the host. Nothing
    in the host's namespace changes: no route, no sysctl, no firewall rule, no link.
    kind "handed": an interface the gateway was handed (a gateway VM's eth0), configured by
    the machine's own network setup; the gateway only checks it is there and hardens it.
    """

    kind: Literal["netns", "pasta", "handed"]
    address: str = ""  # CIDR, e.g. "10.77.0.2/24"
    via: str = ""  # next hop
    peer_netns: str = ""
    peer_ifname: str = ""
    peer_master: str = ""
    ifname: str = "up0"  # the uplink's name inside the gateway
    # IPv6 (issue 14 part 5): the uplink's IPv6 CIDR and next hop, where it has IPv6 (kind
    # "netns" only, today). With them the gateway judges and NATs its guests' IPv6.
    address6: str = ""
    via6: str = ""

    @property
    def has_ipv6(self) -> bool:
        return bool(self.address6 and self.via6)


# Namespace-wide settings of the gateway, written before forwarding is switched on.
GATEWAY_SYSCTLS = {
    # Refusals are ICMP errors; the kernel's per-peer limit (one a second after a burst of 6)
    # made a refused agent wait out a SYN retransmission. The global cap stays
    # (icmp_msgs_per_sec, 1000/s), so a guest cannot make the gateway flood.
    "net.ipv4.icmp_ratelimit": "0",
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
    "net.ipv4.conf.all.arp_ignore": "1",
    "net.ipv4.conf.default.arp_ignore": "1",
    "net.ipv4.conf.all.arp_announce": "2",
    "net.ipv4.conf.default.arp_announce": "2",
    "net.ipv4.conf.all.rp_filter": "1",
    "net.ipv4.conf.default.rp_filter": "1",
    "net.ipv4.conf.all.send_redirects": "0",
    "net.ipv4.conf.default.send_redirects": "0",
    "net.ipv4.conf.all.accept_redirects": "0",
    "net.ipv4.conf.default.accept_redirects": "0",
    "net.ipv4.conf.all.accept_source_route": "0",
    "net.ipv4.conf.all.proxy_arp": "0",
}

# In each guest namespace.
GUEST_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
    # Unprivileged ICMP echo sockets, so `ping` works (and is logged) without file capabilities,
    # which no-new-privileges disables inside the sandbox.
    "net.ipv4.ping_group_range": "0 2147483647",
}


def link_sysctl_values(ifname: str) -> dict[str, str]:
    """Every link of the gateway: IPv6 off, ARP only for the link's own address, strict
    rp_filter (also written as a sysctl drop-in by export gateway-vm)."""
    return {
        f"net.ipv6.conf.{ifname}.disable_ipv6": "1",
        f"net.ipv4.conf.{ifname}.arp_ignore": "1",
        f"net.ipv4.conf.{ifname}.arp_announce": "2",
        f"net.ipv4.conf.{ifname}.rp_filter": "1",
        f"net.ipv4.conf.{ifname}.send_redirects": "0",
        f"net.ipv4.conf.{ifname}.proxy_arp": "0",
    }


# An IPv6 link of ours that says nothing by itself: no link-local address (addr_gen_mode 1),
# no duplicate address detection, no router advertisements or solicitations taken or sent.
# Written before disable_ipv6 goes to 0, which is when the kernel would make a link-local.
def quiet_ipv6_values(ifname: str) -> dict[str, str]:
    return {
        f"net.ipv6.conf.{ifname}.addr_gen_mode": "1",
        f"net.ipv6.conf.{ifname}.accept_ra": "0",
        f"net.ipv6.conf.{ifname}.accept_dad": "0",
        f"net.ipv6.conf.{ifname}.dad_transmits": "0",
        f"net.ipv6.conf.{ifname}.router_solicitations": "0",
        f"net.ipv6.conf.{ifname}.accept_redirects": "0",
        f"net.ipv6.conf.{ifname}.disable_ipv6": "0",
    }


IFA_F_NODAD = 0x02
NUD_PERMANENT = 0x80


def guest_mac(index: int) -> str:
    """A locally administered, stable MAC per guest index (the ingress chain pins it)."""
    return f"02:53:47:{(index >> 16) & 0xFF:02x}:{(index >> 8) & 0xFF:02x}:{index & 0xFF:02x}"


@dataclass
class Plumber:
    """Makes and removes the gateway's links. One per daemon."""

    ipr: Any = None

    def __post_init__(self) -> None:
        if self.ipr is None:
            self.ipr = ns.iproute(None)

    def close(self) -> None:
        self.ipr.close()

    # -- the gateway itself -------------------------------------------------------------------

    def harden_gateway(self) -> None:
        ns.write_sysctls(GATEWAY_SYSCTLS)
        lo = self._index("lo")
        self.ipr.link("set", index=lo, state="up")

    def enable_forwarding(self, ipv6: bool = False) -> None:
        ns.write_sysctls({"net.ipv4.ip_forward": "1"})
        if ipv6:
            ns.write_sysctls({"net.ipv6.conf.all.forwarding": "1"})

    def disable_forwarding(self) -> None:
        ns.write_sysctls({"net.ipv4.ip_forward": "0"})
        if Path("/proc/sys/net/ipv6/conf/all/forwarding").exists():
            ns.write_sysctls({"net.ipv6.conf.all.forwarding": "0"})

    @staticmethod
    def forwarding() -> bool:
        """Is IPv4 forwarding on in this (the gateway's) namespace?"""
        return Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"

    def link_sysctls(self, ifname: str) -> None:
        ns.write_sysctls(link_sysctl_values(ifname))

    # -- uplink -------------------------------------------------------------------------------

    def make_uplink(self, up: Uplink) -> None:
        if up.kind == "netns":
            self._uplink_netns(up)
        elif up.kind == "pasta":
            pass  # pasta, started from the host side, brings its own tap device (manage.py)
        elif up.kind == "handed":
            self.link_sysctls(up.ifname)  # checked present before anything was applied
        else:  # pragma: no cover - config is validated by its type
            raise NetError(f"unknown uplink kind {up.kind!r}")

    def _uplink_netns(self, up: Uplink) -> None:
        ns.check_ours(up.peer_netns)
        fd = os.open(ns.path(up.peer_netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.ipr.link(
                "add",
                ifname=up.ifname,
                kind="veth",
                peer={"ifname": up.peer_ifname, "net_ns_fd": fd},
            )
        finally:
            os.close(fd)
        self.link_sysctls(up.ifname)
        peer = ns.iproute(up.peer_netns)
        try:
            idx = peer.link_lookup(ifname=up.peer_ifname)[0]
            if up.peer_master:
                master = peer.link_lookup(ifname=up.peer_master)[0]
                peer.link("set", index=idx, master=master)
            peer.link("set", index=idx, state="up")
        finally:
            peer.close()
        self._address_up(up.ifname, up.address)
        self.ipr.route("add", dst="default", gateway=up.via)
        if up.has_ipv6:
            # The uplink speaks neighbour discovery with its router (link-local and all), but
            # takes no router advertisement: its address and route are the ones given here.
            ns.write_sysctls(
                {
                    f"net.ipv6.conf.{up.ifname}.accept_ra": "0",
                    f"net.ipv6.conf.{up.ifname}.disable_ipv6": "0",
                }
            )
            iface6 = ipaddress.IPv6Interface(up.address6)
            idx = self._index(up.ifname)
            self.ipr.addr(
                "add",
                index=idx,
                address=str(iface6.ip),
                prefixlen=iface6.network.prefixlen,
                flags=IFA_F_NODAD,
            )
            self.ipr.route("add", dst="::/0", gateway=up.via6, family=socket.AF_INET6)

    # -- guests -------------------------------------------------------------------------------

    def attach_guest(self, link: GuestLink, guest_netns: str, ipv6: bool = False) -> None:
        """Create the guest's veth (its end is eth0 inside ``guest_netns``); configure both ends.
        ``ipv6``: the uplink has IPv6, and so does the link (``_quiet_ipv6``)."""
        ns.run_in(guest_netns, lambda: ns.write_sysctls(GUEST_SYSCTLS))
        fd = os.open(ns.path(guest_netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            self.ipr.link(
                "add",
                ifname=link.ifname,
                kind="veth",
                peer={"ifname": GUEST_IFNAME, "net_ns_fd": fd, "address": link.mac},
            )
        finally:
            os.close(fd)
        self.link_sysctls(link.ifname)
        self._address_up(link.ifname, f"{link.gateway}/30")
        guest = ns.iproute(guest_netns)
        try:
            lo = guest.link_lookup(ifname="lo")[0]
            guest.link("set", index=lo, state="up")
            idx = guest.link_lookup(ifname=GUEST_IFNAME)[0]
            guest.addr("add", index=idx, address=str(link.guest), prefixlen=30)
            guest.link("set", index=idx, state="up")
            guest.route("add", dst="default", gateway=str(link.gateway))
        finally:
            guest.close()
        if ipv6:
            self._quiet_ipv6(link, guest_netns)

    def _quiet_ipv6(self, link: GuestLink, guest_netns: str) -> None:
        """IPv6 on a guest link without a word of its own: an address each end (the guest's
        /64, no DAD), static neighbours both ways (so no neighbour discovery is needed, and the
        guest's table drops what the kernel would still send), the guest's route via the
        gateway's address."""
        ns.write_sysctls(quiet_ipv6_values(link.ifname))
        idx = self._index(link.ifname)
        gw_mac = self.ipr.link("get", index=idx)[0].get_attr("IFLA_ADDRESS")
        six = socket.AF_INET6
        self.ipr.addr("add", index=idx, address=str(link.gateway6), prefixlen=64, flags=IFA_F_NODAD)
        self.ipr.neigh(
            "add",
            dst=str(link.guest6),
            lladdr=link.mac,
            ifindex=idx,
            state=NUD_PERMANENT,
            family=six,
        )
        ns.run_in(guest_netns, lambda: ns.write_sysctls(quiet_ipv6_values(GUEST_IFNAME)))
        guest = ns.iproute(guest_netns)
        try:
            gidx = guest.link_lookup(ifname=GUEST_IFNAME)[0]
            guest.addr("add", index=gidx, address=str(link.guest6), prefixlen=64, flags=IFA_F_NODAD)
            guest.neigh(
                "add",
                dst=str(link.gateway6),
                lladdr=gw_mac,
                ifindex=gidx,
                state=NUD_PERMANENT,
                family=six,
            )
            guest.route("add", dst="::/0", gateway=str(link.gateway6), family=six)
        finally:
            guest.close()

    def check_handed(self, names: list[str]) -> list[str]:
        """What is wrong with the handed interfaces (missing, no carrier), each with its fix;
        called before anything is applied."""
        problems = []
        for name in names:
            found = self.ipr.link_lookup(ifname=name)
            if not found:
                problems.append(f"no interface {name} here (ip link shows what there is)")
                continue
            (msg,) = self.ipr.link("get", index=found[0])
            if msg.get_attr("IFLA_CARRIER") == 0:
                problems.append(f"{name} has no carrier: is its bridge or peer up and attached?")
        return problems

    def adopt_guest(self, link: GuestLink) -> None:
        """A handed guest link: hardened, its addresses replaced by the gateway's /30, up.
        (An address the machine's own setup gave it would be a second, unjudged way in.)"""
        self.link_sysctls(link.ifname)
        idx = self._index(link.ifname)
        for addr in self.ipr.get_addr(index=idx, family=2):
            self.ipr.addr(
                "del", index=idx, address=addr.get_attr("IFA_ADDRESS"), prefixlen=addr["prefixlen"]
            )
        self._address_up(link.ifname, f"{link.gateway}/30")

    def release_guest(self, link: GuestLink) -> None:
        """Undo ``adopt_guest``'s address; the link is not ours to delete."""
        found = self.ipr.link_lookup(ifname=link.ifname)
        if found:
            with contextlib.suppress(Exception):
                self.ipr.addr("del", index=found[0], address=str(link.gateway), prefixlen=30)

    def detach_guest(self, link: GuestLink) -> None:
        found = self.ipr.link_lookup(ifname=link.ifname)
        if found:
            self.ipr.link("del", index=found[0])

    def has_link(self, ifname: str) -> bool:
        return bool(self.ipr.link_lookup(ifname=ifname))

    # -- helpers ------------------------------------------------------------------------------

    def _index(self, ifname: str) -> int:
        found = self.ipr.link_lookup(ifname=ifname)
        if not found:
            raise NetError(f"no link {ifname} in the gateway")
        return int(found[0])

    def _address_up(self, ifname: str, cidr: str) -> None:
        iface = ipaddress.IPv4Interface(cidr)
        idx = self._index(ifname)
        self.ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
        self.ipr.link("set", index=idx, state="up")
