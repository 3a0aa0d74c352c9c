"""Chunked request bodies on their raw bytes: RFC 9112 7.1's grammar, and the spellings parsers
disagree on refused (PortSwigger's TE.TE and chunk-size vectors; "funky chunks", 2025: bare LF and
lone CR in chunk lines and extensions). Each vector is fed whole, byte by byte, and split in two
at every offset (h11's ``tr()``): the answer must not depend on how the bytes arrived."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandgate.errors import PeerProtocolError
from sandgate.gateway.proxy.chunked import MAX_CHUNK_LINE, ChunkedCheck


def feeds(body: bytes) -> list[list[bytes]]:
    ways = [[body], [body[i : i + 1] for i in range(len(body))]]
    ways += [[body[:cut], body[cut:]] for cut in range(1, len(body))]
    return ways


def run(pieces: list[bytes]) -> tuple[bool, int]:
    """(done, body bytes) after feeding; raises PeerProtocolError when refused."""
    check = ChunkedCheck()
    used = 0
    for piece in pieces:
        used += check.feed(piece)
    return check.done, used


GOOD = [
    # (name, body, data bytes, bytes of the body, i.e. where the next request would start)
    ("one chunk", b"5\r\nhello\r\n0\r\n\r\n", 5),
    ("two chunks", b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", 11),
    ("upper-case hex", b"A\r\n0123456789\r\n0\r\n\r\n", 10),
    ("leading zeros", b"0005\r\nhello\r\n000\r\n\r\n", 5),
    ("empty body", b"0\r\n\r\n", 0),
    ("extension", b"5;name\r\nhello\r\n0;last\r\n\r\n", 5),
    ("extension with value", b'5;a=b;c="d e"\r\nhello\r\n0\r\n\r\n', 5),
    ("trailer", b"5\r\nhello\r\n0\r\nChecksum: abc\r\n\r\n", 5),
    ("data may hold CR LF", b"4\r\n\r\n\r\n\r\n0\r\n\r\n", 4),
    ("16 hex digits", b"0000000000000005\r\nhello\r\n0\r\n\r\n", 5),
]


@pytest.mark.parametrize("name,body,size", GOOD, ids=[g[0] for g in GOOD])
def test_well_formed_bodies_pass_however_they_arrive(name: str, body: bytes, size: int) -> None:
    for pieces in feeds(body):
        assert run(pieces) == (True, len(body))
    check = ChunkedCheck()
    assert check.feed(body + b"GET / HTTP/1.1\r\n") == len(body)  # a pipelined request
    assert check.done and check.body_bytes == size


BAD = [
    # (name, body, what the refusal says)
    ("bare LF after chunk-size", b"5\nhello\r\n0\r\n\r\n", "bare LF"),
    ("bare LF after data", b"5\r\nhello\n0\r\n\r\n", "not followed by CRLF"),
    ("bare LF ends the body", b"5\r\nhello\r\n0\r\n\n", "bare LF"),
    ("bare LF after last-chunk", b"0\n\r\n", "bare LF"),
    ("no CRLF after data", b"5\r\nhelloX\r\n0\r\n\r\n", "not followed by CRLF"),
    ("data longer than size", b"3\r\nhello\r\n0\r\n\r\n", "not followed by CRLF"),
    ("lone CR after data", b"5\r\nhello\r0\r\n\r\n", "not followed by CRLF"),
    ("0x prefix", b"0x5\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("plus sign", b"+5\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("minus sign", b"-5\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("space before ;", b"5 ;x\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("space after size", b"5 \r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("space before size", b" 5\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("tab after size", b"5\t\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("empty size", b"\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("not hex", b"g\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("underscore", b"1_0\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n", "illegal chunk-size"),
    ("17 hex digits", b"1" + b"0" * 16 + b"\r\n", "too long"),
    ("overflow 2^64", b"10000000000000000\r\n", "too long"),
    ("2^62", b"4000000000000000\r\nx", "too large"),
    ("ffffffffffffffff", b"ffffffffffffffff\r\nx", "too large"),
    ("lone CR in extension", b"5;a\rb\r\nhello\r\n0\r\n\r\n", "CR not followed by LF"),
    ("LF in extension", b"5;a\nb\r\nhello\r\n0\r\n\r\n", "bare LF"),
    ("extension without name", b"5;\r\nhello\r\n0\r\n\r\n", "illegal chunk-size"),
    ("extension, unclosed quote", b'5;a="b\r\nhello\r\n0\r\n\r\n', "illegal chunk-size"),
    ("obs-fold in trailer", b"0\r\nA: b\r\n c\r\n\r\n", "obsolete line folding"),
    ("trailer without colon", b"0\r\nnonsense\r\n\r\n", "not 'name: value'"),
    ("space before trailer colon", b"0\r\nA : b\r\n\r\n", "not 'name: value'"),
    ("NUL in trailer", b"0\r\nA: b\x00\r\n\r\n", "NUL"),
    ("Content-Length trailer", b"0\r\nContent-Length: 5\r\n\r\n", "trailer"),
    ("Transfer-Encoding trailer", b"0\r\ntransfer-encoding: chunked\r\n\r\n", "trailer"),
    ("Host trailer", b"0\r\nHost: evil.example\r\n\r\n", "trailer"),
    ("endless chunk line", b"1;" + b"a" * MAX_CHUNK_LINE, "over"),
]


@pytest.mark.parametrize("name,body,says", BAD, ids=[b[0] for b in BAD])
def test_malformed_bodies_are_refused_however_they_arrive(
    name: str, body: bytes, says: str
) -> None:
    for pieces in feeds(body) if len(body) < 200 else [[body]]:
        with pytest.raises(PeerProtocolError) as err:
            run(pieces)
        assert says in err.value.message and err.value.status_hint == 400


def test_refused_at_the_first_byte_that_cannot_be_right() -> None:
    # Not only when the line ends: a client must not be able to hold a bad line open.
    for early in (b"0x", b"+", b"5 ", b"5;a\rb", b"1" * 17, b"5\r\nhelloX"):
        with pytest.raises(PeerProtocolError):
            ChunkedCheck().feed(early)
    for fine in (b"5", b"5\r", b"5;a", b"5\r\nhel", b"0\r\nA: b"):
        ChunkedCheck().feed(fine)


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=8), st.data())
def test_anything_h11_would_frame_passes(chunks: list[bytes], data: st.DataObject) -> None:
    """What a conforming client (h11's writer) sends is never refused, cut anywhere."""
    conn = h11.Connection(h11.CLIENT)
    head = conn.send(
        h11.Request(
            method="POST",
            target="/",
            headers=[("Host", "a"), ("Transfer-Encoding", "chunked")],
        )
    )
    body = b"".join(conn.send(h11.Data(data=c)) or b"" for c in chunks)
    body += conn.send(h11.EndOfMessage()) or b""
    assert head
    cut = data.draw(st.integers(0, len(body)))
    assert run([body[:cut], body[cut:]]) == (True, len(body))
