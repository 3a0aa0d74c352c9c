"""The WebSocket frame codec, fed whole, byte by byte, and broken."""

from __future__ import annotations

import pytest

from sandgate.world.servers.websocket import (
    NEED_MORE,
    Frame,
    FrameError,
    Opcode,
    accept_key,
    encode_frame,
    parse_frame,
)


def test_accept_key_from_rfc6455_example() -> None:
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_rfc6455_masked_hello() -> None:
    # RFC 6455 5.7: a masked "Hello" from a client
    wire = bytes.fromhex("818537fa213d7f9f4d5158")
    assert parse_frame(wire) == (Frame(True, Opcode.TEXT, b"Hello"), len(wire))


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 200_000])
def test_roundtrip_all_length_encodings(size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    wire = encode_frame(Opcode.BINARY, payload, mask=True)
    assert parse_frame(wire + b"extra") == (Frame(True, Opcode.BINARY, payload), len(wire))
    unmasked = encode_frame(Opcode.BINARY, payload)
    assert parse_frame(unmasked, require_mask=False) == (
        Frame(True, Opcode.BINARY, payload),
        len(unmasked),
    )


def test_byte_by_byte_needs_more_until_complete() -> None:
    wire = encode_frame(Opcode.TEXT, b"x" * 300, mask=True)
    for cut in range(len(wire)):
        assert parse_frame(wire[:cut]) is NEED_MORE
    assert isinstance(parse_frame(wire), tuple)


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (encode_frame(Opcode.TEXT, b"hi"), "masked"),  # unmasked client frame
        (bytes([0xC1, 0x80]) + b"\0\0\0\0", "reserved"),  # RSV1 without extension
        (bytes([0x83, 0x80]) + b"\0\0\0\0", "opcode"),
        (encode_frame(Opcode.PING, b"p" * 126, mask=True), "control"),
        (encode_frame(Opcode.PING, b"p", fin=False, mask=True), "control"),
        (bytes([0x82, 0xFF]) + (1 << 40).to_bytes(8, "big") + b"\0" * 4, "limit"),
    ],
)
def test_malformed_frames(wire: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        parse_frame(wire)
