"""The TLS ClientHello, read before any byte goes upstream: which name, which ALPN, which versions.

``parse_client_hello(buf)`` is ``bytes -> ClientHello | NeedMore`` and raises ``Malformed``;
nothing else ever escapes it, whatever the input. The caller keeps buffering (or peeking) until
it gets a ``ClientHello`` or ``Malformed``, and then forwards the buffer untouched: the gateway
only reads.

What the parser insists on, and why:

- Records: type 22 (handshake) only, version 3.x with x <= 4 (clients write 0x0301 or 0x0303
  here), length 1..2^14 (RFC 8446 5.1). The hello may be split over several records and any
  number of reads; a record of another type before it is complete is refused.
- The first handshake message must be a ClientHello, and it must end exactly at a record's end:
  nothing legitimate follows it before the server answers. All of it, record headers included,
  must fit in ``MAX_HELLO_BYTES`` (64 KiB; real hellos are 0.2-2 KiB, 10 KiB with many PSKs).
- An SSLv2-style hello (high bit set in the first byte) is refused: "SSLv2 not supported".
- Every length must agree with its container, and an extension type may appear once
  (RFC 8446 4.2); two server_name extensions would let the gateway and the server each read
  a different one.
- server_name (RFC 6066 3): entries of unknown type are skipped, as Go's crypto/tls does; more
  than one host_name entry is refused (OpenSSL and Go refuse it too), as is an empty extension
  or list. The name must be ASCII letters, digits, ``.``, ``-``, ``_``, and is then read by
  ``policy.hostparse`` (case folded, one trailing dot dropped, A-labels checked). Anything a
  DNS name cannot contain, such as ``%`` or non-ASCII, is refused rather than normalised: the
  upstream server reads the raw bytes, so the gateway must not read a different name.
- An IP literal as server name is refused (``Malformed``): RFC 6066 forbids it, no mainstream
  client sends it, and a "name" that is an address (including ``2130706433`` and ``0x7f.1``)
  must never reach name-based rules.

ECH (``encrypted_client_hello``, 0xfe0d, and the old ESNI draft 0xffce) only sets ``has_ech``:
the SNI seen is then the outer, public name of the client-facing server, and the real name is
hidden. The gateway dials the outer name's addresses, so ECH reaches only what that server
fronts; but allowing a shared front (a CDN's public name) allows all of it. Chrome sends a
GREASE ECH extension in every hello, indistinguishable by design, so ``has_ech`` alone is no
reason to refuse.

Pure: no sockets. ``Malformed`` is a ``PeerProtocolError`` (and a ``ValueError``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandgate.errors import PeerProtocolError
from sandgate.policy.hostparse import HostParseError, IPHost, parse_host

__all__ = [
    "EXT_ALPN",
    "EXT_ECH",
    "EXT_ESNI_DRAFT",
    "EXT_SERVER_NAME",
    "EXT_SUPPORTED_VERSIONS",
    "MAX_HELLO_BYTES",
    "ClientHello",
    "Malformed",
    "NeedMore",
    "is_grease",
    "looks_like_tls",
    "parse_client_hello",
]

MAX_HELLO_BYTES = 64 * 1024
_RECORD_HEADER = 5
_HANDSHAKE_HEADER = 4
_MAX_RECORD = 2**14
_CONTENT_HANDSHAKE = 22
_CLIENT_HELLO = 1
_HOST_NAME = 0

EXT_SERVER_NAME = 0x0000
EXT_ALPN = 0x0010
EXT_SUPPORTED_VERSIONS = 0x002B
EXT_ECH = 0xFE0D
EXT_ESNI_DRAFT = 0xFFCE

_SNI_BYTES = re.compile(rb"[A-Za-z0-9._-]+")


class Malformed(PeerProtocolError, ValueError):
    """Not TLS, or a ClientHello that is broken or evasive; the connection gets closed."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed TLS ClientHello: {reason}")
        self.reason = reason


@dataclass(frozen=True)
class NeedMore:
    """Incomplete: read more. ``needed`` is a lower bound on the bytes still missing, if known."""

    needed: int | None


@dataclass(frozen=True)
class ClientHello:
    """What the gateway decides on. ``raw_len`` counts the bytes of the records that carried
    the hello; anything after them in the buffer (early data, say) is not part of it.
    GREASE values (RFC 8701) are left out of ``versions`` but kept in the raw lists; an ALPN
    name that is not printable ASCII is given in hex (``0x0a0a``)."""

    sni: str | None
    alpn: tuple[str, ...]
    versions: tuple[int, ...]
    has_ech: bool
    raw_len: int
    legacy_version: int
    cipher_suites: tuple[int, ...]
    extensions: tuple[int, ...]


def is_grease(value: int) -> bool:
    """RFC 8701 reserved values: 0x0a0a, 0x1a1a, ... 0xfafa."""
    return value & 0x0F0F == 0x0A0A and value >> 8 == value & 0xFF


def looks_like_tls(buf: bytes) -> bool | None:
    """Whether ``buf`` starts like a TLS handshake record (type 22, version 3.0-3.4).
    None when fewer than three bytes are there and they do not yet rule it out."""
    if not buf:
        return None
    if buf[0] != _CONTENT_HANDSHAKE:
        return False
    if len(buf) < 2:
        return None
    if buf[1] != 3:
        return False
    if len(buf) < 3:
        return None
    return buf[2] <= 4


def parse_client_hello(buf: bytes) -> ClientHello | NeedMore:
    """Parse the ClientHello at the start of ``buf``; trailing bytes are ignored."""
    joined = _reassemble(bytes(buf))
    if isinstance(joined, NeedMore):
        return joined
    body, raw_len = joined
    return _parse_body(body, raw_len)


# -- record layer ----------------------------------------------------------------------------------


def _check_record_header(header: bytes, first: bool) -> None:
    """Check as much of a record header as has arrived (fail early on garbage)."""
    if first and header and header[0] & 0x80:
        raise Malformed("SSLv2-style hello; SSLv2 not supported")
    if header and header[0] != _CONTENT_HANDSHAKE:
        if first:
            raise Malformed(f"not a TLS handshake record (first byte 0x{header[0]:02x})")
        raise Malformed(f"record of type {header[0]} before the ClientHello was complete")
    if len(header) >= 2 and header[1] != 3:
        raise Malformed(f"record version major {header[1]}, not 3")
    if len(header) >= 3 and header[2] > 4:
        raise Malformed(f"record version 0x03{header[2]:02x} unknown")
    if len(header) >= 5:
        length = int.from_bytes(header[3:5], "big")
        if length == 0:
            raise Malformed("empty handshake record (RFC 8446 5.1 forbids it)")
        if length > _MAX_RECORD:
            raise Malformed(f"record of {length} bytes, over 2^14")


def _check_handshake_header(fragments: bytes, raw_so_far: int) -> int | None:
    """The hello's total length (header included) once its 4-byte header has arrived."""
    if fragments and fragments[0] != _CLIENT_HELLO:
        raise Malformed(f"first handshake message is of type {fragments[0]}, not ClientHello")
    if len(fragments) < _HANDSHAKE_HEADER:
        return None
    total = _HANDSHAKE_HEADER + int.from_bytes(fragments[1:4], "big")
    # Each record header adds 5 bytes on top of the message; count the ones seen so far.
    if total + raw_so_far > MAX_HELLO_BYTES:
        raise Malformed(
            f"ClientHello of {total} bytes and {raw_so_far} bytes of record headers "
            f"exceeds the limit of {MAX_HELLO_BYTES}"
        )
    return total


def _reassemble(buf: bytes) -> tuple[bytes, int] | NeedMore:
    """Join handshake records until the first message is whole: (its body, bytes consumed)."""
    fragments = bytearray()
    pos = 0
    headers_seen = 0
    while True:
        header = buf[pos : pos + _RECORD_HEADER]
        _check_record_header(header, first=pos == 0)
        if len(header) < _RECORD_HEADER:
            total = _check_handshake_header(bytes(fragments), headers_seen)
            missing_hs = (total if total is not None else _HANDSHAKE_HEADER) - len(fragments)
            return NeedMore(_RECORD_HEADER - len(header) + missing_hs)
        headers_seen += _RECORD_HEADER
        end = pos + _RECORD_HEADER + int.from_bytes(header[3:5], "big")
        if end > MAX_HELLO_BYTES:
            raise Malformed(f"ClientHello records exceed the limit of {MAX_HELLO_BYTES} bytes")
        partial = bytes(fragments) + buf[pos + _RECORD_HEADER : end]
        total = _check_handshake_header(partial, headers_seen)
        if end > len(buf):
            needed = end - len(buf)
            after = (total if total is not None else _HANDSHAKE_HEADER) - (
                len(fragments) + end - pos - _RECORD_HEADER
            )
            if after > 0:
                needed += _RECORD_HEADER + after  # at least one more record
            return NeedMore(needed)
        fragments[:] = partial
        pos = end
        if total is not None and len(fragments) >= total:
            if len(fragments) > total:
                raise Malformed("handshake bytes after the ClientHello in its record")
            return bytes(fragments[_HANDSHAKE_HEADER:]), pos


# -- handshake body --------------------------------------------------------------------------------


class _Reader:
    """A cursor over one structure; overruns become ``Malformed`` naming the field."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def take(self, n: int, field: str) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            left = len(self.data) - self.pos
            raise Malformed(f"{self.what}: {field} needs {n} bytes, {left} left")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def uint(self, size: int, field: str) -> int:
        return int.from_bytes(self.take(size, field), "big")

    def vector(self, length_size: int, field: str) -> bytes:
        return self.take(self.uint(length_size, f"length of {field}"), field)

    def end(self, field: str) -> None:
        if not self.done():
            raise Malformed(f"{self.what}: {len(self.data) - self.pos} stray bytes after {field}")


def _parse_body(body: bytes, raw_len: int) -> ClientHello:
    r = _Reader(body, "ClientHello")
    legacy_version = r.uint(2, "legacy_version")
    if legacy_version >> 8 != 3:
        raise Malformed(f"ClientHello version 0x{legacy_version:04x}")
    r.take(32, "random")
    if len(r.vector(1, "legacy_session_id")) > 32:
        raise Malformed("session id longer than 32 bytes")
    suites = r.vector(2, "cipher_suites")
    if not suites or len(suites) % 2:
        raise Malformed(f"cipher_suites of {len(suites)} bytes (must be even, at least 2)")
    if not r.vector(1, "compression_methods"):
        raise Malformed("no compression methods")
    extensions: dict[int, bytes] = {}
    if not r.done():  # pre-TLS 1.2 hellos may end without an extensions block
        block = _Reader(r.vector(2, "extensions"), "extensions")
        r.end("extensions")
        while not block.done():
            ext_type = block.uint(2, "extension type")
            data = block.vector(2, f"extension 0x{ext_type:04x}")
            if ext_type in extensions:
                raise Malformed(f"extension 0x{ext_type:04x} twice (RFC 8446 4.2)")
            extensions[ext_type] = data
    sni = _server_name(extensions[EXT_SERVER_NAME]) if EXT_SERVER_NAME in extensions else None
    alpn = _alpn(extensions[EXT_ALPN]) if EXT_ALPN in extensions else ()
    if EXT_SUPPORTED_VERSIONS in extensions:
        versions = _supported_versions(extensions[EXT_SUPPORTED_VERSIONS])
    else:
        versions = (legacy_version,)
    return ClientHello(
        sni=sni,
        alpn=alpn,
        versions=versions,
        has_ech=EXT_ECH in extensions or EXT_ESNI_DRAFT in extensions,
        raw_len=raw_len,
        legacy_version=legacy_version,
        cipher_suites=tuple(
            int.from_bytes(suites[i : i + 2], "big") for i in range(0, len(suites), 2)
        ),
        extensions=tuple(extensions),
    )


def _server_name(data: bytes) -> str | None:
    if not data:
        raise Malformed("empty server_name extension (only a server sends that)")
    r = _Reader(data, "server_name")
    names = _Reader(r.vector(2, "server_name_list"), "server_name_list")
    r.end("server_name_list")
    if names.done():
        raise Malformed("empty server_name_list")
    host_names: list[bytes] = []
    while not names.done():
        name_type = names.uint(1, "name_type")
        value = names.vector(2, "name")
        if not value:
            raise Malformed("empty server name")
        if name_type == _HOST_NAME:
            host_names.append(value)
    if len(host_names) > 1:
        raise Malformed(f"{len(host_names)} host_name entries in server_name; one is allowed")
    return _host_name(host_names[0]) if host_names else None


def _host_name(value: bytes) -> str:
    shown = value[:80].decode("ascii", "backslashreplace")
    if not _SNI_BYTES.fullmatch(value):
        raise Malformed(f"server name {shown!r} has bytes a DNS name cannot have")
    try:
        host = parse_host(value.decode("ascii"))
    except HostParseError as exc:
        raise Malformed(f"server name {shown!r}: {exc.problem}") from exc
    if isinstance(host, IPHost):
        raise Malformed(f"server name {shown!r} is an IP address (RFC 6066 3 forbids it)")
    return host.name


def _alpn(data: bytes) -> tuple[str, ...]:
    r = _Reader(data, "ALPN")
    names = _Reader(r.vector(2, "protocol_name_list"), "protocol_name_list")
    r.end("protocol_name_list")
    if names.done():
        raise Malformed("empty ALPN list")
    out: list[str] = []
    while not names.done():
        name = names.vector(1, "protocol name")
        if not name:
            raise Malformed("empty ALPN protocol name")
        # Registered names are printable ASCII; anything else (GREASE 0x0a0a too) shows as hex.
        printable = all(0x21 <= b <= 0x7E for b in name)
        out.append(name.decode("ascii") if printable else "0x" + name.hex())
    return tuple(out)


def _supported_versions(data: bytes) -> tuple[int, ...]:
    r = _Reader(data, "supported_versions")
    raw = r.vector(1, "versions")
    r.end("versions")
    if not raw or len(raw) % 2:
        raise Malformed(f"supported_versions of {len(raw)} bytes (must be even, at least 2)")
    versions = [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]
    real = tuple(v for v in versions if not is_grease(v))
    if not real:
        raise Malformed("supported_versions lists only GREASE values")
    return real
