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

from sandgate.net.netlink import (
    NFGENMSG,
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    nl_attrs,
    nl_error_code,
    nl_messages,
    pack_attr,
    pack_nfmsg,
    run_in_netns,
)
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


# ``forget`` runs at every guest's leave. A conntrack dump walks the kernel's whole hash table
# (global, 262,144 buckets on this host: ~9 ms of kernel CPU per dump, even for an empty
# namespace; a 1 GB VM has ~16k buckets), whatever filter it carries, so it asks once, for
# both families (AF_UNSPEC), and matches here. Raw ctnetlink, not pyroute2's ``NFCTSocket``:
# this is the leave path, and the messages are a few fixed attributes.
_CT_GET, _CT_DELETE = (1 << 8) | 1, (1 << 8) | 2  # NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_*
_NLM_F_DUMP = 0x300
_CTA_TUPLE_ORIG, _CTA_ZONE = 1, 18
_CTA_TUPLE_IP = 1
# CTA_IP_V4_SRC/DST, CTA_IP_V6_SRC/DST
_IP_ATTRS: dict[int, tuple[int, int]] = {socket.AF_INET: (1, 2), socket.AF_INET6: (3, 4)}


def forget(addresses: Iterable[str]) -> int:
    """Delete every tracked flow that starts or ends at one of ``addresses``: a leaving guest's.
    An entry outlives its guest (a UDP flow for minutes, a TCP flow whose guest vanished without
    a FIN for days), and the next guest given the address would inherit it: ``ct state
    established`` would accept that guest's packets of the same flow without a verdict. The
    number deleted."""
    wanted = {socket.inet_pton(_family(a), a) for a in addresses}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 12) as sock:
        sock.settimeout(2.0)
        found: dict[tuple[int, bytes], bytes] = {}  # (family, original tuple) -> zone attribute
        for body in _dump(sock, DUMP_ALL, 1):
            match = matching_tuple(body, wanted)
            if match is not None:
                found[match[:2]] = match[2]
        deleted = 0
        for seq, ((family, orig), zone) in enumerate(found.items(), start=2):
            code = _ask(sock, delete_request(family, orig, zone, seq), seq)
            if code == 0:
                deleted += 1
            elif code != -errno.ENOENT:  # ended on its own meanwhile: fine
                raise OSError(-code, f"deleting a tracked flow: {os.strerror(-code)}")
    return deleted


# Every tracked flow of the namespace, both families (sequence number 1).
DUMP_ALL = pack_nfmsg(_CT_GET, NLM_F_REQUEST | _NLM_F_DUMP, 1, family=socket.AF_UNSPEC, res_id=0)


def matching_tuple(body: bytes, wanted: set[bytes]) -> tuple[int, bytes, bytes] | None:
    """A conntrack message's family, original tuple (as the kernel sent it) and zone
    attribute, when its source or destination is one of ``wanted`` (packed addresses)."""
    family = body[0] if body else 0
    if family not in _IP_ATTRS:
        return None
    top = nl_attrs(body, NFGENMSG.size, len(body))
    orig = top.get(_CTA_TUPLE_ORIG)
    if orig is None:
        return None
    ip = nl_attrs(orig, 0, len(orig)).get(_CTA_TUPLE_IP)
    if ip is None:
        return None
    ends = nl_attrs(ip, 0, len(ip))
    src_attr, dst_attr = _IP_ATTRS[family]
    if ends.get(src_attr) not in wanted and ends.get(dst_attr) not in wanted:
        return None
    zone = top.get(_CTA_ZONE)
    return family, orig, pack_attr(_CTA_ZONE, zone) if zone is not None else b""


def delete_request(family: int, orig: bytes, zone: bytes, seq: int) -> bytes:
    attrs = pack_attr(_CTA_TUPLE_ORIG | NLA_F_NESTED, orig) + zone
    return pack_nfmsg(
        _CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq, family=family, res_id=0, attrs=attrs
    )


def _dump(sock: socket.socket, request: bytes, seq: int) -> list[bytes]:
    """Send a dump request; the bodies of its answers, until the kernel says done."""
    sock.send(request)
    bodies: list[bytes] = []
    while True:
        buf = sock.recv(1 << 16)
        for mtype, _flags, mseq, start, end in nl_messages(buf):
            if mseq != seq:
                continue
            if mtype == NLMSG_DONE:
                return bodies
            if mtype == NLMSG_ERROR:
                code = nl_error_code(buf, start, end)
                if code:
                    raise OSError(-code, f"listing tracked flows: {os.strerror(-code)}")
                return bodies
            bodies.append(buf[start:end])


def _ask(sock: socket.socket, request: bytes, seq: int) -> int:
    """Send one request with an ack asked; its code (0 or -errno)."""
    sock.send(request)
    while True:
        buf = sock.recv(1 << 16)
        for mtype, _flags, mseq, start, end in nl_messages(buf):
            if mtype == NLMSG_ERROR and mseq == seq:
                return nl_error_code(buf, start, end)


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
