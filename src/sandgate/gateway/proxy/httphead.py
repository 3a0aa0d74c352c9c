"""An HTTP/1.x request head, judged before the proxy forwards it.

h11 parses; this module is the proxy's stricter second look, so that the gateway, the upstream
server and anything between them read one request the same way (no request smuggling, no
domain fronting). Two checks, each raising ``PeerProtocolError(message, status_hint)``:

- ``check_head(raw_head)``: on the bytes, things h11 tolerates or hides: NUL, bare LF or CR,
  obsolete line folding, whitespace before a header's colon, a head over 64 KiB (431), and the
  framing headers as written (h11 folds ``Content-Length: 5`` given twice into one header and
  strips tabs around ``chunked``, so only the raw bytes show them).
- ``judge_request(method, target, headers, explicit_proxy=...)``: on the parsed request (h11's
  ``Request``, or any header list): framing, Host, methods and the request target; returns the
  target normalised by ``policy.hostparse``.

Rules a reviewer should know:

- Content-Length may appear once, as digits only; twice is refused even with equal values
  (RFC 9112 6.3 lets a recipient merge them, but refusing is the simplest rule nothing can
  disagree with, and no client sends it). With Transfer-Encoding it is refused outright.
- Transfer-Encoding must be exactly ``chunked`` (any case), once, written ``Transfer-Encoding:
  chunked`` with at most one space and no tab; other codings are 501 (RFC 9112 6.1), malformed
  values 400. HTTP/1.0 with Transfer-Encoding is refused (RFC 9112 6.1: its framing is faulty).
- TRACE and TRACK are 405 (they echo credentials back); CONNECT only on the explicit proxy
  (405 elsewhere), as ``host:port`` with a port 1-65535 and no userinfo.
- Host: once; required unless the target is an absolute URL in HTTP/1.0; when the target names
  a host (absolute URL, CONNECT) the two must agree, host and port, or it is fronting (400).
  RFC 9112 3.2.2 tells a proxy to ignore a disagreeing Host; refusing is stricter and safe.
- An explicit proxy needs an absolute URL (or CONNECT); a transparent one accepts both forms.
- ``Upgrade: h2c`` is refused: an upgraded cleartext HTTP/2 connection would carry requests
  this module never sees (h2c smuggling).
- No fragment (``#``) and no userinfo in a target; absolute URLs are http or https only.
- Hosts (Host header, CONNECT, URL) are written as DNS names (letters, digits, ``.-_``) or
  bracketed IPv6; percent-escapes and other spellings URL parsers disagree on are refused,
  then ``hostparse`` normalises (case, trailing dot, numeric IPv4 forms such as ``0x7f.1``).
- ``Content_Length`` and ``Transfer_Encoding`` are refused: CGI-style servers map ``_`` and
  ``-`` to one variable, so the server would frame a body the proxy did not see.

Pure: no sockets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NoReturn

from sandgate.errors import PeerProtocolError
from sandgate.policy.hostparse import (
    DEFAULT_PORTS,
    Host,
    HostParseError,
    IPHost,
    NameHost,
    parse_host,
    parse_target,
)
from sandgate.policy.model import IPAddress

__all__ = [
    "CREDENTIAL_HEADERS",
    "MAX_HEAD_BYTES",
    "RequestTarget",
    "TargetKind",
    "check_head",
    "head_end",
    "judge_request",
    "redact_path",
]

MAX_HEAD_BYTES = 64 * 1024
_MAX_LENGTH_DIGITS = 18  # stays below 2^63 for whatever reads it next

# Header names (lower-case) whose values are credentials: never logged, and where a sandbox's
# placeholder may sit. Cookies are included: session cookies are bearer credentials.
# Not included: openai-organization, openai-project, anthropic-version (identifiers, not secrets).
# Anthropic's key travels in x-api-key, Azure OpenAI's in api-key, Gemini's in x-goog-api-key.
CREDENTIAL_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "set-cookie",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-auth-token",
        "x-access-token",
        "private-token",  # GitLab
        "job-token",  # GitLab CI
        "x-amz-security-token",  # AWS session token
        "ocp-apim-subscription-key",  # Azure API Management, Azure AI services
        "x-functions-key",  # Azure Functions
        "x-vault-token",  # HashiCorp Vault
        "dd-api-key",  # Datadog
        "dd-application-key",
    }
)

TargetKind = Literal["origin", "absolute", "authority", "asterisk"]


@dataclass(frozen=True)
class RequestTarget:
    """Where a request goes. ``host`` is a normalised name, or an address as text (``address``
    is then set); ``port`` is explicit or the scheme's default, None when neither is known
    (origin form without a port in Host: the connection's port applies). ``path`` is for logs:
    any query string is shown as ``?…``. ``path_raw`` is the origin-form target to send upstream
    (path and query; empty for CONNECT)."""

    kind: TargetKind
    scheme: str | None
    host: str | None
    port: int | None
    path: str
    path_raw: bytes
    address: IPAddress | None = None


def _refuse(message: str, status: int = 400) -> NoReturn:
    raise PeerProtocolError(message, status)


def _show(value: bytes | str, limit: int = 80) -> str:
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return repr(text if len(text) <= limit else text[:limit] + "…")


# -- bytes -----------------------------------------------------------------------------------------

_HEAD_END = re.compile(rb"\n\r?\n")  # h11's own end-of-head test (it accepts bare LF)
_BARE_LF = re.compile(rb"(?<!\r)\n")
_BARE_CR = re.compile(rb"\r(?!\n)")
_WHITESPACE = re.compile(rb"[ \t\x0b\x0c]")
_RAW_FRAMING = {
    b"content-length": re.compile(rb" ?[0-9]+"),
    b"transfer-encoding": re.compile(rb" ?chunked", re.IGNORECASE),
}


def head_end(buf: bytes) -> int | None:
    """Index just past the empty line that ends the head, found as h11 finds it; None if
    not there yet. Raises 431 once more than ``MAX_HEAD_BYTES`` have come without one."""
    match = _HEAD_END.search(buf, 0, MAX_HEAD_BYTES + 2)
    if match is not None and match.end() <= MAX_HEAD_BYTES:
        return match.end()
    if len(buf) > MAX_HEAD_BYTES:
        _refuse(f"request head over {MAX_HEAD_BYTES} bytes", 431)
    return None


def check_head(raw_head: bytes) -> None:
    """Byte-level checks of one request head. ``raw_head`` starts at the request line; bytes
    after the empty line that ends the head (a body, a pipelined request) are ignored."""
    end = head_end(raw_head)
    head = raw_head if end is None else raw_head[:end]
    if b"\x00" in head:
        _refuse("NUL byte in the request head")
    if _BARE_LF.search(head):
        _refuse("line ending without CR (bare LF) in the request head")
    # A CR at the very end of an incomplete head may be followed by its LF later.
    if _BARE_CR.search(head, 0, len(head) - (end is None and head.endswith(b"\r"))):
        _refuse("CR not followed by LF in the request head")
    lines = head.split(b"\r\n")
    if not lines[0]:
        _refuse("empty request line")
    seen: dict[bytes, int] = {}
    for line in lines[1:]:
        if not line:
            break  # the empty line: end of the head
        if line[:1] in (b" ", b"\t"):
            _refuse(f"obsolete line folding (header line {_show(line)} starts with whitespace)")
        name, colon, value = line.partition(b":")
        if not colon:
            _refuse(f"header line {_show(line)} has no ':'")
        if not name:
            _refuse(f"header line {_show(line)} has no name")
        if _WHITESPACE.search(name):
            _refuse(f"whitespace in header name {_show(name)} (before the ':')")
        lower = name.lower()
        seen[lower] = seen.get(lower, 0) + 1
        pattern = _RAW_FRAMING.get(lower)
        if pattern is not None and not pattern.fullmatch(value):
            _check_framing([(lower, value)], b"1.1")  # says what is wrong, if it can
            _refuse(
                f"{name.decode('latin-1')}: {_show(value)} written oddly; "
                f"write '{name.decode('latin-1')}: value' with one space and nothing else"
            )
    for lower in (b"host", b"content-length", b"transfer-encoding"):
        if seen.get(lower, 0) > 1:
            _refuse(f"{lower.decode().title()} header given {seen[lower]} times")


# -- parsed request --------------------------------------------------------------------------------

_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TOKEN_LIST = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+([ \t]*,[ \t]*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*")
_DIGITS = re.compile(rb"[0-9]+")
_SCHEME_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_URL_SCHEMES = ("http", "https")
_FRAMING_NAMES = (b"content-length", b"transfer-encoding")
# What clients write as a host in a head: a DNS name (LDH and '_') or a bracketed IPv6 address.
# Percent-escapes, zone ids and other URL spellings are refused rather than normalised, so the
# upstream server cannot read a different name than the one judged.
_HOST = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)"
_HOST_RE = re.compile(_HOST)
_HOST_PORT_RE = re.compile(_HOST + r"(?::[0-9]*)?")


def _check_framing(headers: Sequence[tuple[bytes, bytes]], http_version: bytes) -> None:
    lengths = [v.strip(b" \t") for n, v in headers if n == b"content-length"]
    codings = [v.strip(b" \t") for n, v in headers if n == b"transfer-encoding"]
    if lengths and codings:
        _refuse("both Content-Length and Transfer-Encoding (request smuggling)")
    if len(lengths) > 1:
        _refuse("Content-Length given more than once (refused even when the values agree)")
    if len(codings) > 1:
        _refuse("Transfer-Encoding given more than once")
    if lengths:
        if not _DIGITS.fullmatch(lengths[0]):
            _refuse(f"Content-Length {_show(lengths[0])} is not a decimal number")
        if len(lengths[0]) > _MAX_LENGTH_DIGITS:
            _refuse(f"Content-Length of {len(lengths[0])} digits", 413)
    if codings:
        if http_version == b"1.0":
            _refuse("Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1)")
        coding = codings[0]
        if coding.lower() != b"chunked":
            if _TOKEN_LIST.fullmatch(coding):
                _refuse(f"Transfer-Encoding {_show(coding)}: only 'chunked' is supported", 501)
            _refuse(f"Transfer-Encoding {_show(coding)} is malformed; only 'chunked' is accepted")


def _host_text(value: str, what: str) -> Host:
    try:
        return parse_host(value)
    except HostParseError as exc:
        _refuse(f"{what}: {exc}")


def _parse_host_header(value: bytes) -> tuple[Host, int | None]:
    text = value.strip(b" \t").decode("latin-1")
    if not text:
        _refuse("empty Host header")
    if text.count(":") > 1 and not text.startswith("["):
        _refuse(f"Host header {_show(text)}: an IPv6 address needs brackets")
    if not _HOST_PORT_RE.fullmatch(text):
        _refuse(f"Host header {_show(text)} is not host[:port] (a DNS name or an IP address)")
    try:
        target = parse_target(text)
    except HostParseError as exc:
        _refuse(f"Host header: {exc}")
    return target.host, target.port


def _same_host(a: Host, b: Host) -> bool:
    if isinstance(a, NameHost) and isinstance(b, NameHost):
        return a.name == b.name
    if isinstance(a, IPHost) and isinstance(b, IPHost):
        return a.address == b.address
    return False


def _host_str(host: Host) -> str:
    return host.name if isinstance(host, NameHost) else str(host.address)


def _agree(
    header: tuple[Host, int | None] | None, host: Host, port: int | None, default_port: int | None
) -> None:
    """A Host header must name what the target names (else: domain fronting)."""
    if header is None:
        return
    h_host, h_port = header
    if h_port is None:
        h_port = default_port
    if not _same_host(h_host, host) or (h_port is not None and h_port != port):
        shown = f"{_host_str(h_host)}:{h_port}" if h_port is not None else _host_str(h_host)
        _refuse(
            f"the Host header names {shown} but the target names {_host_str(host)}:{port} "
            "(domain fronting)"
        )


def _log_path(path: str) -> str:
    base, question, _ = path.partition("?")
    return base + "?…" if question else base


def _target(
    kind: TargetKind,
    scheme: str | None,
    host: Host | None,
    port: int | None,
    path: str,
    path_raw: bytes,
) -> RequestTarget:
    address = host.address if isinstance(host, IPHost) else None
    return RequestTarget(
        kind,
        scheme,
        None if host is None else _host_str(host),
        port,
        _log_path(path),
        path_raw,
        address,
    )


def _connect(text: str, host_header: tuple[Host, int | None] | None) -> RequestTarget:
    if "@" in text:
        _refuse(f"CONNECT target {_show(text)} has userinfo; write host:port")
    if "/" in text:
        _refuse(f"CONNECT target {_show(text)} is not host:port")
    if text.startswith("["):
        close = text.find("]")
        host_part, after = text[: close + 1], text[close + 1 :]
        sep, port_text = after[:1], after[1:]
        if close == -1 or sep != ":":
            _refuse(f"CONNECT target {_show(text)} is not [address]:port")
    else:
        host_part, sep, port_text = text.rpartition(":")
        if not sep:
            _refuse(f"CONNECT target {_show(text)} has no port; write host:port")
        if ":" in host_part:
            _refuse(f"CONNECT target {_show(text)}: an IPv6 address needs brackets")
    if not port_text.isascii() or not port_text.isdigit():
        _refuse(f"CONNECT target {_show(text)}: port {_show(port_text)} is not a number")
    digits = port_text.lstrip("0")
    if not digits or len(digits) > 5 or int(digits) > 65535:
        _refuse(f"CONNECT target {_show(text)}: port {port_text} is out of range (1-65535)")
    if not host_part:
        _refuse(f"CONNECT target {_show(text)} has no host")
    if not _HOST_RE.fullmatch(host_part):
        _refuse(f"CONNECT target {_show(text)}: {_show(host_part)} is not a DNS name or an IP")
    host = _host_text(host_part, "CONNECT target")
    port = int(digits)
    if host_header is not None and host_header[1] is None:
        host_header = (host_header[0], port)  # "Host: name" for "CONNECT name:443" is fine
    _agree(host_header, host, port, None)
    return _target("authority", None, host, port, "", b"")


def _absolute(
    text: str, host_header: tuple[Host, int | None] | None, http_version: bytes
) -> RequestTarget:
    scheme = text.partition("://")[0].lower()
    if scheme not in _URL_SCHEMES:
        _refuse(f"URL scheme {scheme!r} not supported; use http:// or https://")
    rest = text.partition("://")[2]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        _refuse(f"userinfo in the URL {_show(redact_path(text))}; send credentials in a header")
    if authority.count(":") > 1 and not authority.startswith("["):
        _refuse(f"URL {_show(redact_path(text))}: an IPv6 address needs brackets")
    if not _HOST_PORT_RE.fullmatch(authority):
        _refuse(f"URL {_show(redact_path(text))}: the host is not a DNS name or an IP address")
    try:
        parsed = parse_target(text)
    except HostParseError as exc:
        _refuse(f"URL: {exc}")
    if host_header is None and http_version != b"1.0":
        _refuse("missing Host header (HTTP/1.1 requires it)")
    _agree(host_header, parsed.host, parsed.port, DEFAULT_PORTS[scheme])
    if path.startswith("?") or not path:
        path = "/" + path
    return _target("absolute", scheme, parsed.host, parsed.port, path, path.encode("ascii"))


def judge_request(
    method: bytes,
    target: bytes,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    explicit_proxy: bool,
    http_version: bytes = b"1.1",
) -> RequestTarget:
    """Refuse a request head the proxy must not forward; else say where it goes.
    ``headers`` as h11 gives them (any case accepted); ``explicit_proxy`` for the HTTP proxy
    port outside any tunnel, False for transparent and inspected-TLS requests."""
    if http_version not in (b"1.0", b"1.1"):
        _refuse(f"HTTP/{http_version.decode('latin-1')} not supported", 505)
    if not _TOKEN.fullmatch(method):
        _refuse(f"method {_show(method)} is not a token")
    upper = method.upper()
    if upper in (b"TRACE", b"TRACK"):
        _refuse(f"{upper.decode()} is not allowed (it echoes credentials back)", 405)
    lowered = [(n.lower(), v) for n, v in headers]
    for name, _ in lowered:
        # CGI-style servers read Transfer_Encoding as Transfer-Encoding; the proxy would not.
        alias = name.replace(b"_", b"-")
        if alias != name and alias in _FRAMING_NAMES:
            _refuse(f"header {_show(name)} reads as {alias.decode()} to some servers")
    _check_framing(lowered, http_version)
    hosts = [v for n, v in lowered if n == b"host"]
    if len(hosts) > 1:
        _refuse(f"Host header given {len(hosts)} times")
    host_header = _parse_host_header(hosts[0]) if hosts else None
    for name, value in lowered:
        if name == b"upgrade" and b"h2c" in [t.strip(b" \t") for t in value.lower().split(b",")]:
            _refuse("Upgrade: h2c refused (the upgraded connection would bypass the proxy)")
    try:
        text = target.decode("ascii")
    except UnicodeDecodeError:
        _refuse(f"request target {_show(target)} is not ASCII")
    if not text or any(c <= " " or c == "\x7f" for c in text):
        _refuse(f"request target {_show(text)} is empty or has spaces or control characters")
    if "#" in text:
        _refuse(f"request target {_show(redact_path(text))} has a fragment ('#')")

    if upper == b"CONNECT":
        if not explicit_proxy:
            _refuse("CONNECT is only for the explicit proxy", 405)
        return _connect(text, host_header)
    if text == "*":
        if upper != b"OPTIONS":
            _refuse("the '*' target is only for OPTIONS")
        if explicit_proxy:
            _refuse("a proxy request needs an absolute URL")
        if host_header is None:
            _refuse("missing Host header")
        return _target("asterisk", None, host_header[0], host_header[1], "*", b"*")
    if text.startswith("/"):
        if explicit_proxy:
            _refuse("a proxy request needs an absolute URL (http://host/path) or CONNECT")
        if host_header is None:
            _refuse("missing Host header")
        return _target("origin", None, host_header[0], host_header[1], text, target)
    if _SCHEME_PREFIX.match(text):
        return _absolute(text, host_header, http_version)
    _refuse(
        f"request target {_show(redact_path(text))} is none of /path, an absolute URL, "
        "host:port (CONNECT) or * (OPTIONS)"
    )


def redact_path(target: str) -> str:
    """A target fit for logs: query values become ``…``, a parameter without ``=`` becomes
    ``…`` whole, userinfo and fragment are dropped. Secrets in the path itself are not found."""
    text = target.partition("#")[0]
    match = _SCHEME_PREFIX.match(text)
    if match is not None:
        rest = text[match.end() :]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
        text = match.group() + rest[:cut].rpartition("@")[2] + rest[cut:]
    path, question, query = text.partition("?")
    if not question:
        return path
    parts = []
    for item in query.split("&"):
        name, equals, _ = item.partition("=")
        parts.append(f"{name}=…" if equals else ("…" if item else ""))
    return f"{path}?{'&'.join(parts)}"
