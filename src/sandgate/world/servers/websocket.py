"""A minimal RFC 6455 WebSocket: pure frame codec plus the web server's echo session.

`parse_frame(buf)` returns `(Frame, consumed)`, `NEED_MORE`, or raises `FrameError`;
`encode_frame` builds one (masked when the caller is a client, as RFC 6455 requires).
No extensions (permessage-deflate is declined by not answering it).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from sandgate.world.servers.httpio import Request, Response, Upgraded
from sandgate.world.servers.runtime import JsonLog, format_addr

__all__ = [
    "NEED_MORE",
    "Frame",
    "FrameError",
    "Opcode",
    "accept_key",
    "encode_frame",
    "handshake",
    "parse_frame",
]

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_PAYLOAD = 16 * 1024 * 1024


class Opcode(IntEnum):
    CONT = 0x0
    TEXT = 0x1
    BINARY = 0x2
    CLOSE = 0x8
    PING = 0x9
    PONG = 0xA


@dataclass(frozen=True)
class Frame:
    fin: bool
    opcode: int
    payload: bytes


class FrameError(ValueError):
    """A frame no conforming peer sends; the session answers with close code 1002."""


class _NeedMore:
    def __repr__(self) -> str:
        return "NEED_MORE"


NEED_MORE: Final = _NeedMore()


def accept_key(key: str) -> str:
    digest = hashlib.sha1((key + _GUID).encode("ascii")).digest()  # RFC 6455 fixes SHA-1
    return base64.b64encode(digest).decode("ascii")


def _mask(payload: bytes, key: bytes) -> bytes:
    # XOR with the repeated 4-byte key, done on one big integer instead of per byte
    if not payload:
        return payload
    repeated = (key * (len(payload) // 4 + 1))[: len(payload)]
    n = int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")
    return n.to_bytes(len(payload), "big")


def parse_frame(buf: bytes, *, require_mask: bool = True) -> tuple[Frame, int] | _NeedMore:
    if len(buf) < 2:
        return NEED_MORE
    b0, b1 = buf[0], buf[1]
    if b0 & 0x70:
        raise FrameError("reserved bits set without a negotiated extension")
    opcode, fin, masked, length = b0 & 0x0F, bool(b0 & 0x80), bool(b1 & 0x80), b1 & 0x7F
    if opcode not in Opcode.__members__.values():
        raise FrameError(f"unknown opcode {opcode:#x}")
    if masked != require_mask:
        raise FrameError("client frames must be masked" if require_mask else "unexpected mask")
    pos = 2
    if length == 126:
        if len(buf) < 4:
            return NEED_MORE
        (length,) = struct.unpack_from("!H", buf, 2)
        pos = 4
    elif length == 127:
        if len(buf) < 10:
            return NEED_MORE
        (length,) = struct.unpack_from("!Q", buf, 2)
        pos = 10
    if opcode >= Opcode.CLOSE and (length > 125 or not fin):
        raise FrameError("control frames are short and unfragmented")
    if length > MAX_PAYLOAD:
        raise FrameError(f"frame of {length} bytes is over the limit")
    key = b""
    if masked:
        if len(buf) < pos + 4:
            return NEED_MORE
        key, pos = buf[pos : pos + 4], pos + 4
    if len(buf) < pos + length:
        return NEED_MORE
    payload = buf[pos : pos + length]
    return Frame(fin, opcode, _mask(payload, key) if masked else payload), pos + length


def encode_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = False) -> bytes:
    head = bytes([(0x80 if fin else 0) | opcode])
    mask_bit = 0x80 if mask else 0
    n = len(payload)
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 1 << 16:
        head += bytes([mask_bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + _mask(payload, key)


def handshake(req: Request, log: JsonLog) -> Response:
    """101 plus an echo session for a valid RFC 6455 upgrade request, else 400 / 426."""
    upgrade = (req.header("upgrade") or "").lower()
    connection = {t.strip().lower() for t in (req.header("connection") or "").split(",")}
    key = req.header("sec-websocket-key")
    if req.http_version == "2":
        return Response(400, body=b"WebSocket over HTTP/2 is not supported here\n")
    if req.method != "GET" or upgrade != "websocket" or "upgrade" not in connection or not key:
        return Response(426, [("upgrade", "websocket")], b"a WebSocket upgrade is required\n")
    if req.header("sec-websocket-version") != "13":
        return Response(400, [("sec-websocket-version", "13")], b"version 13 only\n")
    headers = [
        ("upgrade", "websocket"),
        ("connection", "Upgrade"),
        ("sec-websocket-accept", accept_key(key)),
    ]
    peer = format_addr(req.conn.peer)

    async def session(conn: Upgraded) -> None:
        await echo_session(conn, log, peer)

    return Response(101, headers, upgrade=session)


async def echo_session(conn: Upgraded, log: JsonLog, peer: str) -> None:
    """Echo each complete message with its opcode; answer pings; close on close."""
    buf, messages = bytearray(conn.buffered), 0
    parts: list[bytes] = []
    first_opcode = Opcode.TEXT
    close_code: int | None = None
    try:
        while True:
            try:
                parsed = parse_frame(bytes(buf))
            except FrameError as exc:
                log.write("ws_error", src=peer, error=str(exc))
                conn.writer.write(encode_frame(Opcode.CLOSE, struct.pack("!H", 1002)))
                break
            if isinstance(parsed, _NeedMore):
                data = await conn.reader.read(256 * 1024)
                if not data:
                    break
                buf += data
                continue
            frame, used = parsed
            del buf[:used]
            if frame.opcode == Opcode.PING:
                conn.writer.write(encode_frame(Opcode.PONG, frame.payload))
            elif frame.opcode == Opcode.CLOSE:
                close_code = struct.unpack("!H", frame.payload[:2])[0] if frame.payload else None
                conn.writer.write(encode_frame(Opcode.CLOSE, frame.payload[:2]))
                break
            elif frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                if frame.opcode != Opcode.CONT:
                    first_opcode, parts = Opcode(frame.opcode), []
                parts.append(frame.payload)
                if frame.fin:
                    conn.writer.write(encode_frame(first_opcode, b"".join(parts)))
                    messages += 1
            await conn.writer.drain()
        await conn.writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        log.write("ws_close", src=peer, messages=messages, close_code=close_code)
