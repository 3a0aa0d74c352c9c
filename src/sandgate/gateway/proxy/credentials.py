"""Placeholder credentials: the sandbox holds a placeholder, the gateway the real value.

Pure logic: what a request's headers become on their way out, and whether a request carries a
placeholder to a host that is not its own (exfiltration). The real value is read by the gateway
from an environment variable or a root-only file, lives in a ``Secret`` whose ``repr`` hides it,
and never enters an event, a log line or an error message.

Rules (issue 3, part 5):
- only on inspected TLS requests to one of the secret's hosts is the placeholder replaced, and
  only in headers that carry credentials (``CREDENTIAL_HEADERS``, any case);
- the client's own credential headers for that host (ones without the placeholder) are dropped,
  so a sandbox cannot smuggle a credential of its own past the swap;
- never on plaintext HTTP: there the placeholder is refused even for its own host;
- a placeholder bound for any other host, anywhere in the request head or body, is refused and
  reported as an exfiltration attempt.
"""

from __future__ import annotations

import os
import secrets as _random
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.errors import SandgateError
from sandgate.gateway.proxy.httphead import CREDENTIAL_HEADERS
from sandgate.policy.model import SecretSpec
from sandgate.policy.patterns import DomainPattern, parse_pattern


@dataclass(frozen=True)
class Secret:
    name: str
    hosts: tuple[DomainPattern, ...]
    placeholder: str
    value: str = field(repr=False)
    placeholder_env: str | None = None
    placeholder_file: str | None = None

    def serves(self, host: str) -> bool:
        return any(p.matches(host) for p in self.hosts)

    def __repr__(self) -> str:
        return f"Secret(name={self.name!r}, placeholder={self.placeholder!r}, value=<hidden>)"


def load_secrets(specs: Iterable[SecretSpec], session: str | None = None) -> tuple[Secret, ...]:
    """Read each secret's real value (gateway side) and give it a placeholder for the sandbox."""
    out: list[Secret] = []
    for spec in specs:
        value = read_value(spec.name, spec.value)
        placeholder = spec.placeholder or make_placeholder(spec.name, len(value))
        if value in placeholder or placeholder in value:
            raise SandgateError(
                f"secret {spec.name!r}: the placeholder overlaps the real value",
                "choose another placeholder",
            )
        out.append(
            Secret(
                spec.name,
                tuple(parse_pattern(h) for h in spec.hosts),
                placeholder,
                value,
                spec.placeholder_env,
                spec.placeholder_file,
            )
        )
    return tuple(out)


def make_placeholder(name: str, length: int) -> str:
    """A random placeholder, as long as the real value when that is long enough: then swapping
    one for the other never changes a message's length (Content-Length stays true)."""
    prefix = f"sg-{name[:12]}-"
    size = max(length, len(prefix) + 24)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return prefix + "".join(_random.choice(alphabet) for _ in range(size - len(prefix)))


def echoed_by(secrets: Iterable[Secret], host: str | None) -> tuple[Secret, ...]:
    """The secrets a response from ``host`` is redacted for: the ones the gateway sends there.
    A host none of them serves never got a real value from sandgate. If it knows one anyway, a
    passthrough tunnel (never read) would carry it just as well, so reading that host's bodies
    would buy nothing and cost the kernel's splice (``http1._direct_body``)."""
    return tuple(s for s in secrets if host is not None and s.serves(host))


def same_lengths(secrets: Iterable[Secret]) -> bool:
    return all(len(s.placeholder) == len(s.value) for s in secrets)


def read_value(name: str, source: str) -> str:
    kind, _, where = source.partition(":")
    if kind == "env":
        value = os.environ.get(where)
        if not value:
            raise SandgateError(
                f"secret {name!r}: the gateway's environment has no {where}",
                f"export {where}=... in the shell that starts the gateway",
            )
        return value
    path = Path(where)
    try:
        info = path.stat()
    except OSError as exc:
        raise SandgateError(f"secret {name!r}: cannot read {where}: {exc.strerror}") from exc
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SandgateError(
            f"secret {name!r}: {where} has mode {stat.S_IMODE(info.st_mode):04o}: its group or "
            "others may read or change it",
            f"chmod 600 {where} (and chown root)",
        )
    value = path.read_text().strip()
    if not value:
        raise SandgateError(f"secret {name!r}: {where} is empty")
    return value


@dataclass(frozen=True)
class HeaderVerdict:
    headers: list[tuple[bytes, bytes]]
    injected: tuple[str, ...] = ()  # names of the secrets swapped in
    dropped: tuple[str, ...] = ()  # credential headers of the client's own that were removed
    exfiltration: str | None = None  # name of the secret whose placeholder went astray


def rewrite_headers(
    headers: list[tuple[bytes, bytes]],
    host: str,
    secrets: tuple[Secret, ...],
    *,
    tls: bool,
    target: bytes = b"",
) -> HeaderVerdict:
    """The headers to send upstream for a request to ``host``; or an exfiltration verdict."""
    mine = [s for s in secrets if s.serves(host)] if tls else []
    strangers = [s for s in secrets if s not in mine]
    for s in strangers:
        needle = s.placeholder.encode()
        if needle in target or any(needle in v or needle in n for n, v in headers):
            return HeaderVerdict(headers, exfiltration=s.name)
    if not mine:
        return HeaderVerdict(headers)
    out: list[tuple[bytes, bytes]] = []
    injected: list[str] = []
    dropped: list[str] = []
    for name, value in headers:
        lower = name.lower().decode("latin-1")
        if lower not in CREDENTIAL_HEADERS:
            out.append((name, value))
            continue
        swapped = value
        for s in mine:
            if s.placeholder.encode() in swapped:
                swapped = swapped.replace(s.placeholder.encode(), s.value.encode())
                injected.append(s.name)
        if swapped is value:
            dropped.append(lower)  # the client's own credential for this host: not passed on
        else:
            out.append((name, swapped))
    return HeaderVerdict(out, tuple(injected), tuple(dropped))


class BodyScanner:
    """Finds a placeholder in a streamed body, across chunk boundaries, without holding it."""

    def __init__(self, secrets: Iterable[Secret]) -> None:
        self._needles = {s.name: s.placeholder.encode() for s in secrets}
        self._keep = max((len(n) for n in self._needles.values()), default=1) - 1
        self._tail = b""

    def feed(self, chunk: bytes) -> str | None:
        """Name of a secret whose placeholder appears, or None."""
        if not self._needles:
            return None
        window = self._tail + chunk
        for name, needle in self._needles.items():
            if needle in window:
                return name
        self._tail = window[-self._keep :] if self._keep else b""
        return None


def sandbox_view(secrets: Iterable[Secret]) -> dict[str, object]:
    """What the sandbox may see: placeholders, and where to put them. Never the values."""
    return {
        s.name: {"placeholder": s.placeholder, "env": s.placeholder_env, "file": s.placeholder_file}
        for s in secrets
    }


class Redactor:
    """Puts the placeholder back where a response would show a real value (a server echoing the
    key must not hand it to the sandbox). Streams: it holds back only a tail that could be the
    start of a secret, so a response that contains none is never delayed (SSE stays live)."""

    def __init__(self, secrets: Iterable[Secret]) -> None:
        self._pairs = [(s.value.encode(), s.placeholder.encode()) for s in secrets if s.value]
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._pairs:
            return chunk
        data = self._held + chunk
        for value, placeholder in self._pairs:
            data = data.replace(value, placeholder)
        keep = max((_prefix_overlap(data, value) for value, _ in self._pairs), default=0)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep] if keep else data

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held


def _prefix_overlap(data: bytes, value: bytes) -> int:
    """Length of the longest tail of ``data`` that is a proper prefix of ``value``."""
    for n in range(min(len(value) - 1, len(data)), 0, -1):
        if data.endswith(value[:n]):
            return n
    return 0


def redact_headers(
    headers: list[tuple[bytes, bytes]], secrets: Iterable[Secret]
) -> list[tuple[bytes, bytes]]:
    pairs = [(s.value.encode(), s.placeholder.encode()) for s in secrets if s.value]
    out = []
    for name, value in headers:
        shown = value
        for real, placeholder in pairs:
            shown = shown.replace(real, placeholder)
        out.append((name, shown))
    return out
