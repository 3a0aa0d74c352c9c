"""A chunked request body, checked on its raw bytes before any of it is forwarded.

h11 parses the body and re-frames it on the way out (the upstream gets h11's own chunk sizes,
never the client's bytes), so nothing malformed can reach a server. But h11 parses lazily, after
the proxy has sent the head and dialled the upstream, and it tolerates some spellings that
parsers disagree on (a chunk-size of 20 hex digits, anything after ``;``, whitespace before the
CRLF). ``ChunkedCheck`` is the stricter second look, as ``httphead.check_head`` is for heads:
fed the same bytes as h11, in the same order and before h11, it refuses (``PeerProtocolError``,
400) a body that is not plainly

    chunked-body = *chunk last-chunk trailer-section CRLF              (RFC 9112 7.1)
    chunk        = chunk-size *( ";" token [ "=" ( token / quoted-string ) ] ) CRLF data CRLF

with these rules stricter than the RFC, each a spelling some parser reads differently:

- chunk-size is 1 to 16 hex digits with a value below 2^62 (no ``0x``, no sign, no overflow);
- no whitespace in a chunk line (the RFC's BWS around ``;`` and ``=`` is refused);
- every line ends in CRLF: a bare LF or a CR not followed by LF is refused, in chunk lines,
  after chunk data and in trailers;
- trailer lines are ``name: value`` with no obsolete folding, no whitespace before the colon,
  no NUL, and no framing or routing fields (Content-Length, Transfer-Encoding, Host);
- a chunk line is at most 4 KiB and the trailer section at most 64 KiB.

Used ahead of forwarding (http1.py reads up to a bound of the body before it dials, so a short
malformed body is refused before the upstream is even connected) and then alongside the stream
for the rest of a long one. Pure: no sockets.
"""

from __future__ import annotations

import enum
import re
from typing import NoReturn

from sandgate.errors import PeerProtocolError

__all__ = ["MAX_CHUNK_LINE", "MAX_TRAILERS", "ChunkedCheck"]

MAX_CHUNK_LINE = 4 * 1024
MAX_TRAILERS = 64 * 1024
_MAX_SIZE = 1 << 62

_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
_EXTENSION = rb";" + _TOKEN + rb"(?:=(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?"
_CHUNK_LINE = re.compile(rb"(?P<size>[0-9A-Fa-f]{1,16})(?:" + _EXTENSION + rb")*")
_HEX_RUN = re.compile(rb"[0-9A-Fa-f]*")
_TRAILER_NAME = re.compile(_TOKEN)
_FORBIDDEN_TRAILERS = frozenset({b"content-length", b"transfer-encoding", b"host"})


class _State(enum.Enum):
    SIZE = "chunk-size line"
    DATA = "chunk data"
    DATA_CRLF = "CRLF after chunk data"
    TRAILER = "trailer section"
    DONE = "done"


def _refuse(message: str) -> NoReturn:
    raise PeerProtocolError(f"malformed chunked body: {message}", 400)


def _show(line: bytes) -> str:
    text = line.decode("latin-1")
    return repr(text if len(text) <= 40 else text[:40] + "…")


class ChunkedCheck:
    """Feed the body's raw bytes as they arrive; ``feed`` raises on the first malformed byte
    it can tell is wrong. ``done`` once the last chunk and trailers ended; bytes fed after
    that (a pipelined request) are not the body's and are ignored."""

    def __init__(self) -> None:
        self._state = _State.SIZE
        self._line = bytearray()
        self._left = 0  # chunk data still to come, or bytes of CRLF still expected
        self._trailer_bytes = 0
        self.body_bytes = 0  # chunk data seen so far

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    def feed(self, data: bytes) -> int:
        """Check ``data``; return how many of its bytes belong to the body (all of them
        until the end is reached)."""
        i, n = 0, len(data)
        while i < n and self._state is not _State.DONE:
            if self._state is _State.DATA:
                take = min(self._left, n - i)
                self._left -= take
                self.body_bytes += take
                i += take
                if self._left == 0:
                    self._state, self._left = _State.DATA_CRLF, 2
                continue
            if self._state is _State.DATA_CRLF:
                want = b"\r\n"[2 - self._left]
                if data[i] != want:
                    _refuse(f"chunk data not followed by CRLF (got {_show(data[i : i + 1])})")
                self._left -= 1
                i += 1
                if self._left == 0:
                    self._state = _State.SIZE
                continue
            # A line: up to LF, which must come right after a CR.
            end = data.find(b"\n", i)
            piece = data[i:] if end == -1 else data[i:end]
            self._line += piece
            limit = MAX_CHUNK_LINE if self._state is _State.SIZE else MAX_TRAILERS
            if len(self._line) + self._trailer_bytes > limit:
                _refuse(f"{self._state.value} over {limit} bytes")
            if end == -1:
                self._early(bytes(self._line))
                return n
            i = end + 1
            line = bytes(self._line)
            self._line.clear()
            if not line.endswith(b"\r"):
                _refuse(f"line ending without CR (bare LF) in the {self._state.value}")
            self._line_done(line[:-1])
        return i

    def _early(self, partial: bytes) -> None:
        """Refuse an incomplete line as soon as it cannot become valid (no waiting for more)."""
        body = partial[:-1] if partial.endswith(b"\r") else partial
        if b"\r" in body:
            _refuse(f"CR not followed by LF in the {self._state.value}")
        if self._state is _State.SIZE:
            digits = _HEX_RUN.match(body)
            assert digits is not None
            if len(digits.group()) > 16:
                _refuse(f"chunk-size {_show(body)} too long (overflow)")
            rest = body[digits.end() :]
            if rest and (not digits.group() or rest[:1] != b";"):
                _refuse(f"illegal chunk-size line {_show(body)}")

    def _line_done(self, line: bytes) -> None:
        if b"\r" in line:
            _refuse(f"CR not followed by LF in the {self._state.value}")
        if self._state is _State.SIZE:
            self._early(line)  # the same message whether the line came whole or in pieces
            match = _CHUNK_LINE.fullmatch(line)
            if match is None:
                _refuse(f"illegal chunk-size line {_show(line)}")
            size = int(match["size"], 16)
            if size >= _MAX_SIZE:
                _refuse(f"chunk-size {_show(match['size'])} too large")
            if size == 0:
                self._state = _State.TRAILER
            else:
                self._state, self._left = _State.DATA, size
            return
        # trailer section
        if not line:
            self._state = _State.DONE
            return
        self._trailer_bytes += len(line) + 2
        if line[:1] in (b" ", b"\t"):
            _refuse(f"obsolete line folding in the trailers ({_show(line)})")
        if b"\x00" in line:
            _refuse("NUL byte in the trailers")
        name, colon, _ = line.partition(b":")
        if not colon or not _TRAILER_NAME.fullmatch(name):
            _refuse(f"trailer line {_show(line)} is not 'name: value'")
        if name.lower() in _FORBIDDEN_TRAILERS:
            _refuse(f"{name.decode('latin-1')} may not be sent as a trailer")
