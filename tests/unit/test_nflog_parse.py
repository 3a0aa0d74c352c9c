"""Pure parser tests for NFLOG datagrams, on bytes captured from kernel 6.18.

Every fixture below was read off a real socket (sandgate's own readers, in throwaway namespaces)
and is annotated field by field. Integers in netlink headers are host order (little-endian here);
NFLOG attribute values are network order. Fixtures are fed whole, cut at every
byte, with trailing bytes, and fuzzed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.net.netlink import NetlinkParseError, pack_attr
from sandgate.net.nflog import NflogPacket, SeqTracker, config_attrs, parse_nflog

# --- NFLOG -------------------------------------------------------------------------------------
# One datagram from group 5 (qthresh 64) held these four messages and NLMSG_DONE, in this order:
# uid 65534 in the guest namespace sent a TCP SYN, a UDP datagram, an ICMP echo (all to
# 203.0.113.7, dropped by `log prefix "sg-deny " group 5` in the output chain) and UDP to [::1].

# fmt: off
TCP_SYN = bytes.fromhex(
    # nlmsghdr: len 148, type 0x0400 (subsys ULOG, NFULNL_MSG_PACKET), flags 0, seq 0, pid 0
    "94000000" "0004" "0000" "00000000" "00000000"
    # nfgenmsg: family 2 (NFPROTO_IPV4), version 0, res_id 5 (the group)
    "02" "00" "0005"
    # NFULA_PACKET_HDR: hw_protocol 0x0800, hook 3 (output), pad
    "08000100" "0800" "03" "00"
    # NFULA_PREFIX "sg-deny " NUL, padded to 4
    "0d000a00" "73672d64656e792000" "000000"
    # NFULA_IFINDEX_OUTDEV 2
    "08000500" "00000002"
    # NFULA_UID 65534, NFULA_GID 65534
    "08000b00" "0000fffe"
    "08000e00" "0000fffe"
    # NFULA_SEQ 0 (this group's counter), NFULA_SEQ_GLOBAL 1 (the namespace's counter)
    "08000c00" "00000000"
    "08000d00" "00000001"
    # NFULA_PAYLOAD, 60 bytes:
    "40000900"
    # IPv4: ihl 5, total length 60, id, DF, ttl 64, proto 6, checksum, 10.77.0.2 > 203.0.113.7
    "45" "00" "003c" "a827" "4000" "40" "06" "4c3e" "0a4d0002" "cb007107"
    # TCP: 45812 > 443, seq, ack 0, data offset 10 words, flags 0x02 (SYN), window, csum, urg
    "b2f4" "01bb" "446aa82f" "00000000" "a0" "02" "faf0" "4685" "0000"
    # TCP options: MSS 1460, SACK permitted, timestamps, NOP, window scale 10
    "020405b4" "0402" "080a8b80f1c000000000" "01" "03030a"
)

UDP = bytes.fromhex(
    # nlmsghdr: len 128, type 0x0400, flags 0, seq 0, pid 0
    "80000000" "0004" "0000" "00000000" "00000000"
    # nfgenmsg: IPv4, group 5
    "02000005"
    # NFULA_PACKET_HDR (0x0800, output), NFULA_PREFIX "sg-deny ", NFULA_IFINDEX_OUTDEV 2
    "08000100" "08000300"
    "0d000a00" "73672d64656e792000" "000000"
    "08000500" "00000002"
    # NFULA_UID, NFULA_GID 65534; NFULA_SEQ 1, NFULA_SEQ_GLOBAL 2
    "08000b00" "0000fffe" "08000e00" "0000fffe"
    "08000c00" "00000001" "08000d00" "00000002"
    # NFULA_PAYLOAD, 40 bytes: IPv4 (total 40, proto 17) 10.77.0.2 > 203.0.113.7
    "2c000900"
    "45000028" "21c34000" "4011d2ab" "0a4d0002" "cb007107"
    # UDP 39432 > 53, length 20, checksum; 12 bytes "q"
    "9a08" "0035" "0014" "467c" "717171717171717171717171"
)

ICMP_ECHO = bytes.fromhex(
    # nlmsghdr: len 120, type 0x0400; nfgenmsg: IPv4, group 5
    "78000000" "0004" "0000" "00000000" "00000000"
    "02000005"
    # NFULA_PACKET_HDR, NFULA_PREFIX, NFULA_IFINDEX_OUTDEV, NFULA_UID, NFULA_GID as above
    "08000100" "08000300"
    "0d000a00" "73672d64656e792000" "000000"
    "08000500" "00000002"
    "08000b00" "0000fffe" "08000e00" "0000fffe"
    # NFULA_SEQ 2, NFULA_SEQ_GLOBAL 3
    "08000c00" "00000002" "08000d00" "00000003"
    # NFULA_PAYLOAD, 32 bytes: IPv4 (total 32, proto 1)
    "24000900"
    "45000020" "468a4000" "4001adfc" "0a4d0002" "cb007107"
    # ICMP type 8 (echo request), code 0, checksum, id, sequence 1; "ping"
    "08" "00" "2d67" "ebc6" "0001" "70696e67"
)

UDP6 = bytes.fromhex(
    # nlmsghdr: len 136, type 0x0400; nfgenmsg: family 10 (NFPROTO_IPV6), group 5
    "88000000" "0004" "0000" "00000000" "00000000"
    "0a000005"
    # NFULA_PACKET_HDR: hw_protocol 0x86dd, hook 3
    "08000100" "86dd0300"
    # NFULA_PREFIX "sg-v6 " NUL, pad
    "0b000a00" "73672d76362000" "00"
    # NFULA_IFINDEX_OUTDEV 1 (lo), NFULA_UID, NFULA_GID 65534, NFULA_SEQ 3, NFULA_SEQ_GLOBAL 4
    "08000500" "00000001"
    "08000b00" "0000fffe" "08000e00" "0000fffe"
    "08000c00" "00000003" "08000d00" "00000004"
    # NFULA_PAYLOAD, 51 bytes, then 1 byte of padding:
    "37000900"
    # IPv6: version 6, flow label, payload length 11, next header 17, hop limit 64, ::1 > ::1
    "6001218d" "000b" "11" "40"
    "00000000000000000000000000000001" "00000000000000000000000000000001"
    # UDP 52612 > 5353, length 11, checksum; "six"
    "cd84" "14e9" "000b" "001e" "736978"
    "00"
)

DONE = bytes.fromhex(
    # nlmsghdr: len 20, type 3 (NLMSG_DONE) closing the batch; nfgenmsg: group 5
    "14000000" "0300" "0000" "00000000" "00000000"
    "00000005"
)

BATCH = TCP_SYN + UDP + ICMP_ECHO + UDP6 + DONE

FORWARDED = bytes.fromhex(
    # nlmsghdr: len 180; nfgenmsg: IPv4, group 7 (the gateway's forward chain, "sg-fwd ")
    "b4000000" "0004" "0000" "00000000" "00000000"
    "02000007"
    # NFULA_PACKET_HDR: 0x0800, hook 2 (forward)
    "08000100" "08000200"
    # NFULA_PREFIX "sg-fwd " NUL
    "0c000a00" "73672d6677642000"
    # NFULA_IFINDEX_INDEV 2 (the guest veth), NFULA_IFINDEX_OUTDEV 3
    "08000400" "00000002"
    "08000500" "00000003"
    # NFULA_HWADDR: address length 6, pad, source MAC, pad to 8
    "10000800" "0006" "0000" "2e9ea789d4af" "0000"
    # NFULA_HWTYPE 1 (Ethernet), NFULA_HWLEN 14, NFULA_HWHEADER (dst MAC, src MAC, type), pads
    "06000f00" "0001" "0000"
    "06001100" "000e" "0000"
    "12001000" "52b523c4aa7c" "2e9ea789d4af" "0800" "0000"
    # NFULA_TIMESTAMP: seconds 1795949007, microseconds 596312 (received packets carry one)
    "14000300" "000000006b0c01cf" "0000000000091958"
    # NFULA_SEQ 0, NFULA_SEQ_GLOBAL 1; no uid: a forwarded packet has no local socket
    "08000c00" "00000000" "08000d00" "00000001"
    # NFULA_PAYLOAD, 30 bytes: IPv4, ttl 63 (decremented), proto 17, 10.77.0.2 > 203.0.113.200
    "22000900"
    "4500001e" "cfb94000" "3f1124fe" "0a4d0002" "cb0071c8"
    # UDP 55176 > 9, length 10; "fw"; pad
    "d788" "0009" "000a" "4733" "6677"
    "0000"
)

ARP_OUT = bytes.fromhex(
    # nlmsghdr: len 132; nfgenmsg: family 3 (NFPROTO_ARP), group 6
    "84000000" "0004" "0000" "00000000" "00000000"
    "03000006"
    # NFULA_PACKET_HDR: hw_protocol 0x0806, hook 1 (NF_ARP_OUT)
    "08000100" "08060100"
    # NFULA_PREFIX "sg-arp " NUL, NFULA_IFINDEX_OUTDEV 2
    "0c000a00" "73672d6172702000"
    "08000500" "00000002"
    # NFULA_TIMESTAMP, NFULA_SEQ 0, NFULA_SEQ_GLOBAL 5
    "14000300" "000000006b0c01cf" "0000000000091934"
    "08000c00" "00000000" "08000d00" "00000005"
    # NFULA_PAYLOAD, 42 bytes: on the output hook the frame starts at the Ethernet header
    "2e000900"
    # Ethernet: broadcast < 2e:9e:a7:89:d4:af, type 0x0806
    "ffffffffffff" "2e9ea789d4af" "0806"
    # ARP: htype 1, ptype 0x0800, hlen 6, plen 4, op 1 (request)
    "0001" "0800" "06" "04" "0001"
    # sender 2e:9e:a7:89:d4:af 10.77.0.2, target 00:..:00 10.77.0.1; pad
    "2e9ea789d4af" "0a4d0002" "000000000000" "0a4d0001"
    "0000"
)


def _pkt(**fields: object) -> NflogPacket:
    """An expected packet: the uid-65534 output-hook defaults, overridden by ``fields``."""
    base = NflogPacket(
        group=5, prefix="sg-deny ", hook=3, family=2, indev=None, outdev=2, uid=65534,
        gid=65534, seq=0, seq_global=1, timestamp=None, proto=None, src="10.77.0.2",
        dst="203.0.113.7", sport=None, dport=None, tcp_flags=None, icmp_type=None,
        icmp_code=None, length=0, mark=None,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


EXPECTED_BATCH = [
    _pkt(proto=6, sport=45812, dport=443, tcp_flags=0x02, length=60),
    _pkt(seq=1, seq_global=2, proto=17, sport=39432, dport=53, length=40),
    _pkt(seq=2, seq_global=3, proto=1, icmp_type=8, icmp_code=0, length=32),
    _pkt(
        prefix="sg-v6 ", family=10, outdev=1, seq=3, seq_global=4, proto=17, src="::1",
        dst="::1", sport=52612, dport=5353, length=51,
    ),
]
# fmt: on


def test_tcp_syn_alone() -> None:
    assert parse_nflog(TCP_SYN) == EXPECTED_BATCH[:1]


def test_batch_as_the_kernel_sent_it() -> None:
    assert parse_nflog(BATCH) == EXPECTED_BATCH


def test_forwarded_packet_has_interfaces_and_no_uid() -> None:
    [pkt] = parse_nflog(FORWARDED)
    assert (pkt.group, pkt.prefix, pkt.hook) == (7, "sg-fwd ", 2)
    assert (pkt.indev, pkt.outdev, pkt.uid, pkt.gid) == (2, 3, None, None)
    assert pkt.timestamp == pytest.approx(1795949007.596312)
    assert (pkt.src, pkt.dst, pkt.sport, pkt.dport) == ("10.77.0.2", "203.0.113.200", 55176, 9)
    assert pkt.length == 30


def test_arp_on_output_skips_the_ethernet_header() -> None:
    [pkt] = parse_nflog(ARP_OUT)
    assert (pkt.family, pkt.hook, pkt.proto) == (3, 1, None)
    assert (pkt.src, pkt.dst, pkt.length) == ("10.77.0.2", "10.77.0.1", 28)


# --- Synthetic messages, built from captured parts, for the edges the captures do not cover ----

_NLMSGHDR = struct.Struct("=IHHII")


def _message(payload: bytes, *, family: int = 2, hwproto: int | None = 0x0800) -> bytes:
    """An NFLOG packet message like TCP_SYN's, with another L3 payload."""
    attrs = pack_attr(10, b"t\0")  # NFULA_PREFIX
    if hwproto is not None:
        attrs += pack_attr(1, struct.pack("!HBx", hwproto, 3))  # NFULA_PACKET_HDR
    attrs += pack_attr(9, payload)  # NFULA_PAYLOAD
    body = struct.pack("!BBH", family, 0, 5) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), 0x0400, 0, 0, 0) + body


TCP_SYN_PAYLOAD = TCP_SYN[-60:]


@pytest.mark.parametrize(
    ("copied", "expect"),
    [
        (0, (None, None, None, None, 0)),  # copy mode without payload
        (19, (None, None, None, None, 19)),  # short of an IPv4 header: only the length copied
        (20, (6, "203.0.113.7", None, None, 60)),  # IP header only: the length claimed
        (23, (6, "203.0.113.7", None, None, 60)),
        (24, (6, "203.0.113.7", 443, None, 60)),  # ports, no flags byte yet
        (33, (6, "203.0.113.7", 443, None, 60)),
        (34, (6, "203.0.113.7", 443, 0x02, 60)),
    ],
)
def test_short_copy_degrades_to_none(
    copied: int, expect: tuple[int | None, str | None, int | None, int | None, int]
) -> None:
    [pkt] = parse_nflog(_message(TCP_SYN_PAYLOAD[:copied]))
    assert (pkt.proto, pkt.dst, pkt.dport, pkt.tcp_flags, pkt.length) == expect


def test_ipv4_later_fragment_has_no_ports() -> None:
    later = bytearray(TCP_SYN_PAYLOAD)
    later[6:8] = b"\x00\x10"  # fragment offset 16 (x 8 bytes): payload, not a TCP header
    [pkt] = parse_nflog(_message(bytes(later)))
    assert (pkt.proto, pkt.sport, pkt.dport, pkt.tcp_flags) == (6, None, None, None)


_V6_ADDRS = bytes(15) + b"\x01" + bytes.fromhex("20010db8000000000000000000000009")
_TCP_HDR = TCP_SYN_PAYLOAD[20:40]


def _ipv6(next_header: int, rest: bytes) -> bytes:
    return struct.pack("!IHBB", 0x60000000, len(rest), next_header, 64) + _V6_ADDRS + rest


@pytest.mark.parametrize(
    ("payload", "expect"),
    [
        # hop-by-hop options (8 bytes) then TCP
        (_ipv6(0, bytes([6, 0]) + bytes(6) + _TCP_HDR), (6, 45812, 443, 0x02, None)),
        # first fragment (offset 0) then TCP: ports are there
        (_ipv6(44, bytes([6, 0, 0, 1]) + bytes(4) + _TCP_HDR), (6, 45812, 443, 0x02, None)),
        # later fragment: TCP is named but its header is elsewhere
        (_ipv6(44, bytes([6, 0, 0, 0x11]) + bytes(4) + _TCP_HDR), (6, None, None, None, None)),
        # ICMPv6 echo request
        (_ipv6(58, bytes([128, 0, 0, 0])), (58, None, None, None, 128)),
        # extension chain cut off by copy_range: addresses, nothing else
        (_ipv6(0, bytes([6])), (None, None, None, None, None)),
    ],
)
def test_ipv6_walks_extension_headers(
    payload: bytes, expect: tuple[int | None, int | None, int | None, int | None, int | None]
) -> None:
    [pkt] = parse_nflog(_message(payload, family=10, hwproto=0x86DD))
    assert (pkt.src, pkt.dst) == ("::1", "2001:db8::9")
    assert (pkt.proto, pkt.sport, pkt.dport, pkt.tcp_flags, pkt.icmp_type) == expect


def test_arp_on_input_starts_at_the_arp_header() -> None:
    arp = ARP_OUT[-30:-2]  # the 28-byte ARP body, without Ethernet header and padding
    [pkt] = parse_nflog(_message(arp, family=3, hwproto=None))
    assert (pkt.src, pkt.dst, pkt.length) == ("10.77.0.2", "10.77.0.1", 28)


def test_family_decides_when_no_packet_header() -> None:
    [pkt] = parse_nflog(_message(TCP_SYN_PAYLOAD, hwproto=None))
    assert (pkt.hook, pkt.dport) == (None, 443)


def test_attribute_of_wrong_size_is_malformed() -> None:
    bad = TCP_SYN.replace(bytes.fromhex("08000b000000fffe"), bytes.fromhex("06000b00fffe0000"))
    with pytest.raises(NetlinkParseError):
        parse_nflog(bad)


# --- Framing: whole, cut at every byte, trailing bytes (h11's tr()) ---------------------------

BOUNDARIES = {0: 0}
_off = 0
for _i, _msg in enumerate((TCP_SYN, UDP, ICMP_ECHO, UDP6, DONE)):
    _off += len(_msg)
    BOUNDARIES[_off] = min(_i + 1, 4)


@pytest.mark.parametrize("cut", range(len(BATCH)))
def test_every_cut_is_malformed_or_a_prefix(cut: int) -> None:
    if cut in BOUNDARIES:
        assert parse_nflog(BATCH[:cut]) == EXPECTED_BATCH[: BOUNDARIES[cut]]
    else:
        with pytest.raises(NetlinkParseError):
            parse_nflog(BATCH[:cut])


@pytest.mark.parametrize("extra", [b"\0", bytes(15), bytes(16), b"\xff" * 20])
def test_trailing_bytes_are_malformed(extra: bytes) -> None:
    with pytest.raises(NetlinkParseError):
        parse_nflog(BATCH + extra)


def test_other_message_types_are_skipped() -> None:
    ack = _NLMSGHDR.pack(36, 2, 0, 7, 0) + bytes(20)  # NLMSG_ERROR 0: an ack
    assert parse_nflog(ack + TCP_SYN) == EXPECTED_BATCH[:1]


@given(st.binary(max_size=400))
def test_fuzz_nflog_never_raises_anything_else(data: bytes) -> None:
    with contextlib.suppress(NetlinkParseError):
        parse_nflog(data)


@given(st.integers(0, len(BATCH) - 1), st.integers(0, 255))
def test_fuzz_nflog_one_corrupted_byte(pos: int, value: int) -> None:
    data = bytearray(BATCH)
    data[pos] = value
    try:
        packets = parse_nflog(bytes(data))
    except NetlinkParseError:
        return
    assert all(isinstance(p, NflogPacket) for p in packets)


# --- Loss accounting and the config request ---------------------------------------------------


@pytest.mark.parametrize(
    ("start", "seqs", "lost"),
    [
        (0, [0, 1, 2, 3], 0),
        (0, [0, 1, 5, 6], 3),  # a dropped batch of three
        (0, [4, 5], 4),  # a fresh group counts from 0: a lost first batch counts too
        (0, [0, 1, 1, 0], 0),  # repeats and steps back are not losses
        (0xFFFFFFFE, [0xFFFFFFFE, 0xFFFFFFFF, 0, 2], 1),  # u32 wraps: one lost, at 1
    ],
)
def test_seq_tracker(start: int, seqs: list[int], lost: int) -> None:
    tracker = SeqTracker(start)
    assert sum(tracker.observe(seq) for seq in seqs) == lost


def test_config_request_attributes() -> None:
    # fmt: off
    assert config_attrs(qthresh=64, timeout_cs=10, copy_range=128, nlbufsiz=None) == bytes.fromhex(
        # NFULA_CFG_CMD: NFULNL_CFG_CMD_BIND, padded
        "05000100" "01" "000000"
        # NFULA_CFG_MODE: copy_range 128 (be32), NFULNL_COPY_PACKET, pad; padded
        "0a000200" "00000080" "02" "00" "0000"
        # NFULA_CFG_QTHRESH 64, NFULA_CFG_TIMEOUT 10 (hundredths of a second), both be32
        "08000500" "00000040"
        "08000400" "0000000a"
        # NFULA_CFG_FLAGS (be16): NFULNL_CFG_F_SEQ | NFULNL_CFG_F_SEQ_GLOBAL, padded
        "06000600" "0003" "0000"
    )
    # fmt: on
