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
from sandgate.events.redact import redact_target
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
    "Aim",
    "RequestTarget",
    "TargetKind",
    "aimed_at",
    "check_head",
    "h11_message",
    "head_end",
    "judge_request",
    "redact_target",
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


def _show_target(value: bytes | str) -> str:
    """A target in an error message: always through ``redact_target``."""
    return _show(redact_target(value.decode("latin-1") if isinstance(value, bytes) else value))


def _show_name(name: bytes) -> str:
    return repr(name.decode("latin-1")) if name else "the request line"


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
    last = b""  # the header before a line that is wrong: its name, never its value
    for line in lines[1:]:
        if not line:
            break  # the empty line: end of the head
        if line[:1] in (b" ", b"\t"):
            _refuse(
                f"obsolete line folding (the line after {_show_name(last)} starts with whitespace)"
            )
        name, colon, value = line.partition(b":")
        if not colon:
            _refuse(f"a header line of {len(line)} bytes after {_show_name(last)} has no ':'")
        if not name:
            _refuse("a header line has no name (it starts with ':')")
        if _WHITESPACE.search(name):
            _refuse(f"whitespace in header name {_show(name)} (before the ':')")
        lower = name.lower()
        last = name
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
        redact_target(path),
        path_raw,
        address,
    )


def _connect(text: str, host_header: tuple[Host, int | None] | None) -> RequestTarget:
    if "@" in text:
        _refuse(f"CONNECT target {_show_target(text)} has userinfo; write host:port")
    if "/" in text:
        _refuse(f"CONNECT target {_show_target(text)} is not host:port")
    if text.startswith("["):
        close = text.find("]")
        host_part, after = text[: close + 1], text[close + 1 :]
        sep, port_text = after[:1], after[1:]
        if close == -1 or sep != ":":
            _refuse(f"CONNECT target {_show_target(text)} is not [address]:port")
    else:
        host_part, sep, port_text = text.rpartition(":")
        if not sep:
            _refuse(f"CONNECT target {_show_target(text)} has no port; write host:port")
        if ":" in host_part:
            _refuse(f"CONNECT target {_show_target(text)}: an IPv6 address needs brackets")
    if not port_text.isascii() or not port_text.isdigit():
        _refuse(f"CONNECT target {_show_target(text)}: port {_show(port_text)} is not a number")
    digits = port_text.lstrip("0")
    if not digits or len(digits) > 5 or int(digits) > 65535:
        _refuse(f"CONNECT target {_show_target(text)}: port {port_text} is out of range (1-65535)")
    if not host_part:
        _refuse(f"CONNECT target {_show_target(text)} has no host")
    if not _HOST_RE.fullmatch(host_part):
        _refuse(
            f"CONNECT target {_show_target(text)}: {_show(host_part)} is not a DNS name or an IP"
        )
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
        _refuse(f"userinfo in the URL {_show_target(text)}; send credentials in a header")
    if authority.count(":") > 1 and not authority.startswith("["):
        _refuse(f"URL {_show_target(text)}: an IPv6 address needs brackets")
    if not _HOST_PORT_RE.fullmatch(authority):
        _refuse(f"URL {_show_target(text)}: the host is not a DNS name or an IP address")
    try:
        parsed = parse_target(text)
    except HostParseError as exc:
        _refuse(f"URL {_show_target(text)}: {exc.problem}; {exc.hint}")
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
        _refuse(f"request target {_show_target(target)} is not ASCII")
    if not text or any(c <= " " or c == "\x7f" for c in text):
        _refuse(f"request target {_show_target(text)} is empty or has spaces or control characters")
    if "#" in text:
        _refuse(f"request target {_show_target(text)} has a fragment ('#')")

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
        f"request target {_show_target(text)} is none of /path, an absolute URL, "
        "host:port (CONNECT) or * (OPTIONS)"
    )


@dataclass(frozen=True)
class Aim:
    """What a request head was aimed at, read best-effort from its raw bytes (for the record
    of a refusal). ``name`` is the host as written (normalised when it parses), ``address``
    set when that is an IP literal, ``path`` already redacted."""

    name: str | None = None
    port: int | None = None
    path: str | None = None
    address: str | None = None


_PRINTABLE = re.compile(r"[^!-~]")


def aimed_at(raw: bytes) -> Aim:
    """Read a request head's target as far as it can be read: the request line's target, the
    first Host header, a CONNECT authority. Never raises, whatever the bytes; the head may be
    incomplete or malformed (that is why it is being refused)."""
    end = raw.find(b"\n\r\n")
    head = raw[: min(MAX_HEAD_BYTES, len(raw) if end == -1 else end)].decode("latin-1")
    lines = [line.rstrip("\r") for line in head.split("\n")]
    parts = lines[0].split()
    target = parts[1] if len(parts) >= 2 else ""
    host_value = ""
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip(" \t").lower() == "host":
            host_value = value.strip(" \t")
            break
    scheme = _SCHEME_PREFIX.match(target)
    default: int | None = None
    if scheme is not None:
        rest = target[scheme.end() :]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
        authority, path = rest[:cut], rest[cut:] or "/"
        default = DEFAULT_PORTS.get(scheme.group()[:-3].lower())
    elif target.startswith("/") or target == "*":
        authority, path = host_value, target
    else:  # CONNECT's authority form, or something that is none of the forms
        authority, path = (target or host_value), None
    host, port = _split_authority(authority.rpartition("@")[2])
    shown_path = None if path is None else redact_target(_clean(path, 200))
    if not host:
        return Aim(None, port or default, shown_path)
    try:
        parsed = parse_host(host)
    except HostParseError:
        return Aim(_clean(host.lower(), 253), port or default, shown_path)
    if isinstance(parsed, IPHost):
        return Aim(str(parsed.address), port or default, shown_path, str(parsed.address))
    return Aim(parsed.name, port or default, shown_path)


_BYTES_REPR = re.compile(r":? ?(?:bytearray\()?b['\"].*\Z", re.DOTALL)


def h11_message(exc: Exception) -> str:
    """An h11 error's message without the bytes it quotes (``illegal header line:
    bytearray(b'Authorization: ...')``): those may hold a credential or a query string."""
    return _BYTES_REPR.sub("", str(exc)) or type(exc).__name__


def _split_authority(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        close = text.find("]")
        host, after = (text, "") if close == -1 else (text[: close + 1], text[close + 1 :])
        port_text = after[1:] if after.startswith(":") else ""
    elif text.count(":") > 1:
        host, port_text = text, ""  # an IPv6 address without brackets: no port to be read
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            host, port_text = text, ""
    if port_text.isascii() and port_text.isdigit() and len(port_text) <= 5:
        port = int(port_text)
        return host, port if 0 < port < 65536 else None
    return host, None


def _clean(text: str, limit: int) -> str:
    """Printable ASCII only, and not too long: a log field, not a copy of the bytes."""
    text = _PRINTABLE.sub("?", text)
    return text if len(text) <= limit else text[:limit] + "…"
