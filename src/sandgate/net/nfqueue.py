"""NFQUEUE (nfnetlink_queue): packets the kernel holds until user space gives a verdict.

``parse_nfqueue(datagram)`` is pure: netlink bytes in, ``QueuedPacket`` values out, with the
addresses, ports, TCP sequence number and flags, and where the TCP/UDP payload starts.
``pack_verdict``/``pack_verdict_batch`` build the answers. ``NfqueueSocket`` is the I/O edge: it
binds one queue number in one network namespace, reads packets and sends verdicts. What to hold
and what to answer for TLS first flights lives in net/iptables.py (rules and ``FirstFlights``).

What the kernel does (6.18, read from net/netfilter/nfnetlink_queue.c; all but the queue-full
and batch points are exercised by tests/kernel/test_nfqueue.py):

* Nobody bound to the queue number: the packet is **dropped**, unless the rule says
  ``--queue-bypass`` (then it skips the queue as if accepted). The rules sandgate installs never
  say it, so a dead reader blocks undecided flows (fail closed). Closing the socket (or the
  process dying) unbinds the queue and drops every packet still held.
* Queue full (``maxlen`` packets held) or the socket's receive buffer full: dropped, unless the
  queue was bound with ``fail_open`` (``NFQA_CFG_F_FAIL_OPEN``), which accepts instead. Held packets
  count towards ``maxlen``; there is no timeout, a packet stays held until its verdict.
* ``NFQA_MARK`` in a verdict replaces ``skb->mark`` (all 32 bits). ``NFQA_CT``/``CTA_MARK`` would
  set the conntrack mark, but only with ``CONFIG_NETFILTER_NETLINK_GLUE_CT``; without it (this
  kernel) the verdict's ``NFQA_CT`` is silently ignored and binding with ``conntrack=True``
  (``NFQA_CFG_F_CONNTRACK``) fails with EOPNOTSUPP. Portable way to set the ct mark: verdict
  ``repeat=True`` with a packet mark, and a rule before the queue rule that copies that mark into
  the ct mark (``CONNMARK --save-mark``, see net/iptables.py). ``NF_REPEAT`` runs the same base
  chain again from its first rule; plain accept continues with the next base chain on the hook.
* ``NFQNL_MSG_VERDICT_BATCH`` applies one verdict to **every** packet still held with an id up to
  the given one, including packets deliberately held for reassembly: use it only when nothing
  is held.
* Ids are per queue, increasing. A verdict for an unknown id fails with ENOENT; the kernel
  reports it asynchronously (an ``NLMSG_ERROR`` read by ``read()``, counted in ``errors``).
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple

from sandgate.net import iphead
from sandgate.net.netlink import (
    NFGENMSG,
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_REQUEST,
    NLMSG_ERROR,
    NetfilterSocket,
    NetlinkError,
    NetlinkParseError,
    nl_attrs,
    nl_messages,
    pack_attr,
    pack_nfmsg,
    run_in_netns,
)

__all__ = [
    "NF_ACCEPT",
    "NF_DROP",
    "NF_REPEAT",
    "NfqueueSocket",
    "QueuedPacket",
    "config_attrs",
    "flags_attrs",
    "pack_verdict",
    "pack_verdict_batch",
    "parse_nfqueue",
]

# linux/netfilter/nfnetlink.h, nfnetlink_queue.h, nfnetlink_conntrack.h, netfilter.h
NFNL_SUBSYS_QUEUE = 3
_MSG_PACKET = NFNL_SUBSYS_QUEUE << 8 | 0
_MSG_VERDICT = NFNL_SUBSYS_QUEUE << 8 | 1
_MSG_CONFIG = NFNL_SUBSYS_QUEUE << 8 | 2
_MSG_VERDICT_BATCH = NFNL_SUBSYS_QUEUE << 8 | 3

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_MARK = 3
NFQA_TIMESTAMP = 4
NFQA_IFINDEX_INDEV = 5
NFQA_IFINDEX_OUTDEV = 6
NFQA_PAYLOAD = 10
NFQA_CT = 11
NFQA_CT_INFO = 12
NFQA_CAP_LEN = 13
NFQA_SKB_INFO = 14
NFQA_UID = 16
NFQA_GID = 17

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_PACKET = 2
NFQA_CFG_F_FAIL_OPEN = 0x1
NFQA_CFG_F_CONNTRACK = 0x2
NFQA_CFG_F_GSO = 0x4
NFQA_CFG_F_UID_GID = 0x8

CTA_STATUS = 3
CTA_MARK = 8
CTA_ID = 12
CTA_MARK_MASK = 21

NF_DROP = 0
NF_ACCEPT = 1
NF_REPEAT = 4

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
IPPROTO_TCP = 6
IPPROTO_UDP = 17

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_PKT_HDR = struct.Struct("!IHB")  # packet_id, hw_protocol, hook (packed: 7 bytes)
_VERDICT_HDR = struct.Struct("!II")  # verdict, id
_CFG_CMD = struct.Struct("!BxH")  # command, pad, pf
_CFG_PARAMS = struct.Struct("!IB")  # copy_range, copy_mode (packed: 5 bytes)
_TSTAMP = struct.Struct("!QQ")  # sec, usec
_TCP = struct.Struct("!HHIIBB")  # sport, dport, seq, ack, data offset byte, flags

MAX_COPY_RANGE = 0xFFFF


@dataclass(frozen=True, slots=True)
class QueuedPacket:
    """One held packet. ``None``: the kernel did not send the field, or it was not copied.

    ``mark`` is ``skb->mark`` (the kernel omits zero). ``ct_*`` come only with ``conntrack=True``
    on a kernel that supports it. ``uid``/``gid`` exist only for local sockets' packets and
    ``uid_gid=True``. ``cap_len`` is the packet's full length when ``payload`` was cut short by
    ``copy_range``. ``data_offset`` is where the TCP/UDP payload starts in ``payload``;
    ``data_len`` is its length per the IP header (``data`` holds what was copied of it).
    """

    queue: int
    id: int
    hook: int
    hw_proto: int
    family: int
    indev: int | None
    outdev: int | None
    mark: int
    ct_mark: int | None
    ct_info: int | None
    ct_id: int | None
    uid: int | None
    gid: int | None
    cap_len: int | None
    skb_info: int
    timestamp: float | None
    payload: bytes
    proto: int | None
    src: str | None
    dst: str | None
    sport: int | None
    dport: int | None
    tcp_seq: int | None
    tcp_ack: int | None
    tcp_flags: int | None
    data_offset: int | None
    data_len: int

    @property
    def data(self) -> bytes:
        """The copied TCP/UDP payload (empty for a pure ACK or an unparsed packet)."""
        if self.data_offset is None:
            return b""
        return self.payload[self.data_offset : self.data_offset + self.data_len]

    @property
    def flow(self) -> tuple[str | None, int | None, str | None, int | None]:
        """``(src, sport, dst, dport)``: the key a reader holds segments under."""
        return (self.src, self.sport, self.dst, self.dport)


class _Heads(NamedTuple):
    proto: int | None = None
    src: str | None = None
    dst: str | None = None
    sport: int | None = None
    dport: int | None = None
    seq: int | None = None
    ack: int | None = None
    flags: int | None = None
    data_offset: int | None = None
    data_len: int = 0


def parse_nfqueue(buf: bytes) -> list[QueuedPacket]:
    """Every packet message in one datagram (the kernel sends one per datagram), in order.

    Other messages (acks, errors) are skipped. Raises ``NetlinkParseError`` (a ``ValueError``)
    when the framing or a fixed-size attribute is broken; headers cut short by ``copy_range`` are
    not an error, their fields are ``None``.
    """
    return _parse(buf, [])


def _parse(buf: bytes, errors: list[int]) -> list[QueuedPacket]:
    out: list[QueuedPacket] = []
    for mtype, _flags, _seq, start, end in nl_messages(buf):
        if mtype == NLMSG_ERROR and end - start >= 4:
            code = struct.unpack_from("=i", buf, start)[0]
            if code < 0:
                errors.append(-code)
            continue
        if mtype != _MSG_PACKET:
            continue
        if end - start < NFGENMSG.size:
            raise NetlinkParseError("NFQUEUE message shorter than nfgenmsg")
        family, _version, queue = NFGENMSG.unpack_from(buf, start)
        out.append(_packet(family, queue, nl_attrs(buf, start + NFGENMSG.size, end)))
    return out


def _packet(family: int, queue: int, attrs: dict[int, bytes]) -> QueuedPacket:
    hdr = attrs.get(NFQA_PACKET_HDR)
    if hdr is None:
        raise NetlinkParseError("NFQUEUE packet without NFQA_PACKET_HDR (no id to answer)")
    packet_id, hw_proto, hook = _unpack(_PKT_HDR, hdr)
    stamp = attrs.get(NFQA_TIMESTAMP)
    timestamp = None
    if stamp is not None:
        sec, usec = _unpack(_TSTAMP, stamp)
        timestamp = sec + usec / 1e6
    ct_mark = ct_id = None
    ct = attrs.get(NFQA_CT)
    if ct is not None:
        ct_attrs = nl_attrs(ct, 0, len(ct))
        ct_mark = _u32(ct_attrs, CTA_MARK)
        ct_id = _u32(ct_attrs, CTA_ID)
    payload = attrs.get(NFQA_PAYLOAD, b"")
    h = _headers(hw_proto, payload)
    return QueuedPacket(
        queue=queue,
        id=packet_id,
        hook=hook,
        hw_proto=hw_proto,
        family=family,
        indev=_u32(attrs, NFQA_IFINDEX_INDEV),
        outdev=_u32(attrs, NFQA_IFINDEX_OUTDEV),
        mark=_u32(attrs, NFQA_MARK) or 0,
        ct_mark=ct_mark,
        ct_info=_u32(attrs, NFQA_CT_INFO),
        ct_id=ct_id,
        uid=_u32(attrs, NFQA_UID),
        gid=_u32(attrs, NFQA_GID),
        cap_len=_u32(attrs, NFQA_CAP_LEN),
        skb_info=_u32(attrs, NFQA_SKB_INFO) or 0,
        timestamp=timestamp,
        payload=payload,
        proto=h.proto,
        src=h.src,
        dst=h.dst,
        sport=h.sport,
        dport=h.dport,
        tcp_seq=h.seq,
        tcp_ack=h.ack,
        tcp_flags=h.flags,
        data_offset=h.data_offset,
        data_len=h.data_len,
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


def _headers(hw_proto: int, p: bytes) -> _Heads:
    """Trust the link-layer protocol the kernel reports; fall back to the IP version nibble."""
    version = p[0] >> 4 if p else 0
    if hw_proto == ETH_P_IP or (hw_proto != ETH_P_IPV6 and version == 4):
        h = iphead.ipv4(p) if version == 4 else None
    elif hw_proto == ETH_P_IPV6 or version == 6:
        h = iphead.ipv6(p) if version == 6 else None
    else:
        h = None
    if h is None or h.src is None or h.dst is None:
        return _Heads()
    if h.proto is None or h.l4 is None:
        return _Heads(h.proto, h.src, h.dst)
    return _transport(p, h.proto, h.src, h.dst, h.l4, h.end)


def _transport(p: bytes, proto: int, src: str, dst: str, l4: int, end: int) -> _Heads:
    if proto == IPPROTO_TCP and l4 + _TCP.size <= len(p):
        sport, dport, seq, ack, doff, flags = _TCP.unpack_from(p, l4)
        start = l4 + (doff >> 4) * 4
        if doff >> 4 < 5:
            return _Heads(proto, src, dst, sport, dport, seq, ack, flags)
        return _Heads(proto, src, dst, sport, dport, seq, ack, flags, start, max(0, end - start))
    if proto == IPPROTO_UDP and l4 + 8 <= len(p):
        sport, dport = struct.unpack_from("!HH", p, l4)
        start = l4 + 8
        return _Heads(
            proto, src, dst, sport, dport, data_offset=start, data_len=max(0, end - start)
        )
    return _Heads(proto, src, dst)


def pack_verdict(
    queue: int,
    packet_id: int,
    verdict: int,
    *,
    mark: int | None = None,
    ct_mark: int | None = None,
    ct_mark_mask: int | None = None,
    seq: int = 0,
    ack: bool = False,
) -> bytes:
    """One ``NFQNL_MSG_VERDICT``. ``ct_mark_mask``: only those bits of the ct mark change."""
    attrs = [pack_attr(NFQA_VERDICT_HDR, _VERDICT_HDR.pack(verdict, packet_id))]
    if mark is not None:
        attrs.append(pack_attr(NFQA_MARK, _U32.pack(mark)))
    if ct_mark is not None:
        # The kernel computes (old & ~mask) ^ mark, so mask the new value to set, not toggle.
        ct = pack_attr(CTA_MARK, _U32.pack(ct_mark & (ct_mark_mask or 0xFFFFFFFF)))
        if ct_mark_mask is not None:
            ct += pack_attr(CTA_MARK_MASK, _U32.pack(ct_mark_mask))
        attrs.append(pack_attr(NFQA_CT | NLA_F_NESTED, ct))
    flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
    return pack_nfmsg(
        _MSG_VERDICT, flags, seq, family=socket.AF_UNSPEC, res_id=queue, attrs=b"".join(attrs)
    )


def pack_verdict_batch(
    queue: int, max_id: int, verdict: int, *, mark: int | None = None, seq: int = 0
) -> bytes:
    """One ``NFQNL_MSG_VERDICT_BATCH``: ``verdict`` for every held packet with id <= ``max_id``."""
    attrs = pack_attr(NFQA_VERDICT_HDR, _VERDICT_HDR.pack(verdict, max_id))
    if mark is not None:
        attrs += pack_attr(NFQA_MARK, _U32.pack(mark))
    return pack_nfmsg(
        _MSG_VERDICT_BATCH, NLM_F_REQUEST, seq, family=socket.AF_UNSPEC, res_id=queue, attrs=attrs
    )


def config_attrs(*, copy_range: int, maxlen: int) -> bytes:
    """Attributes of the request that binds a queue, copies packets and bounds the held count."""
    return b"".join(
        [
            pack_attr(NFQA_CFG_CMD, _CFG_CMD.pack(NFQNL_CFG_CMD_BIND, socket.AF_UNSPEC)),
            pack_attr(
                NFQA_CFG_PARAMS,
                _CFG_PARAMS.pack(min(copy_range, MAX_COPY_RANGE), NFQNL_COPY_PACKET),
            ),
            pack_attr(NFQA_CFG_QUEUE_MAXLEN, _U32.pack(maxlen)),
        ]
    )


def flags_attrs(flags: int, mask: int) -> bytes:
    """Set the ``NFQA_CFG_F_*`` bits under ``mask`` (the kernel requires both attributes)."""
    return pack_attr(NFQA_CFG_FLAGS, _U32.pack(flags)) + pack_attr(NFQA_CFG_MASK, _U32.pack(mask))


class NfqueueSocket:
    """A netlink socket bound to one NFQUEUE number of the namespace it was created in.

    One listener per queue number and namespace: binding a number another socket holds raises
    ``NetlinkError`` (EPERM). ``copy_range``: bytes copied per packet (0xffff: whole packets, so
    a ClientHello segment is complete). ``maxlen``: packets held at most before the kernel drops
    (or, with ``fail_open``, accepts) new ones. ``conntrack``/``uid_gid``/``gso``: the
    ``NFQA_CFG_F_*`` flags; without ``gso`` the kernel segments GSO packets before queueing.

    Fail closed by default: no ``fail_open``, and see the module docstring for what happens with
    no listener. The socket is non-blocking; with asyncio::

        loop.add_reader(q.fileno(), on_ready)   # on_ready: for p in q.read(): ... q.verdict(...)

    Verdicts are written straight to the kernel, which applies them before ``verdict`` returns;
    a failure (ENOENT: unknown or already answered id) comes back later and is counted in
    ``errors`` (``last_errno`` holds the code) when ``read()`` drains it.
    """

    def __init__(
        self,
        queue_num: int,
        *,
        copy_range: int = 0xFFFF,
        maxlen: int = 4096,
        fail_open: bool = False,
        conntrack: bool = False,
        uid_gid: bool = False,
        gso: bool = False,
        rcvbuf: int = 8 << 20,
    ) -> None:
        if not 0 <= queue_num <= 0xFFFF:
            raise ValueError(f"queue number {queue_num} out of range 0..65535")
        self.queue_num = queue_num
        self.conntrack = conntrack
        self.errors = 0
        self.last_errno = 0
        self.malformed = 0
        self._seq = itertools.count(1)
        self._nl = NetfilterSocket(rcvbuf=rcvbuf)
        flags = (
            (NFQA_CFG_F_FAIL_OPEN if fail_open else 0)
            | (NFQA_CFG_F_CONNTRACK if conntrack else 0)
            | (NFQA_CFG_F_UID_GID if uid_gid else 0)
            | (NFQA_CFG_F_GSO if gso else 0)
        )
        mask = NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_CONNTRACK | NFQA_CFG_F_UID_GID | NFQA_CFG_F_GSO
        try:
            self._request(config_attrs(copy_range=copy_range, maxlen=maxlen))
            try:
                self._request(flags_attrs(flags, mask))
            except NetlinkError as exc:
                if exc.errno == errno.EOPNOTSUPP and conntrack:
                    raise NetlinkError(
                        errno.EOPNOTSUPP,
                        "NFQUEUE conntrack info needs CONFIG_NETFILTER_NETLINK_GLUE_CT; set the "
                        "ct mark with a repeat verdict and CONNMARK --save-mark instead",
                    ) from exc
                raise
        except BaseException:
            self._nl.close()  # closing unbinds: the kernel destroys the half-made instance
            raise

    def _request(self, attrs: bytes) -> None:
        self._nl.request(_MSG_CONFIG, family=socket.AF_UNSPEC, res_id=self.queue_num, attrs=attrs)

    @classmethod
    def in_netns(cls, netns_path: str, queue_num: int, **kw: int | bool) -> NfqueueSocket:
        """Create the socket inside the namespace at ``netns_path`` (e.g. ``/run/netns/NAME``).

        Only a helper thread enters the namespace; the caller's thread stays where it is, and
        the socket answers for that namespace's queue wherever it is used from.
        """
        return run_in_netns(netns_path, lambda: cls(queue_num, **kw))  # type: ignore[arg-type]

    @property
    def overruns(self) -> int:
        """ENOBUFS reports: the receive buffer was full, so the kernel dropped queued packets."""
        return self._nl.overruns

    def fileno(self) -> int:
        return self._nl.fileno()

    def read(self, limit: int = 256) -> list[QueuedPacket]:
        """Packets already queued to this socket, at most ``limit``; never blocks.

        A datagram that does not parse is counted in ``malformed``; its packet, whose id is
        unknown, stays held until the socket closes (the flow stalls: closed, not open).
        """
        packets: list[QueuedPacket] = []
        errs: list[int] = []
        for dgram in self._nl.recv_datagrams(limit):
            try:
                packets.extend(_parse(dgram, errs))
            except NetlinkParseError:
                self.malformed += 1
        if errs:
            self.errors += len(errs)
            self.last_errno = errs[-1]
        return packets

    def verdict(
        self,
        packet_id: int,
        accept: bool,
        mark: int | None = None,
        ct_mark: int | None = None,
        *,
        ct_mark_mask: int | None = None,
        repeat: bool = False,
    ) -> None:
        """Release (``accept``) or drop one held packet.

        ``mark`` replaces the packet mark. ``repeat`` (with ``accept``) re-runs the base chain
        that queued the packet instead of going on to the next one, so rules before the queue
        rule see the new mark. ``ct_mark`` needs ``conntrack=True`` (module docstring).
        """
        if ct_mark is not None and not self.conntrack:
            raise ValueError("ct_mark needs conntrack=True (else the kernel ignores it silently)")
        if repeat and not accept:
            raise ValueError("repeat only makes sense with accept")
        code = (NF_REPEAT if repeat else NF_ACCEPT) if accept else NF_DROP
        self._send(
            pack_verdict(
                self.queue_num,
                packet_id,
                code,
                mark=mark,
                ct_mark=ct_mark,
                ct_mark_mask=ct_mark_mask,
                seq=next(self._seq),
            )
        )

    def verdict_batch(self, max_id: int, accept: bool, mark: int | None = None) -> None:
        """One verdict for every held packet with id <= ``max_id``, held-on-purpose ones too."""
        code = NF_ACCEPT if accept else NF_DROP
        self._send(pack_verdict_batch(self.queue_num, max_id, code, mark=mark, seq=next(self._seq)))

    def _send(self, msg: bytes) -> None:
        # A write on a netlink socket goes to the kernel (pid 0), which handles it synchronously.
        os.write(self._nl.fileno(), msg)

    def close(self) -> None:
        """Unbind; the kernel drops every packet this socket still holds."""
        self._nl.close()

    def __enter__(self) -> NfqueueSocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
