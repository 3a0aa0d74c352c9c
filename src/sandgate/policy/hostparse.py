"""Host and target spellings, read the way clients read them.

A gateway that reads ``0x7f.1`` as a name while curl connects to 127.0.0.1 has
been bypassed. So a host is parsed like the WHATWG URL standard's host parser,
which agrees with ``inet_aton`` on numeric forms (decimal, hex, octal, per-part
bases, the short forms ``127.1`` and ``10.1.1``) and maps Unicode first, so
full-width digits and ideographic dots become ASCII before the IPv4 check:

1. ``[...]`` is an IPv6 literal; a bare text with ``:`` is one too.
2. Percent-escapes are decoded, then UTS-46 mapping (the ``idna`` package) folds
   case, width and compatibility forms.
3. If the last label is a number (``1``, ``0x1``, ``0x``), the whole text must
   be an IPv4 address; anything else (``256.1.1.1``, ``example.123``) is an
   error, never a name.
4. Otherwise it is a name: ASCII labels of ``a-z 0-9 - _``, Unicode labels to
   punycode (IDNA 2008, so emoji labels are refused), at most 63 octets a label
   and 253 a name, one trailing dot dropped.

Where clients disagree, the reading that can name an address wins or the text
is refused: both end up denied, never read as a harmless name. Whitespace and
control characters are refused outright, though browsers strip some of them.

Pure: no sockets, no DNS.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from urllib.parse import unquote_to_bytes

import idna

__all__ = [
    "DEFAULT_PORTS",
    "Host",
    "HostParseError",
    "IPHost",
    "NameHost",
    "Target",
    "is_normal_name",
    "parse_host",
    "parse_port",
    "parse_target",
]

# Longer than any name (253) even percent-encoded; also keeps int() away from its
# 4300-digit limit on the numeric paths.
_MAX_TEXT = 2048
_MAX_NAME = 253
_MAX_LABEL = 63
_IPV4_FORM = "a dotted quad like 192.0.2.1"
_NAME_FORM = "a name like api.example.com (letters, digits, '-', '_')"
_ASCII_LABEL = re.compile(r"[a-z0-9_-]+")
# Labels that each match _ASCII_LABEL and are at most _MAX_LABEL long, in one match. Such a
# name without punycode (xn--) is in normal form already: parse_host returns it as it is, so
# it may skip the steps (100,000 policy rules, issue 11).
_NORMAL_LABELS = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")
_ZONE = re.compile(r"[A-Za-z0-9._~-]+")  # RFC 6874 unreserved characters
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_DIGITS = {
    8: frozenset("01234567"),
    10: frozenset("0123456789"),
    16: frozenset("0123456789abcdefABCDEF"),
}

DEFAULT_PORTS: dict[str, int] = {
    "http": 80,
    "https": 443,
    "ws": 80,
    "wss": 443,
    "ftp": 21,
    "ftps": 990,
    "ssh": 22,
    "sftp": 22,
    "git": 9418,
    "gopher": 70,
    "telnet": 23,
    "dict": 2628,
    "ldap": 389,
    "ldaps": 636,
    "smtp": 25,
    "imap": 143,
    "imaps": 993,
    "pop3": 110,
    "rtsp": 554,
    "tftp": 69,
    "redis": 6379,
    "mqtt": 1883,
    "socks4": 1080,
    "socks5": 1080,
    "socks5h": 1080,
}


class HostParseError(ValueError):
    """A host or target that no reading makes valid. Says what was wrong (``problem``)
    and what a valid form looks like (``hint``)."""

    def __init__(self, text: str, problem: str, hint: str) -> None:
        super().__init__(f"{text!r}: {problem}; {hint}")
        self.text = text
        self.problem = problem
        self.hint = hint


@dataclass(frozen=True)
class IPHost:
    """An address literal. ``spelling`` is the text it was read from; ``zone`` the
    IPv6 zone id (``eth0`` in ``fe80::1%eth0``), which is dropped from ``address``."""

    address: IPv4Address | IPv6Address
    spelling: str
    zone: str | None = None


@dataclass(frozen=True)
class NameHost:
    """A DNS name in normal form: lower-case ASCII (punycode), no trailing dot."""

    name: str

    def __post_init__(self) -> None:
        _check_normal_name(self.name)


Host = IPHost | NameHost


@dataclass(frozen=True)
class Target:
    """A host with the port and scheme it was given with. ``port`` is the explicit port,
    else the scheme's default, else None; ``text`` is the original text."""

    host: Host
    port: int | None
    scheme: str | None
    text: str

    def __post_init__(self) -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise HostParseError(str(self.port), "port out of range", "ports are 1 to 65535")


def _check_chars(text: str, what: str, spelling: str | None = None) -> None:
    shown = text if spelling is None else spelling
    if not text:
        raise HostParseError(text, f"empty {what}", f"give {_NAME_FORM} or {_IPV4_FORM}")
    if len(text) > _MAX_TEXT:
        raise HostParseError(
            text[:40] + "...",
            f"{what} longer than {_MAX_TEXT} characters",
            f"names are at most {_MAX_NAME} octets",
        )
    if text.isascii() and text.isprintable() and " " not in text:
        return  # no ASCII whitespace or control character (the loop below, 50 times faster)
    for ch in text:
        if ch.isspace() or unicodedata.category(ch) == "Cc":
            raise HostParseError(
                shown,
                f"whitespace or control character {ch!r} in {what}",
                "remove it; clients disagree on whether to strip it",
            )


def parse_port(text: str, spelling: str | None = None) -> int:
    """Decimal port 1..65535 (leading zeros allowed, as URL parsers do)."""
    shown = text if spelling is None else spelling
    if not text:
        raise HostParseError(shown, "empty port after ':'", "write host:port, port 1 to 65535")
    if not (text.isascii() and text.isdigit()):
        raise HostParseError(
            shown, f"port {text!r} is not a decimal number", "write host:port, port 1 to 65535"
        )
    port = int(text)
    if not 1 <= port <= 65535:
        raise HostParseError(shown, f"port {port} is out of range", "ports are 1 to 65535")
    return port


def _ipv4_number(part: str) -> int | None:
    """One part of a numeric IPv4 spelling: 0x/0X hex, leading-0 octal, else decimal.
    ``0x`` alone is 0, as in the URL standard. None if not a number."""
    radix = 10
    if len(part) >= 2 and part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
        if not part:
            return 0
    elif len(part) >= 2 and part[0] == "0":
        part, radix = part[1:], 8
    if not part or not _DIGITS[radix].issuperset(part):
        return None  # int() alone would accept '_', '+', ' ' and non-ASCII digits
    return int(part, radix)


def _ends_in_number(text: str) -> bool:
    parts = text.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    last = parts[-1]
    return bool(last) and (_DIGITS[10].issuperset(last) or _ipv4_number(last) is not None)


def _parse_ipv4(text: str, spelling: str) -> IPv4Address:
    parts = text.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()  # one trailing dot, as on a name
    if len(parts) > 4:
        raise HostParseError(
            spelling,
            f"{len(parts)} numeric parts; an IPv4 address has at most 4",
            f"write {_IPV4_FORM}",
        )
    numbers: list[int] = []
    for i, part in enumerate(parts, 1):
        number = _ipv4_number(part)
        if number is None:
            raise HostParseError(
                spelling,
                f"part {i} ({part!r}) is not a decimal, 0x hex or "
                "0-prefixed octal number, and a name cannot end in a number",
                f"write {_IPV4_FORM} or {_NAME_FORM}",
            )
        numbers.append(number)
    for i, number in enumerate(numbers[:-1], 1):
        if number > 255:
            raise HostParseError(spelling, f"part {i} is {number}, over 255", f"write {_IPV4_FORM}")
    # The last part fills the remaining bytes: 127.1 is 127.0.0.1, 10.1.1 is 10.1.0.1.
    room = 256 ** (5 - len(numbers))
    if numbers[-1] >= room:
        raise HostParseError(
            spelling, f"last part is {numbers[-1]}, over {room - 1}", f"write {_IPV4_FORM}"
        )
    value = numbers[-1]
    for i, number in enumerate(numbers[:-1]):
        value += number << (8 * (3 - i))
    return IPv4Address(value)


def _parse_ipv6(text: str, spelling: str, bracketed: bool) -> IPHost:
    addr_text, percent, zone = text.partition("%")
    if percent:
        if bracketed and len(zone) > 2 and zone.startswith("25"):
            zone = zone[2:]  # RFC 6874: in a URL the '%' of a zone is written %25
        if not _ZONE.fullmatch(zone):
            raise HostParseError(
                spelling,
                f"IPv6 zone id {zone!r} is empty or has odd characters",
                "write fe80::1%eth0 (letters, digits, '.', '_', '~', '-')",
            )
    try:
        address = IPv6Address(addr_text)
    except ValueError as exc:
        hint = "put an IPv6 address in brackets: [2001:db8::1]:443"
        if not bracketed and addr_text.count(":") == 1:
            hint = "a host with a port is a target: parse it with parse_target"
        raise HostParseError(spelling, f"not an IPv6 address ({exc})", hint) from exc
    return IPHost(address, spelling, zone if percent else None)


def _percent_decode(text: str) -> str:
    if "%" not in text:
        return text
    if re.search(r"%(?![0-9A-Fa-f]{2})", text):
        raise HostParseError(
            text, "'%' not followed by two hex digits", "percent-escape as %41, or drop the '%'"
        )
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HostParseError(
            text, "percent-escapes do not decode as UTF-8", f"write {_NAME_FORM}"
        ) from exc


def _to_ascii_label(label: str, spelling: str) -> str:
    if label.isascii():
        if not _ASCII_LABEL.fullmatch(label):
            bad = next(ch for ch in label if not _ASCII_LABEL.fullmatch(ch))
            raise HostParseError(
                spelling, f"{bad!r} is not allowed in a name", f"write {_NAME_FORM}"
            )
        if label.startswith("xn--"):
            try:
                idna.ulabel(label)  # refuses bogus or non-canonical punycode
            except idna.IDNAError as exc:
                raise HostParseError(
                    spelling,
                    f"label {label!r} is not valid punycode ({exc})",
                    "write the Unicode form or a valid xn-- label",
                ) from exc
        return label
    try:
        return idna.alabel(label).decode("ascii")
    except idna.IDNAError as exc:
        raise HostParseError(
            spelling,
            f"label {label!r} is not a valid IDNA label ({exc})",
            f"write {_NAME_FORM} or a valid Unicode name",
        ) from exc


def _parse_name(text: str, spelling: str) -> str:
    name = text[:-1] if text.endswith(".") else text
    if not name:
        raise HostParseError(spelling, "no labels", f"write {_NAME_FORM}")
    labels = name.split(".")
    if "" in labels:
        raise HostParseError(
            spelling, "empty label (a leading dot or two dots in a row)", f"write {_NAME_FORM}"
        )
    ascii_labels = [_to_ascii_label(label, spelling) for label in labels]
    for label in ascii_labels:
        if len(label) > _MAX_LABEL:
            raise HostParseError(
                spelling, f"label of {len(label)} octets, over {_MAX_LABEL}", "shorten the label"
            )
    result = ".".join(ascii_labels)
    if len(result) > _MAX_NAME:
        raise HostParseError(
            spelling, f"name of {len(result)} octets, over {_MAX_NAME}", "shorten the name"
        )
    return result


def _check_normal_name(name: str) -> None:
    if (
        not name
        or len(name) > _MAX_NAME
        or not _NORMAL_LABELS.fullmatch(name)
        or _ends_in_number(name)
    ):
        raise HostParseError(
            name, "not a name in normal form", "build NameHost with parse_host, which normalises it"
        )


def parse_host(text: str) -> Host:
    """Read a host spelling: an IPv4 or IPv6 literal in any form clients accept, or a name.

    >>> parse_host("0x7f.1").address
    IPv4Address('127.0.0.1')
    >>> parse_host("Bücher.DE.")
    NameHost(name='xn--bcher-kva.de')
    """
    if is_normal_name(text):
        return NameHost(text)  # what _parse_host makes of a name in normal form
    return _parse_host(text)


def is_normal_name(text: str) -> bool:
    """Is ``text`` a name in normal form, which ``parse_host`` reads as it is written?"""
    return (
        len(text) <= _MAX_NAME
        and _NORMAL_LABELS.fullmatch(text) is not None
        and "xn--" not in text
        and not _ends_in_number(text)
    )


def _parse_host(text: str) -> Host:
    _check_chars(text, "host")
    if text.startswith("["):
        if not text.endswith("]"):
            raise HostParseError(text, "'[' without a closing ']'", "write [2001:db8::1]")
        return _parse_ipv6(text[1:-1], text, bracketed=True)
    if ":" in text:
        return _parse_ipv6(text, text, bracketed=False)
    decoded = _percent_decode(text)
    _check_chars(decoded, "host (after percent-decoding)", text)
    try:
        # No transitional argument: idna deprecated it; non-transitional is the default.
        mapped = idna.uts46_remap(decoded, std3_rules=False)
    except idna.IDNAError as exc:
        raise HostParseError(
            text, f"character not allowed in a host name ({exc})", f"write {_NAME_FORM}"
        ) from exc
    if ":" in mapped or "[" in mapped or "]" in mapped:
        raise HostParseError(
            text,
            "':' or brackets in a host after decoding",
            "IPv6 literals are written plainly, not escaped: [2001:db8::1]",
        )
    if _ends_in_number(mapped):
        return IPHost(_parse_ipv4(mapped, text), text)
    return NameHost(_parse_name(mapped, text))


def _split_host_port(hostport: str, spelling: str, in_url: bool) -> tuple[str, int | None]:
    if hostport.startswith("["):
        close = hostport.find("]")
        if close == -1:
            raise HostParseError(spelling, "'[' without a closing ']'", "write [2001:db8::1]:443")
        host, rest = hostport[: close + 1], hostport[close + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise HostParseError(spelling, f"{rest!r} after ']'", "write [2001:db8::1]:443")
        return host, parse_port(rest[1:], spelling)
    colons = hostport.count(":")
    if colons > 1:
        if in_url:
            raise HostParseError(
                spelling,
                "IPv6 address without brackets in a URL",
                "write http://[2001:db8::1]:8080/",
            )
        return hostport, None  # a bare IPv6 address, which cannot carry a port
    if colons == 1:
        host, _, port = hostport.partition(":")
        return host, parse_port(port, spelling)
    return hostport, None


def _parse_url(text: str) -> Target:
    scheme, _, rest = text.partition("://")
    if not _SCHEME.fullmatch(scheme):
        raise HostParseError(
            text, f"{scheme!r} is not a URL scheme", "write https://host:port/path"
        )
    scheme = scheme.lower()
    # The authority ends at the first '/', '?' or '#'.
    end = min((i for i in (rest.find(c) for c in "/?#") if i != -1), default=len(rest))
    authority = rest[:end]
    if "\\" in authority:
        # Browsers end the host at a backslash, RFC 3986 parsers (curl, urllib, Go) do not,
        # so http://a\@b/ names a to one client and b to another: refuse it.
        raise HostParseError(
            text,
            "backslash in the URL's authority, read differently by browsers and other clients",
            "write http://host:port/path with '/'",
        )
    # URL parsers take everything up to the last '@' as userinfo.
    hostport = authority.rpartition("@")[2]
    if not hostport:
        raise HostParseError(text, "URL has no host", "write https://host:port/path")
    host_text, port = _split_host_port(hostport, text, in_url=True)
    if not host_text:
        raise HostParseError(text, "URL has no host", "write https://host:port/path")
    host = parse_host(host_text)
    return Target(host, port if port is not None else DEFAULT_PORTS.get(scheme), scheme, text)


def parse_target(text: str) -> Target:
    """Read ``host``, ``host:port``, ``[v6]``, ``[v6]:port``, a bare IPv6 address (no port),
    or a URL ``scheme://[userinfo@]host[:port][/...]`` (port defaults by scheme)."""
    _check_chars(text, "target")
    if "://" in text:
        return _parse_url(text)
    host_text, port = _split_host_port(text, text, in_url=False)
    if not host_text:
        raise HostParseError(text, "no host before ':'", "write host:port, e.g. example.com:443")
    return Target(parse_host(host_text), port, None, text)
