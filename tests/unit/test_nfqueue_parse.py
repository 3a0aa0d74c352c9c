"""Pure tests for NFQUEUE: parsing, verdict bytes, the gate's rules and its hold/release logic.

The three datagrams below were read off a real queue (kernel 6.18, queue 7 bound in a router
namespace by ``NfqueueSocket``, rules from ``iptables.restore_text``) and are annotated field by
field. Netlink headers are host order (little-endian here); NFQUEUE attribute values and the
packet itself are network order. Fixtures are fed whole, cut at every byte, with trailing bytes,
and fuzzed. Synthetic packets (``queued``) drive ``FirstFlights`` like a transcript.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.gateway.proxy.firstflight import FirstFlights, StreamPrefix
from sandgate.net import nfqueue
from sandgate.net.iptables import (
    DECIDED,
    DENIED,
    Action,
    TlsGate,
    removal_text,
    restore_text,
)
from sandgate.net.netlink import NLA_F_NESTED, NetlinkParseError, pack_attr, pack_nfmsg
from sandgate.net.nfqueue import (
    NF_ACCEPT,
    NF_DROP,
    NF_REPEAT,
    QueuedPacket,
    config_attrs,
    flags_attrs,
    pack_verdict,
    pack_verdict_batch,
    parse_nfqueue,
)

# fmt: off
# The first data segment of a flow to 10.88.2.3:443: a ClientHello, copied with copy_range 96.
CLIENT_HELLO = bytes.fromhex(
    # nlmsghdr: len 172, type 0x0300 (subsys QUEUE, NFQNL_MSG_PACKET), flags 0, seq 0, pid 0
    "ac000000" "0003" "0000" "00000000" "00000000"
    # nfgenmsg: family 2 (NFPROTO_IPV4), version 0, res_id 7 (the queue number, big-endian)
    "02" "00" "0007"
    # NFQA_PACKET_HDR (len 11): packet id 1, hw_protocol 0x0800, hook 2 (forward), pad
    "0b000100" "00000001" "0800" "02" "00"
    # NFQA_IFINDEX_INDEV 2 (g1), NFQA_IFINDEX_OUTDEV 3 (sgq-rs)
    "08000500" "00000002"
    "08000600" "00000003"
    # NFQA_HWADDR (not parsed): address length 6, pad, the client's MAC, pad
    "10000900" "0006" "0000" "d60e87fceca5" "0000"
    # NFQA_CAP_LEN 569: the whole packet; the payload below is its first 96 bytes
    "08000d00" "00000239"
    # NFQA_PAYLOAD (len 100):
    "64000a00"
    # IPv4: ihl 5, total 569, id, DF, ttl 63 (forwarded), TCP, checksum, 10.88.1.2 > 10.88.2.3
    "45" "00" "0239" "fc12" "4000" "3f" "06" "25f8" "0a580102" "0a580203"
    # TCP: 35338 > 443, seq 0xe58f1016, ack, data offset 8 words, flags 0x18 (PSH|ACK), window,
    # checksum, urgent; options NOP NOP timestamps
    "8a0a" "01bb" "e58f1016" "00a5aed6" "80" "18" "003f" "5778" "0000"
    "0101080a" "15075efb" "b77c9352"
    # TLS record: handshake, version 3.1, length 512; ClientHello (1), length 508, version 3.3,
    # the first 38 bytes of the random and session id: the copy ends here
    "16" "0301" "0200" "01" "0001fc" "0303"
    "8cc5d0cf9f06178dd836338c4cc8e380913a2fcd602d5b56bfa0b4ef1e6148ef" "20"
)

# The same flow's next data segment, one byte "p", copied whole. The kernel's nlmsg_len (121) is
# not padded to 4; the attribute length (57) is not either.
PING = bytes.fromhex(
    # nlmsghdr: len 121, type 0x0300, flags 0, seq 0, pid 0; nfgenmsg: IPv4, queue 7
    "79000000" "0003" "0000" "00000000" "00000000" "02000007"
    # NFQA_PACKET_HDR: packet id 2, IPv4, forward hook; INDEV 2, OUTDEV 3; HWADDR
    "0b000100" "00000002" "0800" "02" "00"
    "08000500" "00000002"
    "08000600" "00000003"
    "10000900" "0006" "0000" "d60e87fceca5" "0000"
    # NFQA_PAYLOAD (len 57): IPv4 total 53, TCP seq 0xe58f121b (= 0xe58f1016 + 517), PSH|ACK,
    # timestamps, payload "p"
    "39000a00"
    "45" "00" "0035" "fc14" "4000" "3f" "06" "27fa" "0a580102" "0a580203"
    "8a0a" "01bb" "e58f121b" "00a5aed7" "80" "18" "003f" "fd00" "0000"
    "0101080a" "15075efb" "b77c9353"
    "70"
)

# The kernel's answer to a verdict for an id nobody holds (no NLM_F_ACK asked: errors come anyway).
ENOENT_REPLY = bytes.fromhex(
    # nlmsghdr: len 52, type 2 (NLMSG_ERROR), flags 0, seq 3, pid 11444 (our socket's port id)
    "34000000" "0200" "0000" "03000000" "b42c0000"
    # error -2 (ENOENT), then the request echoed: len 32, type 0x0301 (VERDICT), NLM_F_REQUEST,
    # seq 3, pid 0; nfgenmsg AF_UNSPEC, queue 7; NFQA_VERDICT_HDR: NF_ACCEPT for id 999999
    "feffffff"
    "20000000" "0103" "0100" "03000000" "00000000"
    "00000007"
    "0c000200" "00000001" "000f423f"
)
# fmt: on


def test_client_hello_segment() -> None:
    [p] = parse_nfqueue(CLIENT_HELLO)
    assert (p.queue, p.id, p.hook, p.hw_proto, p.family) == (7, 1, 2, 0x0800, 2)
    assert (p.indev, p.outdev, p.mark, p.cap_len) == (2, 3, 0, 569)
    assert (p.ct_mark, p.ct_info, p.uid, p.gid) == (None, None, None, None)
    assert (p.proto, p.src, p.dst, p.sport, p.dport) == (6, "10.88.1.2", "10.88.2.3", 35338, 443)
    assert (p.tcp_seq, p.tcp_flags) == (0xE58F1016, 0x18)
    assert (p.data_offset, p.data_len) == (52, 517)  # 20 IP + 32 TCP; 569 - 52
    assert len(p.payload) == 96 and p.data == p.payload[52:]  # only what was copied
    assert p.data[:6] == bytes.fromhex("160301020001")
    assert p.flow == ("10.88.1.2", 35338, "10.88.2.3", 443)


def test_ping_segment() -> None:
    [p] = parse_nfqueue(PING)
    assert (p.id, p.tcp_seq, p.data, p.data_len, p.cap_len) == (2, 0xE58F121B, b"p", 1, None)


def test_error_reply_is_no_packet_but_counted() -> None:
    assert parse_nfqueue(ENOENT_REPLY) == []
    errors: list[int] = []
    assert nfqueue._parse(ENOENT_REPLY, errors) == []
    assert errors == [2]


def test_several_messages_in_one_datagram() -> None:
    pad = b"\0" * (-len(PING) % 4)
    got = parse_nfqueue(PING + pad + CLIENT_HELLO)
    assert [p.id for p in got] == [2, 1]


@pytest.mark.parametrize("fixture", [CLIENT_HELLO, PING, ENOENT_REPLY])
def test_every_cut_parses_or_raises_parse_error(fixture: bytes) -> None:
    for n in range(len(fixture)):
        with contextlib.suppress(NetlinkParseError):
            parse_nfqueue(fixture[:n])
    with pytest.raises(NetlinkParseError):
        parse_nfqueue(fixture + b"\x01" * 4)  # past the 4-byte padding of PING's last message


@given(st.binary(max_size=300))
def test_fuzz_only_parse_errors(data: bytes) -> None:
    with contextlib.suppress(NetlinkParseError):
        parse_nfqueue(data)


@given(st.binary(max_size=120))
def test_fuzz_payload_never_breaks_parsing(payload: bytes) -> None:
    msg = pack_nfmsg(
        0x0300, 0, 0, family=2, res_id=7,
        attrs=pack_attr(1, struct.pack("!IHB", 9, 0x0800, 2)) + pack_attr(10, payload),
    )  # fmt: skip
    [p] = parse_nfqueue(msg)
    assert p.id == 9 and len(p.data) <= len(payload)


def test_packet_without_header_is_malformed() -> None:
    msg = pack_nfmsg(0x0300, 0, 0, family=2, res_id=7, attrs=pack_attr(10, b"E"))
    with pytest.raises(NetlinkParseError, match="PACKET_HDR"):
        parse_nfqueue(msg)


# --- synthetic packets ------------------------------------------------------------------------


def ipv4_tcp(seq: int, data: bytes = b"", *, sport: int = 40000, flags: int = 0x18) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", sport, 443, seq, 1, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 40 + len(data), 0, 0x4000, 63, 6, 0,
        socket.inet_aton("10.88.1.2"), socket.inet_aton("10.88.2.3"),
    )  # fmt: skip
    return ip + tcp + data


def datagram(payload: bytes, *, pid: int = 1, hw: int = 0x0800, extra: bytes = b"") -> bytes:
    attrs = pack_attr(1, struct.pack("!IHB", pid, hw, 2)) + extra + pack_attr(10, payload)
    return pack_nfmsg(0x0300, 0, 0, family=2, res_id=7, attrs=attrs)


def queued(seq: int, data: bytes = b"", *, pid: int = 1, sport: int = 40000) -> QueuedPacket:
    [p] = parse_nfqueue(datagram(ipv4_tcp(seq, data, sport=sport), pid=pid))
    return p


def test_marks_conntrack_and_credentials() -> None:
    ct = pack_attr(8, struct.pack("!I", 0xC0000000)) + pack_attr(12, struct.pack("!I", 77))
    extra = b"".join(
        [
            pack_attr(3, struct.pack("!I", 0x40000001)),  # NFQA_MARK
            pack_attr(11 | NLA_F_NESTED, ct),  # NFQA_CT: CTA_MARK, CTA_ID
            pack_attr(12, struct.pack("!I", 0)),  # NFQA_CT_INFO: IP_CT_ESTABLISHED
            pack_attr(16, struct.pack("!I", 1000)),  # NFQA_UID
            pack_attr(17, struct.pack("!I", 1001)),  # NFQA_GID
            pack_attr(14, struct.pack("!I", 2)),  # NFQA_SKB_INFO: GSO
            pack_attr(4, struct.pack("!QQ", 1700000000, 250000)),  # NFQA_TIMESTAMP
        ]
    )
    [p] = parse_nfqueue(datagram(ipv4_tcp(5, b"x"), extra=extra))
    assert (p.mark, p.ct_mark, p.ct_id, p.ct_info) == (0x40000001, 0xC0000000, 77, 0)
    assert (p.uid, p.gid, p.skb_info, p.timestamp) == (1000, 1001, 2, 1700000000.25)


def test_ipv6_after_an_extension_header() -> None:
    tcp = struct.pack("!HHIIBBHHH", 5555, 443, 42, 0, 6 << 4, 0x18, 1, 0, 0) + bytes(4) + b"hi"
    hop = bytes([6, 0]) + bytes(6)  # hop-by-hop: next header TCP, 8 bytes
    ip6 = struct.pack("!IHBB", 6 << 28, len(hop) + len(tcp), 0, 64)
    ip6 += socket.inet_pton(socket.AF_INET6, "fd00::1") + socket.inet_pton(
        socket.AF_INET6, "fd00::2"
    )
    [p] = parse_nfqueue(datagram(ip6 + hop + tcp, hw=0x86DD))
    assert (p.src, p.dst, p.proto, p.sport, p.dport, p.tcp_seq) == (
        "fd00::1",
        "fd00::2",
        6,
        5555,
        443,
        42,
    )
    assert p.data == b"hi" and p.data_offset == 40 + 8 + 24


def test_udp_and_later_fragments() -> None:
    udp = struct.pack("!HHHH", 53, 5353, 12, 0) + b"abcd"
    ip = bytearray(ipv4_tcp(0)[:20])
    ip[9], ip[2:4] = 17, struct.pack("!H", 20 + len(udp))
    [p] = parse_nfqueue(datagram(bytes(ip) + udp))
    assert (p.proto, p.sport, p.dport, p.data, p.tcp_seq) == (17, 53, 5353, b"abcd", None)
    ip[6:8] = struct.pack("!H", 0x2001)  # fragment offset 8: no transport header in it
    [p] = parse_nfqueue(datagram(bytes(ip) + udp))
    assert (p.proto, p.sport, p.data) == (17, None, b"")


# --- what we send -----------------------------------------------------------------------------


def test_verdict_bytes() -> None:
    # fmt: off
    assert pack_verdict(7, 999999, NF_ACCEPT, seq=3) == bytes.fromhex(
        # nlmsghdr: len 32, type 0x0301 (VERDICT), NLM_F_REQUEST, seq 3, pid 0
        "20000000" "0103" "0100" "03000000" "00000000"
        # nfgenmsg: AF_UNSPEC, version 0, queue 7; NFQA_VERDICT_HDR: NF_ACCEPT, id 999999
        "00000007" "0c000200" "00000001" "000f423f"
    )  # the request the kernel echoed in ENOENT_REPLY, byte for byte
    # fmt: on
    msg = pack_verdict(7, 5, NF_REPEAT, mark=DECIDED, seq=1)
    assert msg[24:32] == struct.pack("!II", NF_REPEAT, 5)
    assert msg[32:] == bytes.fromhex("08000300 40000000")  # NFQA_MARK


def test_verdict_ct_mark_is_masked() -> None:
    msg = pack_verdict(7, 5, NF_ACCEPT, ct_mark=0xFFFFFFFF, ct_mark_mask=DECIDED)
    # NFQA_CT (len 20, NLA_F_NESTED) holding CTA_MARK = value & mask (the kernel XORs with the
    # old mark's other bits) and CTA_MARK_MASK.
    assert msg[-20:] == bytes.fromhex("14000b80 08000800 40000000 08001500 40000000")


def test_batch_verdict_bytes() -> None:
    msg = pack_verdict_batch(7, 12, NF_DROP, seq=9)
    assert msg[4:6] == b"\x03\x03"  # type 0x0303: NFQNL_MSG_VERDICT_BATCH
    # nfgenmsg: AF_UNSPEC, queue 7; NFQA_VERDICT_HDR: NF_DROP for every id up to 12
    assert msg[16:] == bytes.fromhex("00000007 0c000200 00000000 0000000c")


def test_config_bytes() -> None:
    # fmt: off
    assert config_attrs(copy_range=1 << 20, maxlen=4096) == bytes.fromhex(
        # NFQA_CFG_CMD: BIND, pad, pf 0
        "08000100" "01" "00" "0000"
        # NFQA_CFG_PARAMS (len 9): copy_range clamped to 0xffff, NFQNL_COPY_PACKET, pad
        "09000200" "0000ffff" "02" "000000"
        # NFQA_CFG_QUEUE_MAXLEN 4096
        "08000300" "00001000"
    )
    # NFQA_CFG_FLAGS 0 under NFQA_CFG_MASK 0xf: every flag we know, cleared
    assert flags_attrs(0, 0xF) == bytes.fromhex("08000500 00000000 08000400 0000000f")
    # fmt: on


# --- StreamPrefix -----------------------------------------------------------------------------


def test_prefix_in_any_order() -> None:
    for order in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        sp = StreamPrefix(start=100)
        parts = [(100, b"abc"), (103, b"def"), (106, b"gh")]
        for i in order:
            sp.add(*parts[i])
        assert sp.contiguous() == b"abcdefgh" and not (sp.out_of_order or sp.conflict)


def test_prefix_gap_and_wraparound() -> None:
    sp = StreamPrefix()
    sp.add(0xFFFFFFFE, b"ab")
    sp.add(2, b"de")  # seq wrapped: one byte (seq 0..1 -> "c" at 0) still missing
    assert sp.contiguous() == b"ab"
    sp.add(0, b"cc")
    assert sp.contiguous() == b"abccde"[:4] + b"de"


def test_prefix_flags() -> None:
    sp = StreamPrefix()
    sp.add(1000, b"hello")
    sp.add(999, b"x")  # before the assumed start
    assert sp.out_of_order
    sp = StreamPrefix()
    sp.add(1000, b"hello")
    sp.add(1001, b"ell")  # a retransmission that agrees
    agreed = not sp.conflict
    sp.add(1001, b"ELL")
    assert agreed
    assert sp.conflict
    sp = StreamPrefix(limit=4)
    sp.add(0, b"abcdef")
    assert sp.overflow and sp.contiguous() == b"abcd"


# --- FirstFlights, as transcripts -------------------------------------------------------------


def first_bytes_judge(first: object, flight: bytes) -> bool | None:
    """Allows a flight that is b"allow." after whole, denies b"deny..", needs 6 bytes."""
    if len(flight) < 6:
        return None
    return flight[:6] == b"allow."


def acts(pairs: list[tuple[QueuedPacket, Action]]) -> list[tuple[int, Action]]:
    return [(p.id, a) for p, a in pairs]


def test_one_segment_allowed_at_once() -> None:
    ff = FirstFlights(first_bytes_judge)
    assert acts(ff.feed(queued(10, b"allow.rest", pid=1), 0.0)) == [(1, Action.ALLOW)]
    assert ff.holding == 0


def test_split_flight_held_then_released_in_order() -> None:
    ff = FirstFlights(first_bytes_judge)
    assert ff.feed(queued(13, b"ow.", pid=2), 0.0) == []  # arrives first, later in the stream
    assert ff.holding == 1
    # It was taken as the start; the real start then shows up before it: deny, never guess.
    assert acts(ff.feed(queued(10, b"all", pid=1), 0.0)) == [(2, Action.DENY), (1, Action.DENY)]
    ff = FirstFlights(first_bytes_judge)
    assert ff.feed(queued(10, b"all", pid=1), 0.0) == []
    assert acts(ff.feed(queued(13, b"ow.", pid=2), 0.0)) == [(1, Action.ALLOW), (2, Action.ALLOW)]


def test_denials() -> None:
    ff = FirstFlights(first_bytes_judge)
    assert acts(ff.feed(queued(10, b"deny..", pid=1), 0.0)) == [(1, Action.DENY)]

    def broken(first: object, flight: bytes) -> bool | None:
        raise ValueError("bad hello")

    ff = FirstFlights(broken)
    assert acts(ff.feed(queued(10, b"allow.", pid=1), 0.0)) == [(1, Action.DENY)]
    ff = FirstFlights(first_bytes_judge, limit=4)
    assert acts(ff.feed(queued(10, b"allow.", pid=1), 0.0)) == [(1, Action.DENY)]
    ff = FirstFlights(first_bytes_judge, max_flows=1)
    assert ff.feed(queued(10, b"al", pid=1, sport=1), 0.0) == []
    assert acts(ff.feed(queued(10, b"al", pid=2, sport=2), 0.0)) == [(2, Action.DENY)]


def test_expire_denies_stalled_flows() -> None:
    ff = FirstFlights(first_bytes_judge, timeout=5.0)
    assert ff.feed(queued(10, b"al", pid=1), 0.0) == []
    assert ff.expire(4.9) == []
    assert acts(ff.expire(5.0)) == [(1, Action.DENY)]
    assert ff.holding == 0


def test_empty_segment_passes_without_deciding() -> None:
    ff = FirstFlights(first_bytes_judge)
    assert acts(ff.feed(queued(10, pid=1), 0.0)) == [(1, Action.PASS)]
    assert ff.feed(queued(10, b"al", pid=2), 0.0) == []  # the flow is still undecided


def test_retransmission_after_decision_and_reused_tuple() -> None:
    ff = FirstFlights(first_bytes_judge)
    assert acts(ff.feed(queued(10, b"allow.", pid=1), 0.0)) == [(1, Action.ALLOW)]
    # The same bytes again (queued before the ct mark was set): the same verdict, no new flow.
    assert acts(ff.feed(queued(10, b"allow.", pid=2), 0.0)) == [(2, Action.ALLOW)]
    # Same 4-tuple, other sequence numbers: a new connection, judged afresh.
    assert acts(ff.feed(queued(90000, b"deny..", pid=3), 0.0)) == [(3, Action.DENY)]


# --- the gate's rules -------------------------------------------------------------------------


def u32_matches(expr: str, packet: bytes) -> bool:
    """A small evaluator for the u32 subset the rules use: ``offset [>>n] [&mask] = value``."""
    for test in expr.split("&&"):
        location, value = test.split("=")
        head, *ops = re.findall(r"(>>|&|^)(0x[0-9a-fA-F]+|\d+)", location)
        offset = int(head[1], 0)
        if offset + 4 > len(packet):
            return False
        word = int.from_bytes(packet[offset : offset + 4], "big")
        for op, num in ops:
            word = word >> int(num, 0) if op == ">>" else word & int(num, 0)
        if word != int(value, 0):
            return False
    return True


def tcp_segment(data_len: int, options: int) -> bytes:
    doff = 5 + options
    tcp = struct.pack("!HHIIBBHHH", 1, 443, 0, 0, doff << 4, 0x10, 0, 0, 0) + bytes(4 * options)
    ip = struct.pack("!BBHHHBBHII", 0x45, 0, 20 + len(tcp) + data_len, 0, 0, 64, 6, 0, 1, 2)
    return ip + tcp + bytes(data_len)


def test_u32_tests_prove_no_payload_exactly() -> None:
    tests = re.findall(r'--u32 "([^"]+)"', restore_text(TlsGate(7)))
    assert len(tests) == 11
    for options in range(11):
        assert sum(u32_matches(t, tcp_segment(0, options)) for t in tests) == 1
        for data_len in (1, 2, 3, 4, 100):
            assert not any(u32_matches(t, tcp_segment(data_len, options)) for t in tests)
    with_ip_options = bytearray(tcp_segment(0, 0))
    with_ip_options[0] = 0x46
    assert not any(u32_matches(t, bytes(with_ip_options)) for t in tests)  # queued, not skipped


def test_restore_text() -> None:
    text = restore_text(TlsGate(7))
    lines = text.splitlines()
    assert lines[0] == "*mangle" and "*filter" in lines and text.count("COMMIT") == 2
    assert (
        "-A FORWARD -i g+ -p tcp --dport 443 -m connmark ! --mark 0x40000000/0x40000000 -j sg-tls"
    ) in lines
    save = "-j CONNMARK --save-mark --nfmask 0x60000000 --ctmask 0x60000000"
    assert lines.index(next(ln for ln in lines if save in ln)) < lines.index(
        "-A sg-tls -j NFQUEUE --queue-num 7"
    )
    assert "--queue-bypass" not in text
    reject = "-j REJECT --reject-with tcp-reset"
    x = "-m connmark --mark 0x20000000/0x20000000"
    for end in ("dport", "sport"):  # a gated flow's TCP packets: the gate's port at one end
        assert f"-A FORWARD -p tcp --{end} 443 {x} {reject}" in lines
    assert f"-A FORWARD ! -p tcp {x} -j DROP" in lines
    # Only chains with rules are declared: iptables-nft hooks every declared one.
    assert [ln for ln in lines if ln.startswith(":")] == [
        ":FORWARD ACCEPT [0:0]",
        ":sg-tls - [0:0]",
        ":FORWARD ACCEPT [0:0]",
    ]
    assert removal_text() == "*mangle\nCOMMIT\n*filter\nCOMMIT\n"


def test_gate_marks_and_validation() -> None:
    gate = TlsGate(7)
    assert gate.allow_mark(0x80000000 | DENIED) == 0x80000000 | DECIDED
    assert gate.deny_mark(0x1) == 0x1 | DECIDED | DENIED
    p = queued(1, b"x")
    assert gate.verdict_args(p, Action.PASS) == {"accept": True}
    assert gate.verdict_args(p, Action.DENY) == {
        "accept": True, "mark": DECIDED | DENIED, "repeat": True,
    }  # fmt: skip
    for bad in (
        {"queue_num": 70000},
        {"queue_num": 1, "decided": 0x3},
        {"queue_num": 1, "denied": DECIDED},
        {"queue_num": 1, "iface": "g1; -j ACCEPT"},
    ):
        with pytest.raises(ValueError):
            TlsGate(**bad)
