"""Request heads through h11 and then the proxy's own checks: every smuggling vector from the
literature refused (by h11 or by us, with the status the proxy answers), ordinary requests kept.

Vectors: PortSwigger's request smuggling research and cheat sheet (CL.TE, TE.CL, TE.TE
obfuscations), RFC 9112 sections 3.2, 6.1, 6.3 and 11.2, h2c smuggling (Bishop Fox, 2020)."""

from __future__ import annotations

from ipaddress import ip_address

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandgate.errors import PeerProtocolError
from sandgate.gateway.proxy.httphead import (
    CREDENTIAL_HEADERS,
    MAX_HEAD_BYTES,
    RequestTarget,
    check_head,
    head_end,
    judge_request,
    redact_target,
)

H11 = "h11"
US = "us"


def gate(raw: bytes, *, explicit_proxy: bool) -> tuple[str, int | RequestTarget]:
    """What the proxy does with ``raw``: (who refused, status) or ("ok", target)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        return H11, exc.error_status_hint
    assert isinstance(event, h11.Request), event
    try:
        check_head(raw)
        target = judge_request(
            event.method,
            event.target,
            list(event.headers),
            explicit_proxy=explicit_proxy,
            http_version=event.http_version,
        )
    except PeerProtocolError as exc:
        return US, exc.status_hint
    return "ok", target


def head(*lines: str | bytes, body: bytes = b"") -> bytes:
    raw = [line.encode("latin-1") if isinstance(line, str) else line for line in lines]
    return b"\r\n".join(raw) + b"\r\n\r\n" + body


# -- accepted --------------------------------------------------------------------------------------

GOOD = [
    # (name, raw, explicit_proxy, kind, scheme, host, port, path)
    (
        "plain GET",
        head("GET / HTTP/1.1", "Host: example.com"),
        False,
        "origin",
        None,
        "example.com",
        None,
        "/",
    ),
    (
        "GET with query",
        head("GET /search?q=secret&x HTTP/1.1", "Host: Example.COM:8080"),
        False,
        "origin",
        None,
        "example.com",
        8080,
        "/search?…",
    ),
    (
        "POST with Content-Length",
        head(
            "POST /v1/messages HTTP/1.1",
            "Host: api.anthropic.com",
            "Content-Length: 2",
            "Content-Type: application/json",
            body=b"{}",
        ),
        False,
        "origin",
        None,
        "api.anthropic.com",
        None,
        "/v1/messages",
    ),
    (
        "POST with Content-Length 0",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 0"),
        False,
        "origin",
        None,
        "a.example",
        None,
        "/",
    ),
    (
        "chunked POST",
        head(
            "POST /upload HTTP/1.1",
            "Host: a.example",
            "Transfer-Encoding: chunked",
            body=b"5\r\nhello\r\n0\r\n\r\n",
        ),
        False,
        "origin",
        None,
        "a.example",
        None,
        "/upload",
    ),
    (
        "chunked in any case, no space",
        head("POST / HTTP/1.1", "Host: a.example", "transfer-encoding:CHUNKED"),
        False,
        "origin",
        None,
        "a.example",
        None,
        "/",
    ),
    (
        "CONNECT host:443",
        head("CONNECT example.com:443 HTTP/1.1", "Host: example.com:443"),
        True,
        "authority",
        None,
        "example.com",
        443,
        "",
    ),
    (
        "CONNECT, Host without port",
        head("CONNECT example.com:443 HTTP/1.1", "Host: example.com"),
        True,
        "authority",
        None,
        "example.com",
        443,
        "",
    ),
    (
        "CONNECT HTTP/1.0 without Host",
        head("CONNECT example.com:443 HTTP/1.0"),
        True,
        "authority",
        None,
        "example.com",
        443,
        "",
    ),
    (
        "CONNECT IPv6",
        head("CONNECT [2001:db8::1]:443 HTTP/1.1", "Host: [2001:db8::1]:443"),
        True,
        "authority",
        None,
        "2001:db8::1",
        443,
        "",
    ),
    (
        "CONNECT IPv4, leading zeros in port",
        head("CONNECT 192.0.2.1:0443 HTTP/1.1", "Host: 192.0.2.1:443"),
        True,
        "authority",
        None,
        "192.0.2.1",
        443,
        "",
    ),
    (
        "CONNECT trailing dot, upper case",
        head("CONNECT Example.COM.:443 HTTP/1.1", "Host: example.com:443"),
        True,
        "authority",
        None,
        "example.com",
        443,
        "",
    ),
    (
        "absolute-form GET through the proxy",
        head("GET http://example.com/a/b?token=x HTTP/1.1", "Host: example.com"),
        True,
        "absolute",
        "http",
        "example.com",
        80,
        "/a/b?…",
    ),
    (
        "absolute-form, Host with default port",
        head("GET http://example.com/ HTTP/1.1", "Host: example.com:80"),
        True,
        "absolute",
        "http",
        "example.com",
        80,
        "/",
    ),
    (
        "absolute-form, explicit port",
        head("GET http://example.com:8080 HTTP/1.1", "Host: EXAMPLE.com:8080"),
        True,
        "absolute",
        "http",
        "example.com",
        8080,
        "/",
    ),
    (
        "absolute-form, query without path",
        head("GET http://example.com?a=1 HTTP/1.1", "Host: example.com"),
        True,
        "absolute",
        "http",
        "example.com",
        80,
        "/?…",
    ),
    (
        "absolute-form https",
        head("GET HTTPS://example.com/ HTTP/1.1", "Host: example.com"),
        True,
        "absolute",
        "https",
        "example.com",
        443,
        "/",
    ),
    (
        "absolute-form HTTP/1.0 without Host",
        head("GET http://example.com/ HTTP/1.0"),
        True,
        "absolute",
        "http",
        "example.com",
        80,
        "/",
    ),
    (
        "absolute-form in a transparent request",
        head("GET http://example.com/x HTTP/1.1", "Host: example.com"),
        False,
        "absolute",
        "http",
        "example.com",
        80,
        "/x",
    ),
    (
        "IDN Host",
        head("GET / HTTP/1.1", "Host: xn--bcher-kva.de"),
        False,
        "origin",
        None,
        "xn--bcher-kva.de",
        None,
        "/",
    ),
    (
        "IPv4 Host",
        head("GET / HTTP/1.1", "Host: 192.0.2.7"),
        False,
        "origin",
        None,
        "192.0.2.7",
        None,
        "/",
    ),
    (
        "OPTIONS *",
        head("OPTIONS * HTTP/1.1", "Host: example.com"),
        False,
        "asterisk",
        None,
        "example.com",
        None,
        "*",
    ),
    (
        "HTTP/1.0 with Host",
        head("GET / HTTP/1.0", "Host: example.com"),
        False,
        "origin",
        None,
        "example.com",
        None,
        "/",
    ),
    (
        "WebSocket upgrade",
        head("GET /ws HTTP/1.1", "Host: example.com", "Connection: Upgrade", "Upgrade: websocket"),
        False,
        "origin",
        None,
        "example.com",
        None,
        "/ws",
    ),
    (
        "path starting with //",
        head("GET //evil.example/x HTTP/1.1", "Host: example.com"),
        False,
        "origin",
        None,
        "example.com",
        None,
        "//evil.example/x",
    ),
]


@pytest.mark.parametrize(
    ("raw", "explicit_proxy", "kind", "scheme", "host", "port", "path"),
    [pytest.param(*row[1:], id=str(row[0])) for row in GOOD],
)
def test_accepted(
    raw: bytes,
    explicit_proxy: bool,
    kind: str,
    scheme: str | None,
    host: str,
    port: int | None,
    path: str,
) -> None:
    who, target = gate(raw, explicit_proxy=explicit_proxy)
    assert who == "ok", target
    assert isinstance(target, RequestTarget)
    assert (target.kind, target.scheme, target.host, target.port, target.path) == (
        kind,
        scheme,
        host,
        port,
        path,
    )


def test_addresses_and_raw_paths() -> None:
    _, v6 = gate(
        head("CONNECT [2001:db8::1]:443 HTTP/1.1", "Host: [2001:db8::1]:443"), explicit_proxy=True
    )
    assert isinstance(v6, RequestTarget)
    assert v6.address == ip_address("2001:db8::1")
    _, name = gate(
        head("GET http://example.com?a=1 HTTP/1.1", "Host: example.com"), explicit_proxy=True
    )
    assert isinstance(name, RequestTarget)
    assert (name.address, name.path_raw) == (None, b"/?a=1")
    _, origin = gate(head("GET /p?q=1 HTTP/1.1", "Host: 0x7f.1"), explicit_proxy=False)
    assert isinstance(origin, RequestTarget)
    assert (origin.host, origin.address, origin.path_raw) == (
        "127.0.0.1",
        ip_address("127.0.0.1"),
        b"/p?q=1",
    )


# -- refused ---------------------------------------------------------------------------------------

BAD = [
    # (name, raw, explicit_proxy, who refuses, status)
    # CL.TE / TE.CL: both framing headers (PortSwigger's basic vectors; RFC 9112 6.1, 11.2)
    (
        "CL.TE",
        head(
            "POST / HTTP/1.1",
            "Host: a.example",
            "Content-Length: 13",
            "Transfer-Encoding: chunked",
            body=b"0\r\n\r\nSMUGGLED",
        ),
        False,
        US,
        400,
    ),
    (
        "TE.CL",
        head(
            "POST / HTTP/1.1",
            "Host: a.example",
            "Transfer-Encoding: chunked",
            "Content-Length: 3",
            body=b"8\r\nSMUGGLED\r\n0\r\n\r\n",
        ),
        False,
        US,
        400,
    ),
    # TE.TE: Transfer-Encoding obfuscations (PortSwigger's list)
    (
        "TE xchunked",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding: xchunked"),
        False,
        H11,
        501,
    ),
    (
        "TE space before colon",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding : chunked"),
        False,
        H11,
        400,
    ),
    (
        "TE tab before value",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding:\tchunked"),
        False,
        US,
        400,
    ),
    (
        "TE two spaces",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding:  chunked"),
        False,
        US,
        400,
    ),
    (
        "TE trailing space",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding: chunked "),
        False,
        US,
        400,
    ),
    (
        "TE twice",
        head(
            "POST / HTTP/1.1",
            "Host: a.example",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: x",
        ),
        False,
        H11,
        501,
    ),
    (
        "TE twice, both chunked",
        head(
            "POST / HTTP/1.1",
            "Host: a.example",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: chunked",
        ),
        False,
        H11,
        501,
    ),
    (
        "TE list chunked, identity",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding: chunked, identity"),
        False,
        H11,
        501,
    ),
    (
        "TE list identity, chunked",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding: identity, chunked"),
        False,
        H11,
        501,
    ),
    (
        "TE quoted",
        head("POST / HTTP/1.1", "Host: a.example", 'Transfer-Encoding: "chunked"'),
        False,
        H11,
        501,
    ),
    (
        "TE folded onto the next line (obs-fold)",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer-Encoding:", " chunked"),
        False,
        US,
        400,
    ),
    (
        "TE hidden by obs-fold in another header",
        head("POST / HTTP/1.1", "Host: a.example", "X: y", " Transfer-Encoding: chunked"),
        False,
        US,
        400,
    ),
    (
        "TE after a bare LF",
        head("POST / HTTP/1.1", "Host: a.example", b"X: X\nTransfer-Encoding: chunked"),
        False,
        US,
        400,
    ),
    (
        "TE name, bare LF, folded colon",
        head("POST / HTTP/1.1", "Host: a.example", b"Transfer-Encoding\n : chunked"),
        False,
        H11,
        400,
    ),
    (
        "TE with vertical tab in name",
        head("POST / HTTP/1.1", "Host: a.example", b"Transfer-Encoding\x0b: chunked"),
        False,
        H11,
        400,
    ),
    (
        "TE with underscore",
        head("POST / HTTP/1.1", "Host: a.example", "Transfer_Encoding: chunked"),
        False,
        US,
        400,
    ),
    (
        "TE in HTTP/1.0",
        head("POST / HTTP/1.0", "Host: a.example", "Transfer-Encoding: chunked"),
        False,
        US,
        400,
    ),
    (
        "TE with NUL",
        head("POST / HTTP/1.1", "Host: a.example", b"Transfer-Encoding: chunked\x00"),
        False,
        H11,
        400,
    ),
    # Content-Length
    (
        "CL twice, equal (h11 folds them; we refuse)",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 5", "Content-Length: 5"),
        False,
        US,
        400,
    ),
    (
        "CL twice, different",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 5", "Content-Length: 6"),
        False,
        H11,
        400,
    ),
    (
        "CL list of equal values",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 5, 5"),
        False,
        US,
        400,
    ),
    (
        "CL list of different values",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 5, 6"),
        False,
        H11,
        400,
    ),
    (
        "CL plus sign",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: +5"),
        False,
        H11,
        400,
    ),
    (
        "CL negative",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: -1"),
        False,
        H11,
        400,
    ),
    ("CL hex", head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 0x5"), False, H11, 400),
    (
        "CL tab before value",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length:\t5"),
        False,
        US,
        400,
    ),
    (
        "CL space before colon",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length : 5"),
        False,
        H11,
        400,
    ),
    (
        "CL with underscore",
        head("POST / HTTP/1.1", "Host: a.example", "Content_Length: 5"),
        False,
        US,
        400,
    ),
    (
        "CL of 20 digits",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 99999999999999999999"),
        False,
        US,
        413,
    ),
    (
        "CL of 21 digits",
        head("POST / HTTP/1.1", "Host: a.example", "Content-Length: 999999999999999999999"),
        False,
        H11,
        400,
    ),
    # Host (RFC 9112 3.2)
    ("missing Host", head("GET / HTTP/1.1"), False, H11, 400),
    ("missing Host, HTTP/1.0 origin-form", head("GET / HTTP/1.0"), False, US, 400),
    ("missing Host, absolute-form", head("GET http://a.example/ HTTP/1.1"), True, H11, 400),
    ("Host twice", head("GET / HTTP/1.1", "Host: a.example", "Host: b.example"), False, H11, 400),
    (
        "Host twice, equal",
        head("GET / HTTP/1.1", "Host: a.example", "Host: a.example"),
        False,
        H11,
        400,
    ),
    ("empty Host", head("GET / HTTP/1.1", "Host:"), False, US, 400),
    ("Host with userinfo", head("GET / HTTP/1.1", "Host: a.example@b.example"), False, US, 400),
    ("Host with path", head("GET / HTTP/1.1", "Host: a.example/x"), False, US, 400),
    ("Host with space", head("GET / HTTP/1.1", "Host: a .example"), False, US, 400),
    ("Host IPv6 without brackets", head("GET / HTTP/1.1", "Host: 2001:db8::1"), False, US, 400),
    ("Host port 0", head("GET / HTTP/1.1", "Host: a.example:0"), False, US, 400),
    ("Host port too big", head("GET / HTTP/1.1", "Host: a.example:65536"), False, US, 400),
    ("Host backslash", head("GET / HTTP/1.1", "Host: a.example\\b"), False, US, 400),
    ("Host percent-escaped", head("GET / HTTP/1.1", "Host: %61.example"), False, US, 400),
    ("Host IPv6 zone", head("GET / HTTP/1.1", "Host: [fe80::1%25eth0]"), False, US, 400),
    ("Host IDN in UTF-8", head("GET / HTTP/1.1", b"Host: b\xc3\xbccher.de"), False, US, 400),
    # fronting: the target names another host than Host
    (
        "absolute-form fronting",
        head("GET http://good.example/ HTTP/1.1", "Host: evil.example"),
        True,
        US,
        400,
    ),
    (
        "absolute-form fronting, transparent",
        head("GET http://good.example/ HTTP/1.1", "Host: evil.example"),
        False,
        US,
        400,
    ),
    (
        "absolute-form port mismatch",
        head("GET http://a.example/ HTTP/1.1", "Host: a.example:81"),
        True,
        US,
        400,
    ),
    (
        "absolute-form https vs Host :80",
        head("GET https://a.example/ HTTP/1.1", "Host: a.example:80"),
        True,
        US,
        400,
    ),
    (
        "absolute-form IP vs name",
        head("GET http://127.0.0.1/ HTTP/1.1", "Host: localhost"),
        True,
        US,
        400,
    ),
    (
        "CONNECT fronting",
        head("CONNECT good.example:443 HTTP/1.1", "Host: evil.example:443"),
        True,
        US,
        400,
    ),
    (
        "CONNECT port mismatch",
        head("CONNECT a.example:443 HTTP/1.1", "Host: a.example:22"),
        True,
        US,
        400,
    ),
    # methods
    ("TRACE", head("TRACE / HTTP/1.1", "Host: a.example"), False, US, 405),
    ("TRACK", head("TRACK / HTTP/1.1", "Host: a.example"), False, US, 405),
    ("trace in lower case", head("trace / HTTP/1.1", "Host: a.example"), False, US, 405),
    (
        "TRACE through the proxy",
        head("TRACE http://a.example/ HTTP/1.1", "Host: a.example"),
        True,
        US,
        405,
    ),
    # CONNECT targets
    (
        "CONNECT userinfo",
        head("CONNECT user:pw@a.example:443 HTTP/1.1", "Host: a.example:443"),
        True,
        US,
        400,
    ),
    ("CONNECT port 0", head("CONNECT a.example:0 HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "CONNECT port 65536",
        head("CONNECT a.example:65536 HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    (
        "CONNECT huge port",
        head("CONNECT a.example:" + "9" * 5000 + " HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    ("CONNECT without port", head("CONNECT a.example HTTP/1.1", "Host: a.example"), True, US, 400),
    ("CONNECT empty port", head("CONNECT a.example: HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "CONNECT port not a number",
        head("CONNECT a.example:https HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    (
        "CONNECT URL",
        head("CONNECT http://a.example:443/ HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    ("CONNECT path", head("CONNECT / HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "CONNECT bare IPv6",
        head("CONNECT 2001:db8::1:443 HTTP/1.1", "Host: [2001:db8::1]:443"),
        True,
        US,
        400,
    ),
    (
        "CONNECT IPv6 without port",
        head("CONNECT [2001:db8::1] HTTP/1.1", "Host: [2001:db8::1]"),
        True,
        US,
        400,
    ),
    ("CONNECT no host", head("CONNECT :443 HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "CONNECT to an IP spelt as a number",
        head("CONNECT 2130706433:443 HTTP/1.1", "Host: localhost:443"),
        True,
        US,
        400,
    ),
    (
        "CONNECT on the transparent port",
        head("CONNECT a.example:443 HTTP/1.1", "Host: a.example"),
        False,
        US,
        405,
    ),
    # request-target forms
    ("origin-form to the explicit proxy", head("GET / HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "OPTIONS * to the explicit proxy",
        head("OPTIONS * HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    ("GET *", head("GET * HTTP/1.1", "Host: a.example"), False, US, 400),
    ("authority-form GET", head("GET a.example:80 HTTP/1.1", "Host: a.example"), False, US, 400),
    ("relative path", head("GET a.example/x HTTP/1.1", "Host: a.example"), False, US, 400),
    ("ftp URL", head("GET ftp://a.example/ HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "URL with userinfo",
        head("GET http://u:p@a.example/ HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    (
        "URL with fragment",
        head("GET http://a.example/#x HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    (
        "fragment hiding userinfo",
        head("GET http://evil.example#@a.example/ HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    (
        "URL with backslash",
        head("GET http://evil.example\\@a.example/ HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    ("URL without host", head("GET http:///x HTTP/1.1", "Host: a.example"), True, US, 400),
    (
        "URL percent-escaped host",
        head("GET http://%61.example/ HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    (
        "URL bare IPv6",
        head("GET http://2001:db8::1/ HTTP/1.1", "Host: [2001:db8::1]"),
        True,
        US,
        400,
    ),
    (
        "CONNECT percent-escaped host",
        head("CONNECT %61.example:443 HTTP/1.1", "Host: a.example"),
        True,
        US,
        400,
    ),
    ("non-ASCII target", head(b"GET /\xc3\xa9 HTTP/1.1", "Host: a.example"), False, H11, 400),
    # head bytes (RFC 9112 2.2, 5.2)
    (
        "NUL in a header value",
        head("GET / HTTP/1.1", "Host: a.example", b"X: a\x00b"),
        False,
        H11,
        400,
    ),
    (
        "bare CR in a header value",
        head("GET / HTTP/1.1", "Host: a.example", b"X: a\rb"),
        False,
        H11,
        400,
    ),
    ("bare LF everywhere", b"GET / HTTP/1.1\nHost: a.example\n\n", False, US, 400),
    ("bare LF after the request line", b"GET / HTTP/1.1\nHost: a.example\r\n\r\n", False, US, 400),
    (
        "obs-fold in a value",
        head("GET / HTTP/1.1", "Host: a.example", "X: a", "\tb"),
        False,
        US,
        400,
    ),
    ("obs-fold of Host", head("GET / HTTP/1.1", "Host:", " a.example"), False, US, 400),
    ("space before colon", head("GET / HTTP/1.1", "Host : a.example"), False, H11, 400),
    (
        "empty line before the request",
        b"\r\n" + head("GET / HTTP/1.1", "Host: a.example"),
        False,
        H11,
        400,
    ),
    (
        "double space in the request line",
        head("GET  / HTTP/1.1", "Host: a.example"),
        False,
        H11,
        400,
    ),
    (
        "oversized head",
        head("GET / HTTP/1.1", "Host: a.example", "X: " + "a" * MAX_HEAD_BYTES),
        False,
        US,
        431,
    ),
    # versions and upgrades
    ("HTTP/2.0 request line", head("GET / HTTP/2.0", "Host: a.example"), False, US, 505),
    ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", False, US, 505),
    ("HTTP/0.9", b"GET /\r\n\r\n", False, H11, 400),
    (
        "h2c upgrade (h2c smuggling)",
        head(
            "GET / HTTP/1.1",
            "Host: a.example",
            "Connection: Upgrade, HTTP2-Settings",
            "Upgrade: h2c",
            "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
        ),
        False,
        US,
        400,
    ),
    (
        "h2c among upgrades",
        head("GET / HTTP/1.1", "Host: a.example", "Upgrade: websocket, H2C"),
        False,
        US,
        400,
    ),
]


@pytest.mark.parametrize(
    ("raw", "explicit_proxy", "who", "status"),
    [pytest.param(*row[1:], id=str(row[0])) for row in BAD],
)
def test_refused(raw: bytes, explicit_proxy: bool, who: str, status: int) -> None:
    assert gate(raw, explicit_proxy=explicit_proxy) == (who, status)


def test_every_h11_acceptance_we_rely_on_is_pinned() -> None:
    # If an h11 upgrade starts refusing one of "our" vectors the table above needs its "who"
    # changed; if it starts accepting one of h11's, our checks must take it over.
    from importlib.metadata import version

    assert version("h11") == "0.16.0"


# -- judge_request without h11: its own checks hold on any header list -----------------------------


def judge(
    headers: list[tuple[bytes, bytes]],
    method: bytes = b"POST",
    target: bytes = b"/",
    explicit_proxy: bool = False,
    http_version: bytes = b"1.1",
) -> int | RequestTarget:
    try:
        return judge_request(
            method, target, headers, explicit_proxy=explicit_proxy, http_version=http_version
        )
    except PeerProtocolError as exc:
        return exc.status_hint


HOST = (b"Host", b"a.example")


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([HOST, (b"Content-Length", b"5"), (b"content-length", b"5")], 400),
        ([HOST, (b"Content-Length", b"5, 5")], 400),
        ([HOST, (b"Content-Length", b"")], 400),
        ([HOST, (b"Content-Length", b"1" * 19)], 413),
        ([HOST, (b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"5")], 400),
        ([HOST, (b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")], 400),
        ([HOST, (b"Transfer-Encoding", b"gzip")], 501),
        ([HOST, (b"Transfer-Encoding", b"gzip, chunked")], 501),
        ([HOST, (b"Transfer-Encoding", b"chunked;x=1")], 400),
        ([HOST, (b"Transfer-Encoding", b"chunked,")], 400),
        ([HOST, (b"Transfer-Encoding", b"")], 400),
        ([HOST, HOST], 400),
        ([(b"HOST", b"a.example"), (b"host", b"b.example")], 400),
        ([], 400),
        ([HOST, (b"Content_Length", b"5")], 400),
        ([HOST, (b"transfer_encoding", b"chunked")], 400),
        ([HOST, (b"Upgrade", b"h2c")], 400),
    ],
)
def test_judge_request_alone(headers: list[tuple[bytes, bytes]], status: int) -> None:
    assert judge(headers) == status


def test_judge_request_alone_accepts_padded_values_as_h11_hands_them_over() -> None:
    target = judge([HOST, (b"Transfer-Encoding", b" Chunked ")])
    assert isinstance(target, RequestTarget)
    assert isinstance(judge([HOST, (b"Content-Length", b" 5")]), RequestTarget)


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [
        (b"GET", b"/a b", 400),
        (b"GET", b"/\x7f", 400),
        (b"GET", b"/\xff", 400),
        (b"GET", b"", 400),
        (b"G T", b"/", 400),
        (b"", b"/", 400),
        (b"TRACE", b"/", 405),
        (b"Track", b"/", 405),
    ],
)
def test_judge_request_odd_methods_and_targets(method: bytes, target: bytes, status: int) -> None:
    assert judge([HOST], method=method, target=target) == status


def test_versions() -> None:
    assert judge([HOST], http_version=b"1.2") == 505
    assert judge([HOST], http_version=b"0.9") == 505
    assert isinstance(judge([HOST], method=b"GET", http_version=b"1.0"), RequestTarget)


def test_messages_say_what_is_wrong() -> None:
    cases = [
        (head("GET / HTTP/1.1", "Host: a.example"), True, "a proxy request needs an absolute URL"),
        (head("GET http://b.example/ HTTP/1.1", "Host: a.example"), True, "domain fronting"),
        (head("CONNECT a.example HTTP/1.1", "Host: a.example"), True, "has no port"),
        (head("CONNECT a.example:0 HTTP/1.1", "Host: a.example"), True, "out of range"),
        (head("CONNECT u@a.example:443 HTTP/1.1", "Host: a.example"), True, "userinfo"),
        (
            head("POST / HTTP/1.1", "Host: a", "Content-Length: 1", "Content-Length: 1"),
            False,
            "Content-Length header given 2 times",
        ),
        (head("POST / HTTP/1.1", "Host: a", "Transfer-Encoding:\tchunked"), False, "written oddly"),
        (
            head("POST / HTTP/1.1", "Host: a", "Content-Length: 1", "Transfer-Encoding: chunked"),
            False,
            "both Content-Length and Transfer-Encoding",
        ),
        (head("GET / HTTP/1.1", "Host: a", "X: y", " z"), False, "obsolete line folding"),
        (b"GET / HTTP/1.1\nHost: a\n\n", False, "bare LF"),
        (head("TRACE / HTTP/1.1", "Host: a"), False, "TRACE is not allowed"),
    ]
    for raw, explicit_proxy, words in cases:
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(raw)
        event = conn.next_event()
        assert isinstance(event, h11.Request)
        with pytest.raises(PeerProtocolError) as info:
            check_head(raw)
            judge_request(
                event.method,
                event.target,
                list(event.headers),
                explicit_proxy=explicit_proxy,
                http_version=event.http_version,
            )
        assert words in info.value.message, (raw, info.value.message)


# -- check_head and head_end on bytes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody with \x00 and \n is not head", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\nHost: a\n\n", None),  # pipelined
        (b"GET / HTTP/1.1\r\nHost: a\r\n", None),  # incomplete: what is there is fine
        (b"GET / HTTP/1.1\r\nHost: a\r", None),  # the LF may still come
        (b"GET / HTTP/1.1\r\nHo\x00st: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX: \r\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nX\r\n\r\n", 400),  # no colon
        (b"GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", 400),  # no name
        (b"GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHo st: a\r\n\r\n", 400),
        (b"\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHOST: b\r\n\r\n", 400),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
            b"transfer-encoding: chunked\r\n\r\n",
            400,
        ),
        (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 \r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"G" * (MAX_HEAD_BYTES + 1), 431),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES - 23) + b"\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES - 22) + b"\r\n\r\n", 431),
    ],
)
def test_check_head(raw: bytes, status: int | None) -> None:
    if status is None:
        check_head(raw)
        return
    with pytest.raises(PeerProtocolError) as info:
        check_head(raw)
    assert info.value.status_hint == status


def test_head_end_finds_what_h11_finds() -> None:
    assert head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody") == 27
    assert head_end(b"GET / HTTP/1.1\nHost: a\n\nbody") == 24
    assert head_end(b"GET / HTTP/1.1\r\nHost: a\n\r\nbody") == 26
    assert head_end(b"GET / HTTP/1.1\r\nHost: a\r\n") is None
    assert head_end(b"a" * MAX_HEAD_BYTES) is None
    with pytest.raises(PeerProtocolError) as info:
        head_end(b"a" * (MAX_HEAD_BYTES + 1))
    assert info.value.status_hint == 431


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_fuzz_check_head_raises_only_peer_protocol_errors(raw: bytes) -> None:
    try:
        check_head(raw)
    except PeerProtocolError as exc:
        assert exc.status_hint in (400, 413, 431, 501)


_HEADER_NAMES = st.sampled_from(
    [b"Host", b"Content-Length", b"Transfer-Encoding", b"Upgrade", b"X", b"host", b"Content_Length"]
)


@settings(max_examples=300)
@given(
    st.sampled_from([b"GET", b"POST", b"CONNECT", b"OPTIONS", b"TRACE", b"PUT"]),
    st.one_of(
        st.binary(max_size=60),
        st.from_regex(rb"[a-z]{1,6}://[ -~]{0,40}", fullmatch=True),
        st.from_regex(rb"/[ -~]{0,40}", fullmatch=True),
    ),
    st.lists(st.tuples(_HEADER_NAMES, st.binary(max_size=30)), max_size=5),
    st.booleans(),
)
def test_fuzz_judge_request_raises_only_peer_protocol_errors(
    method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], explicit_proxy: bool
) -> None:
    try:
        result = judge_request(method, target, headers, explicit_proxy=explicit_proxy)
    except PeerProtocolError:
        return
    assert result.host is not None
    assert result.kind != "origin" or not explicit_proxy


# -- redact_target and CREDENTIAL_HEADERS ----------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("/", "/"),
        ("/v1/messages", "/v1/messages"),
        ("/search?q=secret", "/search?…"),
        ("/a?key=sk-123&x=1&flag", "/a?…"),
        ("/a?sk-123", "/a?…"),
        ("/a?", "/a?…"),
        ("/a#frag?x=1", "/a"),
        ("/a?x=1#frag", "/a?…"),
        ("/a@b/c", "/a@b/c"),  # '@' in a path is not userinfo
        ("http://u:p@a.example/p?t=1", "http://…@a.example/p?…"),
        ("http://u:p@a.example", "http://…@a.example"),
        ("http://u:p#x@a.example/", "http://…@a.example/"),  # parsers disagree: redact both
        ("http://u:p?x@a.example/", "http://…@a.example/"),
        ("http://a@b@c.example/", "http://…@c.example/"),
        ("HTTPS://u@a.example:8443", "HTTPS://…@a.example:8443"),
        ("http://a.example?t=1", "http://a.example?…"),
        ("https://a.example/", "https://a.example/"),
        ("a.example:443", "a.example:443"),
        ("user:pass@a.example:443", "…@a.example:443"),  # CONNECT with userinfo
        ("*", "*"),
    ],
)
def test_redact_target(target: str, shown: str) -> None:
    assert redact_target(target) == shown


def test_credential_headers() -> None:
    assert all(name == name.lower() for name in CREDENTIAL_HEADERS)
    for name in (
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "x-auth-token",
        "private-token",
        "x-amz-security-token",
    ):
        assert name in CREDENTIAL_HEADERS
    # identifiers, not secrets; and Anthropic uses x-api-key, not a header of its own
    for name in (
        "openai-organization",
        "openai-project",
        "anthropic-version",
        "anthropic-api-key",
        "host",
        "user-agent",
    ):
        assert name not in CREDENTIAL_HEADERS
