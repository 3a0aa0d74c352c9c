"""NFLOG (nfnetlink_log) reader: what nftables ``log group N`` statements report.

``parse_nflog(datagram)`` is pure: netlink bytes in, ``NflogPacket`` values out, including the
addresses, ports, TCP flags and ICMP type read from the copied start of the packet.
``NflogSocket`` is the I/O edge: it binds one group in one network namespace and drains it.

Why these kernel settings (see ``NflogSocket``): the kernel batches log messages per group until
``qthresh`` packets, a full batch buffer (``nlbufsiz``) or ``timeout_cs`` hundredths of a second,
whichever comes first; a larger batch costs fewer wakeups but adds delay when traffic is sparse.
Sequence numbers (``NFULNL_CFG_F_SEQ``) number every message of the group, so a dropped batch shows
up as a gap and ``NflogSocket.lost`` counts it.

There is no uid/gid flag to request: the kernel adds ``NFULA_UID``/``NFULA_GID`` by itself whenever
the packet still carries its sending socket, i.e. for locally generated packets (output hooks).
They are the credentials the socket was opened with, not those of whoever sends on it later.

Measured on kernel 6.18, 2 cores: ``read()`` costs ~8-12 us CPU per packet; a lone packet is
reported after ~0.25 ms with ``qthresh=1`` but only after ``timeout_cs`` with ``qthresh=64``;
unpaced (~150k packets/s) ``qthresh=1`` lost ~30% while 64 lost none or a short tail run. The
defaults (64, 10 cs) trade at most 100 ms of delay on sparse traffic for burst safety.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple

from sandgate.net import iphead
from sandgate.net.netlink import (
    NFGENMSG,
    NetfilterSocket,
    NetlinkParseError,
    nl_attrs,
    nl_messages,
    pack_attr,
    run_in_netns,
)

__all__ = [
    "HOOK_NAMES",
    "MarkerSender",
    "NflogPacket",
    "NflogSocket",
    "SeqTracker",
    "config_attrs",
    "parse_nflog",
]

# linux/netfilter/nfnetlink.h, nfnetlink_log.h
NFNL_SUBSYS_ULOG = 4
NFULNL_MSG_PACKET = 0
NFULNL_MSG_CONFIG = 1
_MSG_PACKET = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET
_MSG_CONFIG = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG

NFULA_PACKET_HDR = 1
NFULA_MARK = 2
NFULA_TIMESTAMP = 3
NFULA_IFINDEX_INDEV = 4
NFULA_IFINDEX_OUTDEV = 5
NFULA_PAYLOAD = 9
NFULA_PREFIX = 10
NFULA_UID = 11
NFULA_SEQ = 12
NFULA_SEQ_GLOBAL = 13
NFULA_GID = 14

NFULA_CFG_CMD = 1
NFULA_CFG_MODE = 2
NFULA_CFG_NLBUFSIZ = 3
NFULA_CFG_TIMEOUT = 4
NFULA_CFG_QTHRESH = 5
NFULA_CFG_FLAGS = 6
NFULNL_CFG_CMD_BIND = 1
NFULNL_COPY_PACKET = 2
NFULNL_CFG_F_SEQ = 0x1
NFULNL_CFG_F_SEQ_GLOBAL = 0x2

NFPROTO_IPV4 = 2
NFPROTO_ARP = 3
NFPROTO_IPV6 = 10
ETH_P_IP = 0x0800
ETH_P_ARP = 0x0806
ETH_P_IPV6 = 0x86DD

# Hook numbers as the kernel reports them for ip/ip6/inet tables (NF_INET_*).
HOOK_NAMES = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting"}

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_PKT_HDR = struct.Struct("!HB")  # hw_protocol, hook (then one pad byte)
_TSTAMP = struct.Struct("!QQ")  # sec, usec
_PORTS = struct.Struct("!HH")
_CFG_MODE = struct.Struct("!IBB")  # copy_range, copy_mode, pad

# IPv6 headers to step over before the transport header, and how their length is encoded.
_PORT_PROTOS = frozenset({6, 17, 33, 132, 136})  # TCP, UDP, DCCP, SCTP, UDP-Lite
_ICMP_PROTOS = frozenset({1, 58})
_ETHERTYPE_ARP = b"\x08\x06"
_ARP_ETHER_IPV4 = b"\x00\x01\x08\x00\x06\x04"  # htype 1, ptype IPv4, hlen 6, plen 4


@dataclass(frozen=True, slots=True)
class NflogPacket:
    """One logged packet. ``None`` means the kernel did not send the field or it was not copied.

    ``indev``/``outdev`` are ifindexes in the logging namespace. ``uid``/``gid`` exist only for
    locally generated packets. ``length`` is the L3 length the IP header claims (the copy may be
    shorter); for other payloads, the copied length. ``src``/``dst`` of an ARP packet are the
    sender and target protocol addresses.
    """

    group: int
    prefix: str
    hook: int | None
    family: int
    indev: int | None
    outdev: int | None
    uid: int | None
    gid: int | None
    seq: int | None
    seq_global: int | None
    timestamp: float | None
    proto: int | None
    src: str | None
    dst: str | None
    sport: int | None
    dport: int | None
    tcp_flags: int | None
    icmp_type: int | None
    icmp_code: int | None
    length: int
    mark: int | None


class _Headers(NamedTuple):
    proto: int | None = None
    src: str | None = None
    dst: str | None = None
    sport: int | None = None
    dport: int | None = None
    tcp_flags: int | None = None
    icmp_type: int | None = None
    icmp_code: int | None = None
    length: int = 0


def parse_nflog(buf: bytes) -> list[NflogPacket]:
    """Every packet message in one NFLOG datagram, in order.

    Other message types (the ``NLMSG_DONE`` closing a batch, acks) are skipped. Raises
    ``NetlinkParseError`` (a ``ValueError``) when the netlink framing is broken; a packet whose
    copied headers are cut short is not an error, its unreadable fields are ``None``.
    """
    out: list[NflogPacket] = []
    for mtype, _flags, _seq, start, end in nl_messages(buf):
        if mtype != _MSG_PACKET:
            continue
        if end - start < NFGENMSG.size:
            raise NetlinkParseError("NFLOG message shorter than nfgenmsg")
        family, _version, group = NFGENMSG.unpack_from(buf, start)
        out.append(_packet(family, group, nl_attrs(buf, start + NFGENMSG.size, end)))
    return out


def _packet(family: int, group: int, attrs: dict[int, bytes]) -> NflogPacket:
    hook = hwproto = None
    hdr = attrs.get(NFULA_PACKET_HDR)
    if hdr is not None:
        hwproto, hook = _unpack(_PKT_HDR, hdr)
    stamp = attrs.get(NFULA_TIMESTAMP)
    timestamp = None
    if stamp is not None:
        sec, usec = _unpack(_TSTAMP, stamp)
        timestamp = sec + usec / 1e6
    prefix = attrs.get(NFULA_PREFIX, b"").split(b"\0", 1)[0].decode("utf-8", "replace")
    heads = _headers(family, hwproto, attrs.get(NFULA_PAYLOAD, b""))
    return NflogPacket(
        group=group,
        prefix=prefix,
        hook=hook,
        family=family,
        indev=_u32(attrs, NFULA_IFINDEX_INDEV),
        outdev=_u32(attrs, NFULA_IFINDEX_OUTDEV),
        uid=_u32(attrs, NFULA_UID),
        gid=_u32(attrs, NFULA_GID),
        seq=_u32(attrs, NFULA_SEQ),
        seq_global=_u32(attrs, NFULA_SEQ_GLOBAL),
        timestamp=timestamp,
        proto=heads.proto,
        src=heads.src,
        dst=heads.dst,
        sport=heads.sport,
        dport=heads.dport,
        tcp_flags=heads.tcp_flags,
        icmp_type=heads.icmp_type,
        icmp_code=heads.icmp_code,
        length=heads.length,
        mark=_u32(attrs, NFULA_MARK),
    )


def _unpack(fmt: struct.Struct, data: bytes) -> tuple[int, ...]:
    if len(data) < fmt.size:
        raise NetlinkParseError(f"attribute of {len(data)} bytes, expected {fmt.size}")
    return fmt.unpack_from(data)


def _u32(attrs: dict[int, bytes], key: int) -> int | None:
    data = attrs.get(key)
    if data is None:
        return None
    if len(data) != 4:
        raise NetlinkParseError(f"attribute {key} of {len(data)} bytes, expected 4")
    return int.from_bytes(data, "big")


def _headers(family: int, hwproto: int | None, payload: bytes) -> _Headers:
    """Dispatch on the link-layer protocol the kernel reports, else on family and IP version."""
    if hwproto == ETH_P_ARP or (hwproto is None and family == NFPROTO_ARP):
        return _arp(payload)
    version = payload[0] >> 4 if payload else 0
    if hwproto == ETH_P_IP or (hwproto != ETH_P_IPV6 and version == 4):
        return _ipv4(payload)
    if hwproto == ETH_P_IPV6 or version == 6:
        return _ipv6(payload)
    return _Headers(length=len(payload))


def _ipv4(p: bytes) -> _Headers:
    return _from_ip(iphead.ipv4(p), p)


def _ipv6(p: bytes) -> _Headers:
    return _from_ip(iphead.ipv6(p), p)


def _from_ip(h: iphead.IpHead, p: bytes) -> _Headers:
    if h.src is None or h.dst is None:
        return _Headers(length=h.end)
    if h.proto is None:
        return _Headers(src=h.src, dst=h.dst, length=h.end)
    return _transport(h.proto, h.src, h.dst, h.end, p[h.l4 :] if h.l4 is not None else b"")


def _transport(proto: int, src: str, dst: str, length: int, l4: bytes) -> _Headers:
    if proto in _PORT_PROTOS and len(l4) >= 4:
        sport, dport = _PORTS.unpack_from(l4)
        flags = l4[13] if proto == 6 and len(l4) >= 14 else None
        return _Headers(proto, src, dst, sport, dport, tcp_flags=flags, length=length)
    if proto in _ICMP_PROTOS and len(l4) >= 2:
        return _Headers(proto, src, dst, icmp_type=l4[0], icmp_code=l4[1], length=length)
    return _Headers(proto, src, dst, length=length)


def _arp(p: bytes) -> _Headers:
    # On the ARP output hook the frame is already built, so the copy starts with the Ethernet
    # header; on input it starts with the ARP header. Recognise an IPv4-over-Ethernet ARP header.
    arp = p[14:] if p[:6] != _ARP_ETHER_IPV4 and p[12:14] == _ETHERTYPE_ARP else p
    if arp[:6] == _ARP_ETHER_IPV4 and len(arp) >= 28:
        src = socket.inet_ntop(socket.AF_INET, arp[14:18])  # sender protocol address
        dst = socket.inet_ntop(socket.AF_INET, arp[24:28])  # target protocol address
        return _Headers(src=src, dst=dst, length=len(arp))
    return _Headers(length=len(p))


class SeqTracker:
    """Counts messages missing from a stream of u32 NFLOG sequence numbers.

    A freshly bound group is numbered from 0, so a lost first batch is counted too. A number at
    or behind the expected one is a duplicate or reordering, not a loss, and counts nothing.
    """

    def __init__(self, expected: int = 0) -> None:
        self.expected = expected

    def observe(self, seq: int) -> int:
        """Record ``seq``; return how many numbers were skipped before it."""
        gap = (seq - self.expected) & 0xFFFFFFFF  # u32 arithmetic: the counter wraps
        if gap >= 1 << 31:
            return 0
        self.expected = (seq + 1) & 0xFFFFFFFF
        return gap


def config_attrs(*, qthresh: int, timeout_cs: int, copy_range: int, nlbufsiz: int | None) -> bytes:
    """The attributes of the one config request that binds a group and sets it up."""
    attrs = [
        pack_attr(NFULA_CFG_CMD, bytes([NFULNL_CFG_CMD_BIND])),
        pack_attr(NFULA_CFG_MODE, _CFG_MODE.pack(copy_range, NFULNL_COPY_PACKET, 0)),
        pack_attr(NFULA_CFG_QTHRESH, _U32.pack(qthresh)),
        pack_attr(NFULA_CFG_TIMEOUT, _U32.pack(timeout_cs)),
        pack_attr(NFULA_CFG_FLAGS, _U16.pack(NFULNL_CFG_F_SEQ | NFULNL_CFG_F_SEQ_GLOBAL)),
    ]
    if nlbufsiz is not None:
        attrs.append(pack_attr(NFULA_CFG_NLBUFSIZ, _U32.pack(nlbufsiz)))
    return b"".join(attrs)


class NflogSocket:
    """A netlink socket bound to one NFLOG group of the namespace it was created in.

    The kernel allows one listener per group and namespace: binding a group another socket holds
    raises ``NetlinkError`` with errno EPERM (not EBUSY). Closing the socket releases the group.

    ``qthresh``, ``timeout_cs`` and ``nlbufsiz`` tune the kernel's batching (module docstring);
    ``copy_range`` is how many bytes of each packet, from the L3 header on, are copied (128 holds
    IPv4/IPv6 plus TCP headers with options).

    Loss counters. Once the receive buffer overflows, the kernel drops every batch until this
    socket has been read empty, so losses come in runs. ``lost`` is the number of packets missing
    from the sequence numbers; a run at the very end of a burst shows there only when the next
    packet arrives, but at once in ``overruns`` (``ENOBUFS`` reports, one per run) and in
    ``kernel_drops()`` (batches). They describe the same losses: do not add them. ``malformed``
    counts datagrams that did not parse.

    The socket is non-blocking. With asyncio, let the loop watch it and drain on readiness::

        loop.add_reader(sock.fileno(), lambda: queue.put_nowait(sock.read()))
        ...
        loop.remove_reader(sock.fileno()); sock.close()
    """

    def __init__(
        self,
        group: int,
        *,
        qthresh: int = 64,
        timeout_cs: int = 10,
        copy_range: int = 128,
        rcvbuf: int = 4 << 20,
        nlbufsiz: int | None = None,
    ) -> None:
        if not 0 <= group <= 0xFFFF:
            raise ValueError(f"NFLOG group {group} out of range 0..65535")
        self.group = group
        self.lost = 0
        self.malformed = 0
        self._seqs = SeqTracker()
        self._nl = NetfilterSocket(rcvbuf=rcvbuf)
        try:
            attrs = config_attrs(
                qthresh=qthresh, timeout_cs=timeout_cs, copy_range=copy_range, nlbufsiz=nlbufsiz
            )
            self._nl.request(_MSG_CONFIG, family=socket.AF_UNSPEC, res_id=group, attrs=attrs)
        except BaseException:
            self._nl.close()
            raise

    @classmethod
    def in_netns(cls, netns_path: str, group: int, **kw: int) -> NflogSocket:
        """Create the socket inside the namespace at ``netns_path`` (e.g. ``/run/netns/NAME``).

        Only a helper thread enters the namespace; the caller's thread stays where it is.
        """
        return run_in_netns(netns_path, lambda: cls(group, **kw))

    @property
    def overruns(self) -> int:
        return self._nl.overruns

    def kernel_drops(self) -> int:
        """Datagrams (batches, not packets) the kernel dropped for this socket."""
        return self._nl.kernel_drops()

    def fileno(self) -> int:
        return self._nl.fileno()

    def read(self, limit: int = 1024) -> list[NflogPacket]:
        """Packets already queued, from at most ``limit`` datagrams; never blocks."""
        packets: list[NflogPacket] = []
        for dgram in self._nl.recv_datagrams(limit):
            try:
                packets.extend(parse_nflog(dgram))
            except NetlinkParseError:
                self.malformed += 1
        for packet in packets:
            if packet.seq is not None:
                self.lost += self._seqs.observe(packet.seq)
        return packets

    def close(self) -> None:
        self._nl.close()

    def __enter__(self) -> NflogSocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class MarkerSender:
    """Sends the datagrams a ruleset's flush-marker rule logs (net/compile.py ``FLUSH_MARK``).

    One UDP socket carrying ``mark`` (``SO_MARK`` needs CAP_NET_ADMIN, which a guest's
    processes lack, so they cannot forge one); each marker goes to 127.0.0.1 with its ``token``
    as destination port, which the NFLOG record carries back. The output hook runs inside
    ``sendto``, so the marker is logged (and the group's batch sent) before ``sendto`` returns;
    the rule then drops it, and the EPERM that follows is the expected outcome.
    """

    def __init__(self, mark: int) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise

    def send(self, token: int) -> None:
        """One marker; ``token`` in 1..65535. ``OSError`` when it could not be sent."""
        with contextlib.suppress(PermissionError):  # dropped by the marker rule, once logged
            self._sock.sendto(b"", ("127.0.0.1", token))

    def close(self) -> None:
        self._sock.close()
