"""The connections the kernel tracks, read and cut: ctnetlink (pyroute2's ``NFCTSocket``).

A policy reload swaps a guest's rules, but ``ct state established`` in the forward chain still
accepts every flow the old rules let in. ``flows`` lists the flows a guest opened through the
gateway; ``cut`` ends one: the guest's socket is destroyed in its own namespace (``SOCK_DESTROY``,
the kernel then sends the peer a reset and the guest's program gets ECONNABORTED), then the
conntrack entry is deleted, so the next packet of the flow meets the new rules, which refuse it.
A guest whose namespace the gateway cannot enter (a VM behind a gateway VM) loses only the entry.
``forget`` deletes every entry of a leaving guest's addresses, so the next guest given them
starts with none.

Call them from the gateway's namespace (the daemon's own).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sandgate.net.netlink import NLM_F_ACK, NLMSG_ERROR, nl_error_code, nl_messages, run_in_netns
from sandgate.net.sockdiag import open_socket, pack_diag_request

SOCK_DESTROY = 21
_PROTOCOLS = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp"}


@dataclass(frozen=True)
class Flow:
    """One tracked flow as the guest sent it (the original direction)."""

    proto: str  # "tcp" | "udp"
    src: str
    sport: int
    dst: str
    dport: int


def flows(*sources: str) -> list[Flow]:
    """The TCP and UDP flows from ``sources`` (a guest's IPv4 and IPv6 addresses) that the
    gateway forwards to their destination unchanged. Flows redirected to the gateway itself (its
    resolver, its proxy: the reply comes from another address or port) are left out: those are
    judged there, request by request."""
    from pyroute2 import NFCTSocket

    found: list[Flow] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        mine = {s for s in sources if _family(s) == family}
        if not mine:
            continue
        with NFCTSocket(nfgen_family=family) as ct:  # a request's family picks the table
            for msg in ct.dump():
                flow = _flow_of(msg, family)
                if flow is not None and flow.src in mine:
                    found.append(flow)
    return found


def _family(address: str) -> int:
    return socket.AF_INET if ipaddress.ip_address(address).version == 4 else socket.AF_INET6


def _flow_of(msg: Any, family: int = socket.AF_INET) -> Flow | None:
    orig, reply = msg.get_attr("CTA_TUPLE_ORIG"), msg.get_attr("CTA_TUPLE_REPLY")
    if orig is None or reply is None:
        return None
    o_ip, o_pr = orig.get_attr("CTA_TUPLE_IP"), orig.get_attr("CTA_TUPLE_PROTO")
    r_ip, r_pr = reply.get_attr("CTA_TUPLE_IP"), reply.get_attr("CTA_TUPLE_PROTO")
    if None in (o_ip, o_pr, r_ip, r_pr):
        return None
    proto = _PROTOCOLS.get(o_pr.get_attr("CTA_PROTO_NUM"))
    if proto is None:
        return None
    v = "V4" if family == socket.AF_INET else "V6"
    dst, dport = o_ip.get_attr(f"CTA_IP_{v}_DST"), o_pr.get_attr("CTA_PROTO_DST_PORT")
    if (r_ip.get_attr(f"CTA_IP_{v}_SRC"), r_pr.get_attr("CTA_PROTO_SRC_PORT")) != (dst, dport):
        return None  # DNAT'd to the gateway's own resolver or proxy
    return Flow(
        proto, o_ip.get_attr(f"CTA_IP_{v}_SRC"), o_pr.get_attr("CTA_PROTO_SRC_PORT"), dst, dport
    )


def cut(flow: Flow, guest_netns: str | None) -> bool:
    """End ``flow``: reset its guest socket (TCP, when ``guest_netns`` is a namespace path we can
    enter), then forget its conntrack entry. True if the entry was there."""
    if flow.proto == "tcp" and guest_netns is not None:
        with contextlib.suppress(OSError):
            run_in_netns(guest_netns, lambda: _destroy(flow))
    from pyroute2 import NFCTSocket
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    number = {v: k for k, v in _PROTOCOLS.items()}[flow.proto]
    family = _family(flow.src)
    tup = NFCTAttrTuple(
        family=family,
        saddr=flow.src,
        daddr=flow.dst,
        proto=number,
        sport=flow.sport,
        dport=flow.dport,
    )
    with NFCTSocket(nfgen_family=family) as ct:
        try:
            ct.entry("del", tuple_orig=tup)
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:
                return False
            raise
    return True


def forget(addresses: Iterable[str]) -> int:
    """Delete every tracked flow that starts or ends at one of ``addresses``: a leaving guest's.
    An entry outlives its guest (a UDP flow for minutes, a TCP flow whose guest vanished without
    a FIN for days), and the next guest given the address would inherit it: ``ct state
    established`` would accept that guest's packets of the same flow without a verdict. The
    kernel filters the dump by address (5.8 and later); the match is checked here again, so an
    older kernel only costs a longer dump. The number deleted."""
    from pyroute2 import NFCTSocket
    from pyroute2.netlink.exceptions import NetlinkError
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    wanted = {ipaddress.ip_address(a) for a in addresses}
    deleted = 0
    for family in (socket.AF_INET, socket.AF_INET6):
        mine = {a for a in wanted if _family(str(a)) == family}
        if not mine:
            continue
        # A ctnetlink request's family picks the table: one socket a family.
        with NFCTSocket(nfgen_family=family) as ct:
            found: dict[tuple[Any, ...], dict[str, Any]] = {}
            for probe in _probes(family, mine):
                for msg in ct.dump(tuple_orig=probe):
                    tup = _orig_tuple(msg, family)
                    if tup is not None and mine & {
                        ipaddress.ip_address(tup["saddr"]),
                        ipaddress.ip_address(tup["daddr"]),
                    }:
                        found[tuple(sorted(tup.items()))] = tup
            for tup in found.values():
                try:
                    ct.entry("del", tuple_orig=NFCTAttrTuple(**tup))
                except NetlinkError as exc:
                    if exc.code != errno.ENOENT:  # ended on its own meanwhile: fine
                        raise
                else:
                    deleted += 1
    return deleted


def _probes(
    family: int, addresses: Iterable[ipaddress.IPv4Address | ipaddress.IPv6Address]
) -> list[Any]:
    """The dump filters for ``addresses``: each as source and as destination. The kernel (6.18
    here) answers an IPv6 address filter with nothing, so IPv6 is dumped whole (its table holds
    the few flows of guests with an IPv6 uplink)."""
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    if family == socket.AF_INET6:
        return [None]
    return [
        NFCTAttrTuple(family=family, **{side: str(a)})
        for a in addresses
        for side in ("saddr", "daddr")
    ]


def _orig_tuple(msg: Any, family: int) -> dict[str, Any] | None:
    """The original direction of a conntrack message as ``NFCTAttrTuple`` keywords."""
    orig = msg.get_attr("CTA_TUPLE_ORIG")
    if orig is None:
        return None
    ip, proto = orig.get_attr("CTA_TUPLE_IP"), orig.get_attr("CTA_TUPLE_PROTO")
    if ip is None or proto is None:
        return None
    v = "V4" if family == socket.AF_INET else "V6"
    icmp = "ICMP" if family == socket.AF_INET else "ICMPV6"
    out: dict[str, Any] = {
        "family": family,
        "saddr": ip.get_attr(f"CTA_IP_{v}_SRC"),
        "daddr": ip.get_attr(f"CTA_IP_{v}_DST"),
        "proto": proto.get_attr("CTA_PROTO_NUM"),
        "sport": proto.get_attr("CTA_PROTO_SRC_PORT"),
        "dport": proto.get_attr("CTA_PROTO_DST_PORT"),
        "icmp_id": proto.get_attr(f"CTA_PROTO_{icmp}_ID"),
        "icmp_type": proto.get_attr(f"CTA_PROTO_{icmp}_TYPE"),
        "icmp_code": proto.get_attr(f"CTA_PROTO_{icmp}_CODE"),
    }
    if out["saddr"] is None or out["daddr"] is None or out["proto"] is None:
        return None
    return out


def _destroy(flow: Flow) -> int:
    """``SOCK_DESTROY`` the guest's socket of ``flow`` (in the current namespace); 0 or -errno."""
    request = bytearray(pack_diag_request(flow.proto, flow.src, flow.sport, flow.dst, flow.dport))
    _len, _type, flags, seq, pid = struct.unpack_from("=IHHII", request)
    struct.pack_into("=IHHII", request, 0, _len, SOCK_DESTROY, flags | NLM_F_ACK, seq, pid)
    sock = open_socket()
    try:
        sock.send(bytes(request))
        buf = sock.recv(8192)
    finally:
        sock.close()
    for mtype, _flags, _seq, start, end in nl_messages(buf):
        if mtype == NLMSG_ERROR:
            return nl_error_code(buf, start, end)
    return -errno.EIO


def netns_path(name: str) -> str | None:
    """The namespace path of a local guest, or None when it is not on this machine."""
    from sandgate.net import ns

    path = ns.path(name)
    return path if os.path.exists(path) else None
