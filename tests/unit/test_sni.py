"""ClientHello parsing: annotated fixtures, real hellos from the stdlib's OpenSSL, every split,
every evasion we know of, and fuzzing. No network: hellos come from ``ssl`` over ``MemoryBIO``."""

from __future__ import annotations

import re
import ssl

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandgate.errors import PeerProtocolError
from sandgate.gateway.proxy.sni import (
    EXT_ALPN,
    EXT_ECH,
    EXT_ESNI_DRAFT,
    EXT_SERVER_NAME,
    EXT_SUPPORTED_VERSIONS,
    MAX_HELLO_BYTES,
    ClientHello,
    Malformed,
    NeedMore,
    is_grease,
    looks_like_tls,
    parse_client_hello,
)


def unhex(text: str) -> bytes:
    """Hex with '#' comments and any whitespace, as in mitmproxy's test_tls.py."""
    return bytes.fromhex(re.sub(r"#[^\n]*", "", text).replace(" ", "").replace("\n", ""))


# A minimal TLS 1.3 ClientHello for example.com, ALPN h2 and http/1.1. 97 bytes.
HELLO_EXAMPLE = unhex(
    """
    # record layer
    16                  # content type: handshake
    03 01               # legacy record version: TLS 1.0, as clients write it
    00 5c               # record length: 92
    # handshake layer
    01                  # handshake type: ClientHello
    00 00 58            # length: 88
    # ClientHello
    03 03               # legacy_version: TLS 1.2
    0000000000000000000000000000000000000000000000000000000000000000  # random
    00                  # legacy_session_id: empty
    00 02 13 01         # cipher_suites: TLS_AES_128_GCM_SHA256
    01 00               # compression_methods: null
    00 2d               # extensions: 45 bytes
    # extension: server_name
    00 00 00 10         # type 0, length 16
    00 0e               # server_name_list: 14 bytes
    00 00 0b            # host_name, 11 bytes
    6578616d706c652e636f6d  # "example.com"
    # extension: application_layer_protocol_negotiation
    00 10 00 0e         # type 16, length 14
    00 0c               # protocol_name_list: 12 bytes
    02 6832             # "h2"
    08 687474702f312e31 # "http/1.1"
    # extension: supported_versions
    00 2b 00 03         # type 43, length 3
    02 03 04            # 2 bytes: TLS 1.3
    """
)

# The same handshake message split over two records: 20 bytes, then 72.
HELLO_EXAMPLE_TWO_RECORDS = unhex(
    """
    16 03 01 00 14      # record 1: handshake, 20 bytes
    01 00 00 58         #   ClientHello, 88 bytes
    03 03 0000000000000000000000000000  # version, first 14 bytes of random
    16 03 03 00 48      # record 2: handshake, 72 bytes, record version TLS 1.2 this time
    000000000000000000000000000000000000  # the rest of random (18 bytes)
    00 00 02 13 01 01 00 00 2d
    00 00 00 10 00 0e 00 00 0b 6578616d706c652e636f6d
    00 10 00 0e 00 0c 02 6832 08 687474702f312e31
    00 2b 00 03 02 03 04
    """
)

# An SSLv2-compatible ClientHello (2-byte header with the high bit set, type 1, version 3.1).
HELLO_SSLV2 = unhex(
    """
    80 2e               # SSLv2 record header: length 46, high bit set
    01                  # msg type: CLIENT-HELLO
    03 01               # version: TLS 1.0
    00 15 00 00 00 10   # cipher specs 21 bytes, session id 0, challenge 16
    """
) + bytes(21 + 16)


# -- building hellos -------------------------------------------------------------------------------


def u16(n: int) -> bytes:
    return n.to_bytes(2, "big")


def ext(ext_type: int, data: bytes) -> bytes:
    return u16(ext_type) + u16(len(data)) + data


def sni_ext(*entries: tuple[int, bytes]) -> bytes:
    names = b"".join(bytes([t]) + u16(len(v)) + v for t, v in entries)
    return ext(EXT_SERVER_NAME, u16(len(names)) + names)


def sni_host(name: bytes) -> bytes:
    return sni_ext((0, name))


def handshake(
    *extensions: bytes,
    version: int = 0x0303,
    session_id: bytes = b"",
    suites: bytes = b"\x13\x01",
    compression: bytes = b"\x00",
    with_ext_block: bool = True,
) -> bytes:
    body = u16(version) + bytes(32) + bytes([len(session_id)]) + session_id
    body += u16(len(suites)) + suites + bytes([len(compression)]) + compression
    if with_ext_block:
        block = b"".join(extensions)
        body += u16(len(block)) + block
    return b"\x01" + len(body).to_bytes(3, "big") + body


def records(
    message: bytes, sizes: list[int] | None = None, version: int = 0x0301, content_type: int = 0x16
) -> bytes:
    """Wrap ``message`` in records of the given sizes (the last takes the rest)."""
    out, pos = b"", 0
    for size in [*(sizes or []), len(message)]:
        chunk = message[pos : pos + size]
        if not chunk:
            break
        out += bytes([content_type]) + u16(version) + u16(len(chunk)) + chunk
        pos += len(chunk)
    return out


def hello(*extensions: bytes, **kwargs: object) -> bytes:
    return records(handshake(*extensions, **kwargs))  # type: ignore[arg-type]


def stdlib_hello(
    server_hostname: str | None,
    alpn: list[str] | None = None,
    maximum: ssl.TLSVersion | None = None,
) -> bytes:
    """A real ClientHello from the stdlib's OpenSSL, with no network."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if maximum is not None:
        ctx.maximum_version = maximum
    outgoing = ssl.MemoryBIO()
    tls = ctx.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def parse(buf: bytes) -> ClientHello:
    result = parse_client_hello(buf)
    assert isinstance(result, ClientHello), result
    return result


def malformed(buf: bytes) -> str:
    with pytest.raises(Malformed) as info:
        parse_client_hello(buf)
    return info.value.reason


def tr(buf: bytes, expected: ClientHello) -> None:
    """h11's tr(): whole, every prefix (NeedMore, a lower bound), then with trailing bytes."""
    assert parse_client_hello(buf) == expected
    assert expected.raw_len == len(buf)
    for cut in range(len(buf)):
        result = parse_client_hello(buf[:cut])
        assert isinstance(result, NeedMore), (cut, result)
        assert result.needed is not None
        assert cut + result.needed <= len(buf), cut
    for trailer in (b"\x17\x03\x03\x00\x05hello", b"GET / HTTP/1.1\r\n", b"\x00" * 100):
        assert parse_client_hello(buf + trailer) == expected


# -- fixtures --------------------------------------------------------------------------------------

EXPECTED_EXAMPLE = ClientHello(
    sni="example.com",
    alpn=("h2", "http/1.1"),
    versions=(0x0304,),
    has_ech=False,
    raw_len=97,
    legacy_version=0x0303,
    cipher_suites=(0x1301,),
    extensions=(EXT_SERVER_NAME, EXT_ALPN, EXT_SUPPORTED_VERSIONS),
)


def test_annotated_fixture() -> None:
    tr(HELLO_EXAMPLE, EXPECTED_EXAMPLE)


def test_annotated_fixture_over_two_records() -> None:
    expected = ClientHello(**{**EXPECTED_EXAMPLE.__dict__, "raw_len": 102})
    tr(HELLO_EXAMPLE_TWO_RECORDS, expected)


def test_need_more_is_exact_inside_the_single_record() -> None:
    for cut in range(5, len(HELLO_EXAMPLE)):
        assert parse_client_hello(HELLO_EXAMPLE[:cut]) == NeedMore(len(HELLO_EXAMPLE) - cut)
    assert parse_client_hello(b"") == NeedMore(9)  # a record header and a handshake header


def test_fixture_builder_agrees_with_the_annotated_hex() -> None:
    built = hello(
        sni_host(b"example.com"),
        ext(EXT_ALPN, bytes.fromhex("000c02683208687474702f312e31")),
        ext(EXT_SUPPORTED_VERSIONS, bytes.fromhex("020304")),
    )
    assert built == HELLO_EXAMPLE


# -- real hellos -----------------------------------------------------------------------------------

HOSTNAMES = [
    ("example.com", "example.com"),
    ("API.Example.COM", "api.example.com"),
    ("example.com.", "example.com"),
    ("bücher.de", "xn--bcher-kva.de"),  # the stdlib encodes to the A-label
    ("xn--bcher-kva.de", "xn--bcher-kva.de"),
    ("a_b.example", "a_b.example"),
    ("localhost", "localhost"),
    ("x" * 63 + ".example", "x" * 63 + ".example"),
    (None, None),
    ("192.0.2.1", None),  # OpenSSL sends no SNI for an address
    ("2001:db8::1", None),
]
ALPNS = [None, ["h2"], ["h2", "http/1.1"], ["http/1.1"]]
VERSIONS = [None, ssl.TLSVersion.TLSv1_2]


@pytest.mark.parametrize(("server_hostname", "sni"), HOSTNAMES)
@pytest.mark.parametrize("alpn", ALPNS)
@pytest.mark.parametrize("maximum", VERSIONS)
def test_stdlib_hello(
    server_hostname: str | None,
    sni: str | None,
    alpn: list[str] | None,
    maximum: ssl.TLSVersion | None,
) -> None:
    buf = stdlib_hello(server_hostname, alpn, maximum)
    result = parse(buf)
    assert result.sni == sni
    assert result.alpn == tuple(alpn or ())
    assert result.raw_len == len(buf)
    assert not result.has_ech
    if maximum is ssl.TLSVersion.TLSv1_2:
        assert result.versions == (0x0303,)
        assert EXT_SUPPORTED_VERSIONS not in result.extensions
    else:
        assert result.versions[0] == 0x0304
    assert (EXT_SERVER_NAME in result.extensions) == (sni is not None)


@pytest.mark.parametrize(("server_hostname", "sni"), HOSTNAMES[:4] + HOSTNAMES[8:9])
def test_stdlib_hello_every_prefix_and_trailer(
    server_hostname: str | None, sni: str | None
) -> None:
    buf = stdlib_hello(server_hostname, ["h2", "http/1.1"])
    expected = parse(buf)
    assert expected.sni == sni
    tr(buf, expected)


def test_stdlib_hello_split_across_records_at_every_position() -> None:
    buf = stdlib_hello("split.example", ["h2"])
    message = buf[5:]
    expected = parse(buf)
    for cut in range(1, len(message)):
        again = records(message, [cut], version=0x0303)
        assert parse_client_hello(again) == ClientHello(
            **{**expected.__dict__, "raw_len": len(message) + 10}
        ), cut


def test_stdlib_hello_in_one_byte_records() -> None:
    message = stdlib_hello("tiny.example", ["h2"])[5:]
    buf = records(message, [1] * len(message))
    assert len(buf) == 6 * len(message)
    result = parse(buf)
    assert (result.sni, result.raw_len) == ("tiny.example", len(buf))
    for cut in (0, 7, 600, len(buf) - 1):  # NeedMore while any record is missing
        assert isinstance(parse_client_hello(buf[:cut]), NeedMore)


# -- record layer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0x0300, 0x0301, 0x0302, 0x0303, 0x0304])
def test_record_versions_accepted(version: int) -> None:
    assert parse(records(handshake(sni_host(b"a.example")), version=version)).sni == "a.example"


@pytest.mark.parametrize("version", [0x0305, 0x0203, 0x0401, 0xFEFD])
def test_record_versions_refused(version: int) -> None:
    assert "record version" in malformed(records(handshake(), version=version))


@pytest.mark.parametrize(
    ("buf", "reason"),
    [
        (HELLO_SSLV2, "SSLv2"),
        (b"\x80", "SSLv2"),
        (b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", "not a TLS handshake record"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "not a TLS handshake record"),
        (b"\x15\x03\x03\x00\x02\x02\x28", "not a TLS handshake record"),  # an alert
        (b"\x14\x03\x03\x00\x01\x01", "not a TLS handshake record"),  # change_cipher_spec
        (b"\x16\x03\x01\x00\x00", "empty handshake record"),
        (b"\x16\x03\x01\x40\x01", "over 2^14"),
        (b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", "not ClientHello"),  # a ServerHello
        (b"\x16\x03\x01\x00\x01\x02", "not ClientHello"),  # refused on its first byte
        (b"\x16\x03\x01\x00\x04\x01\x01\x00\x00", "limit"),  # claims 64 KiB + 4
        (b"\x16\x03\x01\x00\x04\x01\x00\x00\x00", "legacy_version needs 2 bytes"),  # empty body
    ],
)
def test_refused_records(buf: bytes, reason: str) -> None:
    assert reason in malformed(buf)


def test_other_record_types_inside_the_hello_are_refused() -> None:
    message = handshake(sni_host(b"a.example"))
    first = records(message[:10])
    for content_type in (0x14, 0x15, 0x17):
        buf = first + records(message[10:], content_type=content_type)
        assert "before the ClientHello was complete" in malformed(buf)


def test_bytes_after_the_hello_in_its_record_are_refused() -> None:
    message = handshake(sni_host(b"a.example"))
    assert "after the ClientHello" in malformed(records(message + b"\x14\x00\x00\x00"))


def padded(message_len: int) -> bytes:
    """A ClientHello of exactly ``message_len`` bytes (header included), padded (RFC 7685)."""
    return handshake(ext(0x0015, bytes(message_len - len(handshake()) - 4)))


def test_size_cap() -> None:
    # 65516 bytes of message in four records of at most 2^14: 65536 bytes in all, the cap.
    buf = records(padded(65516), [2**14] * 3)
    assert len(buf) == MAX_HELLO_BYTES
    assert parse(buf).raw_len == MAX_HELLO_BYTES
    assert "records exceed the limit" in malformed(records(padded(65517), [2**14] * 3))
    # A handshake header that claims too much is refused as soon as it arrives.
    assert "limit" in malformed(b"\x16\x03\x01\x40\x00\x01\x00\xff\xfc")
    assert isinstance(parse_client_hello(b"\x16\x03\x01\x40\x00\x01\x00\xff\xeb"), NeedMore)
    # 1-byte records blow through the cap long before the message is complete.
    buf = records(padded(20_000), [1] * 20_000)
    assert "record headers exceeds the limit" in malformed(buf)
    assert "record headers exceeds the limit" in malformed(buf[: 6 * 9200])


# -- ClientHello body ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (handshake(version=0x0200), "ClientHello version"),
        (handshake(session_id=bytes(33)), "session id longer than 32"),
        (handshake(suites=b""), "cipher_suites of 0 bytes"),
        (handshake(suites=b"\x13\x01\x13"), "cipher_suites of 3 bytes"),
        (handshake(compression=b""), "no compression methods"),
        (handshake(sni_host(b"a.example"), sni_host(b"b.example")), "twice"),
        (handshake(ext(0x000A, b"\x00\x02\x00\x1d"), ext(0x000A, b"")), "twice"),
        (handshake() + b"\x00", "stray bytes after extensions"),
        (handshake(ext(0x0017, b""))[:-4] + b"\x00\x17\x00\x05", "needs 5 bytes"),
    ],
)
def test_refused_bodies(message: bytes, reason: str) -> None:
    # Fix up the handshake length after tampering, so only the body is wrong.
    message = message[:1] + (len(message) - 4).to_bytes(3, "big") + message[4:]
    assert reason in malformed(records(message))


def test_hello_without_extensions() -> None:
    result = parse(records(handshake(version=0x0300, with_ext_block=False)))
    assert (result.sni, result.alpn, result.extensions) == (None, (), ())
    assert result.versions == (0x0300,)


def test_grease_is_skipped_in_versions_and_kept_in_lists() -> None:
    versions = ext(EXT_SUPPORTED_VERSIONS, bytes.fromhex("06 3a3a 0304 0303"))
    result = parse(hello(ext(0x2A2A, b""), versions, suites=b"\x8a\x8a\x13\x01"))
    assert result.versions == (0x0304, 0x0303)
    assert result.extensions == (0x2A2A, EXT_SUPPORTED_VERSIONS)
    assert result.cipher_suites == (0x8A8A, 0x1301)
    only_grease = ext(EXT_SUPPORTED_VERSIONS, bytes.fromhex("02 fafa"))
    assert "only GREASE" in malformed(hello(only_grease))
    assert [v for v in range(0x10000) if is_grease(v)] == [0x0A0A + 0x1010 * i for i in range(16)]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "versions needs"),
        (b"\x00", "0 bytes"),
        (b"\x03\x03\x04\x03", "3 bytes"),
        (b"\x02\x03\x04\x00", "stray bytes"),
    ],
)
def test_refused_supported_versions(data: bytes, reason: str) -> None:
    assert reason in malformed(hello(ext(EXT_SUPPORTED_VERSIONS, data)))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x00\x00", "empty ALPN list"),
        (b"\x00\x01\x00", "empty ALPN protocol name"),
        (b"\x00\x03\x02h2\x00", "stray bytes"),
        (b"\x00\x03\x05h2", "needs 5 bytes"),
    ],
)
def test_refused_alpn(data: bytes, reason: str) -> None:
    assert reason in malformed(hello(ext(EXT_ALPN, data)))


def test_alpn_names_that_are_not_printable_are_shown_in_hex() -> None:
    alpn = ext(EXT_ALPN, b"\x00\x0a\x02\x0a\x0a\x02h2\x03\xff\x00 ")
    assert parse(hello(alpn)).alpn == ("0x0a0a", "h2", "0xff0020")


# -- server_name -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "sni"),
    [
        (b"example.com", "example.com"),
        (b"EXAMPLE.COM", "example.com"),
        (b"Example.Com.", "example.com"),  # one trailing dot dropped
        (b"xn--bcher-kva.de", "xn--bcher-kva.de"),
        (b"XN--BCHER-KVA.DE", "xn--bcher-kva.de"),
        (b"_dmarc.example.com", "_dmarc.example.com"),
        (b"a-b.example", "a-b.example"),
        (b"localhost", "localhost"),
        (b"1password.com", "1password.com"),  # starts with a digit, ends in a name
    ],
)
def test_server_names(name: bytes, sni: str) -> None:
    assert parse(hello(sni_host(name))).sni == sni


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        # IP literals, in every spelling a client would connect to (RFC 6066 3 forbids them)
        (b"192.0.2.1", "IP address"),
        (b"127.0.0.1.", "IP address"),
        (b"2130706433", "IP address"),
        (b"0x7f.1", "IP address"),
        (b"0177.0.0.1", "IP address"),
        (b"[::1]", "bytes a DNS name cannot have"),
        (b"2001:db8::1", "bytes a DNS name cannot have"),
        # what a DNS name cannot contain, refused rather than normalised
        (b"b\xc3\xbccher.de", "bytes a DNS name cannot have"),  # UTF-8, not an A-label
        (b"ex%61mple.com", "bytes a DNS name cannot have"),
        (b"example.com\x00.evil.com", "bytes a DNS name cannot have"),
        (b"example.com evil.com", "bytes a DNS name cannot have"),
        (b"user@example.com", "bytes a DNS name cannot have"),
        (b"example.com:443", "bytes a DNS name cannot have"),
        (b"example.com/", "bytes a DNS name cannot have"),
        # broken names
        (b"example..com", "empty label"),
        (b".example.com", "empty label"),
        (b"example.com..", "empty label"),
        (b".", "no labels"),
        (b"example.123", "cannot end in a number"),
        (b"xn--zz.example", "punycode"),
        (b"x" * 64 + b".example", "over 63"),
        (b".".join([b"x" * 63] * 4), "over 253"),
    ],
)
def test_refused_server_names(name: bytes, reason: str) -> None:
    assert reason in malformed(hello(sni_host(name)))


@pytest.mark.parametrize(
    ("entries", "sni"),
    [
        ([(0, b"a.example")], "a.example"),
        ([(1, b"ignored"), (0, b"a.example")], "a.example"),  # unknown types skipped, as Go
        ([(0, b"a.example"), (7, b"ignored")], "a.example"),
        ([(1, b"ignored")], None),
    ],
)
def test_server_name_entries(entries: list[tuple[int, bytes]], sni: str | None) -> None:
    assert parse(hello(sni_ext(*entries))).sni == sni


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (sni_ext((0, b"a.example"), (0, b"b.example")), "2 host_name entries"),
        (sni_ext((0, b"a.example"), (0, b"a.example")), "2 host_name entries"),
        (ext(EXT_SERVER_NAME, b""), "empty server_name extension"),
        (ext(EXT_SERVER_NAME, b"\x00\x00"), "empty server_name_list"),
        (sni_ext((0, b"")), "empty server name"),
        (sni_ext((1, b"")), "empty server name"),
        (ext(EXT_SERVER_NAME, b"\x00\x0e\x00\x00\x0ba.example"), "needs 14 bytes"),
        (ext(EXT_SERVER_NAME, b"\x00\x0c\x00\x00\x09a.example\x00"), "stray bytes"),
        (ext(EXT_SERVER_NAME, b"\x00\x0c\x00\x00\x0ba.example"), "needs 11 bytes"),
        (ext(EXT_SERVER_NAME, b"\x00"), "length of server_name_list"),
    ],
)
def test_refused_server_name_extensions(data: bytes, reason: str) -> None:
    assert reason in malformed(hello(data))


@pytest.mark.parametrize("ech_type", [EXT_ECH, EXT_ESNI_DRAFT])
def test_ech_is_reported_and_the_outer_name_is_the_sni(ech_type: int) -> None:
    # An ECHClientHello of type outer: suite, config id, enc, payload (contents opaque here).
    outer = b"\x00" + bytes.fromhex("0001 0001") + b"\x2a"
    outer += u16(32) + bytes(32) + u16(16) + bytes(16)
    result = parse(hello(sni_host(b"cloudflare-ech.com"), ext(ech_type, outer)))
    assert (result.sni, result.has_ech) == ("cloudflare-ech.com", True)
    assert not parse(hello(sni_host(b"cloudflare-ech.com"))).has_ech


# -- looks_like_tls and the error type -------------------------------------------------------------


@pytest.mark.parametrize(
    ("buf", "expected"),
    [
        (b"", None),
        (b"\x16", None),
        (b"\x16\x03", None),
        (b"\x16\x03\x01", True),
        (b"\x16\x03\x03\x02\x00", True),
        (b"\x16\x03\x04", True),
        (b"\x16\x03\x05", False),
        (b"\x16\x02", False),
        (b"\x17\x03\x03", False),
        (b"G", False),
        (b"GET / HTTP/1.1\r\n", False),
        (b"CONNECT", False),
        (b"\x80\x2e\x01", False),  # SSLv2
        (b"SSH-2.0", False),
    ],
)
def test_looks_like_tls(buf: bytes, expected: bool | None) -> None:
    assert looks_like_tls(buf) is expected


def test_looks_like_tls_on_real_hellos() -> None:
    assert looks_like_tls(HELLO_EXAMPLE) is True
    assert looks_like_tls(stdlib_hello("a.example")) is True


def test_malformed_is_a_peer_protocol_error_and_a_value_error() -> None:
    with pytest.raises(Malformed) as info:
        parse_client_hello(b"GET /")
    assert isinstance(info.value, PeerProtocolError)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith("malformed TLS ClientHello: ")


# -- fuzzing ---------------------------------------------------------------------------------------

REAL_HELLOS = [HELLO_EXAMPLE, HELLO_EXAMPLE_TWO_RECORDS]


def _outcome(buf: bytes) -> ClientHello | NeedMore | None:
    """The result, or None for Malformed; any other exception fails the test."""
    try:
        return parse_client_hello(buf)
    except Malformed:
        return None


def _sni_is_in_buffer(result: ClientHello, buf: bytes) -> bool:
    assert result.sni is not None
    return result.sni.encode() in buf.lower()


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_fuzz_random_bytes(buf: bytes) -> None:
    result = _outcome(buf)
    if isinstance(result, ClientHello) and result.sni is not None:
        assert EXT_SERVER_NAME in result.extensions
        assert _sni_is_in_buffer(result, buf)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_fuzz_record_framed_bytes(payload: bytes) -> None:
    # Random bytes behind a plausible record and handshake header get further in.
    message = b"\x01" + len(payload).to_bytes(3, "big") + payload
    buf = records(message)
    result = _outcome(buf)
    if isinstance(result, ClientHello) and result.sni is not None:
        assert _sni_is_in_buffer(result, buf)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(REAL_HELLOS),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=6),
    st.integers(0, 200),
)
def test_fuzz_mutated_hellos(base: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    buf = bytearray(base)
    for pos, value in flips:
        buf[pos % len(buf)] = value
    _outcome(bytes(buf))
    _outcome(bytes(buf[: len(buf) - cut]))


_EXTENSION_TYPES = st.integers(1, 0xFFFF).filter(lambda t: t != EXT_SERVER_NAME)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(_EXTENSION_TYPES, st.binary(max_size=40), max_size=8),
    st.lists(st.integers(1, 60), max_size=5),
)
def test_fuzz_no_sni_extension_means_no_sni(extensions: dict[int, bytes], sizes: list[int]) -> None:
    # Extension payloads may even spell server_name data; only extension 0 counts.
    message = handshake(*(ext(t, d) for t, d in extensions.items()))
    result = _outcome(records(message, sizes))
    if isinstance(result, ClientHello):
        assert result.sni is None
        assert result.extensions == tuple(extensions)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.from_regex(
        re.compile(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z]{2,10}){1,3}"), fullmatch=True
    ),
    st.lists(st.integers(1, 80), max_size=6),
)
def test_fuzz_fragmentation_never_changes_the_name(name: str, sizes: list[int]) -> None:
    message = handshake(sni_host(name.encode()))
    buf = records(message, sizes)
    result = _outcome(buf)
    if result is None:  # only names hostparse refuses (e.g. punycode-looking labels)
        assert name.startswith("xn--") or ".xn--" in name or "--" in name
        return
    assert isinstance(result, ClientHello)
    assert (result.sni, result.raw_len) == (name, len(buf))
