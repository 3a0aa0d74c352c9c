"""The GSO/GRO limits request and reader (bench/gso.py), byte for byte against the uapi layout."""

from __future__ import annotations

import struct

import pytest
from bench import gso

from sandgate.errors import NetError
from sandgate.net.netlink import NLM_F_ACK, NLM_F_REQUEST, NLMSGHDR, pack_attr


def test_the_request_sets_all_four_limits_of_one_link() -> None:
    msg = gso.gso_limits_request(7, 185_000, seq=3)
    length, mtype, flags, seq, pid = NLMSGHDR.unpack_from(msg)
    assert (length, mtype, flags, seq, pid) == (len(msg), 16, NLM_F_REQUEST | NLM_F_ACK, 3, 0)
    family, _type, index, _flags, change = gso.IFINFOMSG.unpack_from(msg, NLMSGHDR.size)
    assert (family, index, change) == (0, 7, 0)
    attrs = msg[NLMSGHDR.size + gso.IFINFOMSG.size :]
    value = struct.pack("=I", 185_000)
    assert attrs == b"".join(pack_attr(a, value) for a in (41, 58, 63, 64))


def _newlink(attrs: bytes) -> bytes:
    body = gso.IFINFOMSG.pack(0, 1, 7, 0, 0) + attrs
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), 16, 0, 1, 0) + body


def test_the_reader_takes_the_limits_and_leaves_the_rest() -> None:
    attrs = pack_attr(3, b"g7\0") + pack_attr(41, struct.pack("=I", 185_000))
    attrs += pack_attr(58, struct.pack("=I", 65_536)) + pack_attr(59, struct.pack("=I", 524_280))
    # A kernel before 6.3 has no IPv4 pair: the reader says so by leaving them out.
    assert gso.read_gso_limits(_newlink(attrs)) == {"gso": 185_000, "gro": 65_536}


def test_an_answer_without_a_link_is_an_error() -> None:
    error = NLMSGHDR.pack(NLMSGHDR.size + 4, 2, 0, 1, 0) + struct.pack("=i", -19)
    with pytest.raises(NetError):
        gso.read_gso_limits(error)
