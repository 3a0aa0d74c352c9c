"""Named counters read by name over netlink (net/nft.py ``CounterReader``): the requests'
bytes, and the kernel's answers parsed back (issue 13: remove_guest reads a guest's counters
this way instead of a libnftables listing). The kernel side is tests/kernel/test_counters.py."""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.net.netlink import NLMSG_ERROR, NetlinkParseError, nl_attrs, nl_messages, pack_attr
from sandgate.net.netlink import pack_nfmsg as nfmsg
from sandgate.net.nft import CounterReply, pack_counter_gets, parse_counter_replies

GETOBJ, NEWOBJ = (10 << 8) | 19, (10 << 8) | 18  # NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_*
INET, NETDEV = 1, 5


def _newobj(seq: int, family: int, name: str, packets: int, nbytes: int) -> bytes:
    """A NFT_MSG_NEWOBJ as the kernel sends it (nf_tables_fill_obj_info): table, name, type,
    then the counter's data nested (bytes, packets: big-endian 64-bit), use and handle."""
    data = pack_attr(1, struct.pack(">Q", nbytes)) + pack_attr(2, struct.pack(">Q", packets))
    attrs = (
        pack_attr(1, b"sandgate\0")  # NFTA_OBJ_TABLE
        + pack_attr(2, name.encode() + b"\0")  # NFTA_OBJ_NAME
        + pack_attr(3, struct.pack(">I", 1))  # NFTA_OBJ_TYPE: NFT_OBJECT_COUNTER
        + pack_attr(4 | 0x8000, data)  # NFTA_OBJ_DATA, nested
        + pack_attr(5, struct.pack(">I", 1))  # NFTA_OBJ_USE
        + pack_attr(6, struct.pack(">Q", 42))  # NFTA_OBJ_HANDLE
    )
    return nfmsg(NEWOBJ, 0, seq, family=family, res_id=0, attrs=attrs)


def _error(seq: int, code: int) -> bytes:
    # NLMSG_ERROR: the error code, then the request's header (capped ack: no payload)
    body = struct.pack("=i", code) + struct.pack("=IHHII", 16, GETOBJ, 1, seq, 0)
    return struct.pack("=IHHII", 16 + len(body), NLMSG_ERROR, 0, seq, 0) + body


def test_one_request_per_name_with_its_family_and_sequence() -> None:
    buf = pack_counter_gets("sandgate", [("inet", "c_fwd_g0_1"), ("netdev", "c_ing_g0_0")], 7)
    got = []
    for mtype, flags, seq, start, end in nl_messages(buf):
        family = buf[start]
        attrs = nl_attrs(buf, start + 4, end)
        got.append((mtype, flags, seq, family, attrs[1], attrs[2], attrs[3]))
    assert got == [
        (GETOBJ, 1, 7, INET, b"sandgate\0", b"c_fwd_g0_1\0", b"\0\0\0\1"),
        (GETOBJ, 1, 8, NETDEV, b"sandgate\0", b"c_ing_g0_0\0", b"\0\0\0\1"),
    ]


def test_answers_and_errors_in_one_datagram() -> None:
    dgram = (
        _newobj(3, INET, "c_gw_0", 300, 12_000)
        + _error(4, -errno.ENOENT)
        + _newobj(5, NETDEV, "c_ing_g1_0", 2**40 + 1, 7)
    )
    assert parse_counter_replies(dgram) == [
        CounterReply(3, "inet", "c_gw_0", 300, 12_000),
        CounterReply(4, error=-errno.ENOENT),
        CounterReply(5, "netdev", "c_ing_g1_0", 2**40 + 1, 7),
    ]


def test_a_message_of_another_kind_is_not_an_answer() -> None:
    other = nfmsg((10 << 8) | 15, 0, 9, family=0, res_id=0)  # NFT_MSG_NEWGEN
    assert parse_counter_replies(other + _newobj(10, INET, "c", 1, 1)) == [
        CounterReply(10, "inet", "c", 1, 1)
    ]


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(1, 2**31 - 1))
def test_any_count_reads_back(packets: int, nbytes: int, seq: int) -> None:
    (reply,) = parse_counter_replies(_newobj(seq, INET, "c_x", packets, nbytes))
    assert (reply.seq, reply.packets, reply.bytes) == (seq, packets, nbytes)


@given(st.integers(1, 200))
def test_a_cut_datagram_is_malformed_never_a_wrong_count(cut: int) -> None:
    whole = _newobj(1, INET, "c_fwd_g3_2", 5, 5)
    part = whole[: len(whole) - cut] if cut < len(whole) else whole[:1]
    with pytest.raises(NetlinkParseError):
        parse_counter_replies(part)


def test_a_short_error_is_malformed() -> None:
    with pytest.raises(NetlinkParseError):
        parse_counter_replies(struct.pack("=IHHII", 18, NLMSG_ERROR, 0, 1, 0) + b"\0\0")
