"""The proxy's fast paths agree with the slow one: real sockets on loopback, the proxy's own code.

Plain HTTP: a Content-Length response body nobody needs to read is spliced in the kernel
(splice.py), everything else goes through h11; inspected TLS runs on memory BIOs (tlsio.py)
with writes held and flushed per step. Each test sends through ``http1.serve`` exactly what a
guest would and compares bytes, verdicts and what the upstream received.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandgate.events.schema import Event
from sandgate.gateway.proxy import http1, splice
from sandgate.gateway.proxy.ca import make_ca
from sandgate.gateway.proxy.credentials import Secret
from sandgate.gateway.proxy.flow import ProxyGuest, Record
from sandgate.gateway.proxy.server import Proxy
from sandgate.gateway.proxy.tlsio import Stream, TlsStream
from sandgate.net.compile import GuestLink
from sandgate.policy.load import parse_policy
from sandgate.policy.patterns import parse_pattern

NAME = "up.test"
LOOP = ipaddress.IPv4Address("127.0.0.1")
BIG = 3 * 1024 * 1024 + 17  # spliced (>= SPLICE_MIN), an odd length
REAL = "sk-real-" + "r" * 40
SECRET = Secret("api", (parse_pattern(NAME),), "sg-api-" + "p" * 41, REAL)
POLICY = parse_policy(
    b"""
[profiles.open]
internet = "open"
allow = [ { host = "127.0.0.1" } ]
inspect = ["up.test"]

[profiles.narrow]
internet = "allowlist"
allow = [ { host = "127.0.0.1" }, { domain = "up.test", port = 80, http = ["GET /cl/*"] } ]
""",
    "t.toml",
)


def pattern(n: int) -> bytes:
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def with_key(n: int, key: str) -> bytes:
    """``pattern(n)`` with ``key`` written over it every 100,003 bytes (and at the very end)."""
    body = bytearray(pattern(n))
    for at in [*range(7, n - len(key), 100_003), n - len(key)]:
        body[at : at + len(key)] = key.encode()
    return bytes(body)


# -- the upstream: a small HTTP/1.1 server that records each request head --------------------


@dataclass
class Upstream:
    listener: socket.socket
    tls: ssl.SSLContext | None = None
    heads: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True)
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                self.heads.append(head)
                if not self.answer(conn, head):
                    return

    def answer(self, conn: socket.socket, head: bytes) -> bool:
        path = head.split(b" ")[1].decode()
        kind, _, size = path.strip("/").partition("/")
        n = int(size or 0)
        body = pattern(n)
        if kind == "cl":
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n + body)
        elif kind == "chunked":
            out = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            for i in range(0, n, 70001):
                part = body[i : i + 70001]
                out += b"%x\r\n%s\r\n" % (len(part), part)
            conn.sendall(out + b"0\r\n\r\n")
        elif kind == "close":
            conn.sendall(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + body)
            return False
        elif kind == "reset":  # promises n bytes, sends half, then a reset
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n + body[: n // 2])
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        elif kind == "key":  # a big body that shows the real key here and there
            body = with_key(n, REAL)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n + body)
        elif kind == "echo":  # the Authorization header it got, as the body
            auth = re.search(rb"(?im)^authorization: *(.*)$", head)
            got = auth.group(1) if auth else b"-"
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(got) + got)
        else:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        return True


@contextlib.contextmanager
def upstream(tls: ssl.SSLContext | None = None) -> Iterator[Upstream]:
    up = Upstream(socket.create_server(("127.0.0.1", 0)), tls)
    threading.Thread(target=up.run, daemon=True).start()
    try:
        yield up
    finally:
        up.listener.close()


# -- the proxy side ---------------------------------------------------------------------------


def guest(profile: str, secrets: tuple[Secret, ...] = ()) -> ProxyGuest:
    link = GuestLink(
        0, "g0", ipaddress.IPv4Network("10.9.0.0/30"), ipaddress.IPv4Address("10.9.0.1"),
        ipaddress.IPv4Address("10.9.0.2"), "02:00:00:00:00:01",
    )  # fmt: skip
    return ProxyGuest(link, None, POLICY.profile(profile), secrets)


_serving: list[threading.Thread] = []


def settle() -> None:
    """Wait for the proxy's threads to finish (their last event is emitted as they end)."""
    while _serving:
        _serving.pop().join(20)


def proxied(handle: Callable[[socket.socket, tuple[str, int]], None]) -> socket.socket:
    """A client socket whose other end ``handle`` serves on a thread of its own."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, peer = listener.accept()
    listener.close()
    thread = threading.Thread(target=lambda: _guarded(handle, conn, peer), daemon=True)
    thread.start()
    _serving.append(thread)
    client.settimeout(20)
    return client


def _guarded(
    handle: Callable[[socket.socket, tuple[str, int]], None], conn: Any, peer: Any
) -> None:
    with conn:
        handle(conn, peer)


def plain(up: Upstream, g: ProxyGuest, events: list[Event]) -> socket.socket:
    def dial(address: str, port: int, tls_name: str | None) -> Stream:
        assert address == str(LOOP) and tls_name is None
        return socket.create_connection(("127.0.0.1", up.port), timeout=10)

    def handle(conn: socket.socket, peer: tuple[str, int]) -> None:
        ctx = http1.Ctx(
            guest=g, door="transparent", client=peer, original_dst=("127.0.0.1", 80),
            resolve=lambda name: [LOOP], dial=dial, emit=lambda key, e: events.append(e),
        )  # fmt: skip
        http1.serve(conn, ctx)

    return proxied(handle)


def read_response(sock: Any, buf: bytearray) -> tuple[bytes, bytes]:
    """One response (head, body) off ``sock``; ``buf`` keeps what follows it."""
    while b"\r\n\r\n" not in buf:
        _more(sock, buf)
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    del buf[:end]
    lower = head.lower()
    if m := re.search(rb"content-length: *(\d+)", lower):
        n = int(m.group(1))
        while len(buf) < n:
            _more(sock, buf)
        body = bytes(buf[:n])
        del buf[:n]
        return head, body
    if b"transfer-encoding: chunked" in lower:
        body = bytearray()
        while True:
            while b"\r\n" not in buf:
                _more(sock, buf)
            line_end = buf.index(b"\r\n")
            size = int(bytes(buf[:line_end]).split(b";")[0], 16)
            while len(buf) < line_end + 2 + size + 2:
                _more(sock, buf)
            body += buf[line_end + 2 : line_end + 2 + size]
            del buf[: line_end + 2 + size + 2]
            if size == 0:
                return head, bytes(body)
    with contextlib.suppress(EOFError):  # close-delimited
        while True:
            _more(sock, buf)
    body = bytes(buf)
    buf.clear()
    return head, body


def _more(sock: Any, buf: bytearray) -> None:
    data = sock.recv(1 << 20)
    if not data:
        raise EOFError
    buf += data


def get(path: str, extra: str = "", host: str = NAME) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


@pytest.fixture
def splices(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many bytes each splice moved: the real ``splice.move``, watched."""
    moved: list[int] = []
    real = splice.move

    def watched(*args: Any) -> splice.Moved:
        result = real(*args)
        moved.append(result.count)
        return result

    monkeypatch.setattr(http1.splice, "move", watched)
    return moved


# -- plain HTTP ---------------------------------------------------------------------------------


def test_plain_bodies_arrive_identical_spliced_or_framed(splices: list[int]) -> None:
    """Content-Length (small: h11; big: spliced), chunked and close-delimited bodies, on one
    keep-alive connection, arrive byte for byte; a spliced body leaves the connection usable."""
    events: list[Event] = []
    with upstream() as up:
        client = plain(up, guest("open"), events)
        buf = bytearray()
        for path, n in (("cl", 1000), ("cl", BIG), ("chunked", BIG), ("cl", BIG), ("close", BIG)):
            client.sendall(get(f"/{path}/{n}"))
            head, body = read_response(client, buf)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert body == pattern(n), (path, n, len(body))
        client.close()
        settle()
    # Two Content-Length bodies were big enough to splice (less what h11 had already read);
    # the small, the chunked and the close-delimited ones were framed by h11.
    assert len(splices) == 2 and all(BIG // 2 < n <= BIG for n in splices)
    assert all(e.details["bytes_down"] > 0 for e in events)
    assert [e.details["bytes_down"] for e in events] == [1000, BIG, BIG, BIG, BIG]
    assert len(up.heads) == 5  # one upstream connection until the close-delimited one


def test_bodies_are_redacted_only_from_the_hosts_a_secret_is_sent_to(splices: list[int]) -> None:
    """A guest with a secret: a big body from the secret's host is read and redacted, never
    spliced; one from any other host is spliced. The gateway sends the real value only to its
    hosts, and what another host knows anyway a passthrough tunnel would carry unread."""
    events: list[Event] = []
    with upstream() as up:
        client = plain(up, guest("open", (SECRET,)), events)
        buf = bytearray()
        client.sendall(get(f"/key/{BIG}"))
        assert read_response(client, buf)[1] == with_key(BIG, SECRET.placeholder)
        client.sendall(get(f"/cl/{BIG}", host="other.test"))
        assert read_response(client, buf)[1] == pattern(BIG)
        client.close()
        settle()
    assert len(splices) == 1 and BIG // 2 < splices[0] <= BIG  # the other host's body only
    assert [e.details["bytes_down"] for e in events] == [BIG, BIG]


def test_a_request_after_a_spliced_body_is_judged_on_its_own(splices: list[int]) -> None:
    """Pipelined behind a spliced response, a request the rules refuse gets its 403 and never
    reaches the upstream."""
    events: list[Event] = []
    with upstream() as up:
        client = plain(up, guest("narrow"), events)
        client.sendall(get(f"/cl/{BIG}") + get("/chunked/10"))
        buf = bytearray()
        head, body = read_response(client, buf)
        assert head.startswith(b"HTTP/1.1 200") and body == pattern(BIG)
        head, body = read_response(client, buf)
        assert head.startswith(b"HTTP/1.1 403") and b"deny.request" in body
        client.close()
        settle()
    assert len(splices) == 1
    assert [h.split(b"\r\n")[0] for h in up.heads] == [f"GET /cl/{BIG} HTTP/1.1".encode()]
    assert [e.reason for e in events] == ["allow.exempt", "deny.request"]


def test_an_upstream_reset_mid_body_ends_the_client_connection(splices: list[int]) -> None:
    events: list[Event] = []
    with upstream() as up:
        client = plain(up, guest("open"), events)
        client.sendall(get(f"/reset/{BIG}"))
        buf = bytearray()
        with pytest.raises(EOFError):
            read_response(client, buf)  # the body stops short and the connection closes
        client.close()
        settle()
    assert len(splices) == 1 and splices[0] < BIG
    assert len(buf) < BIG
    assert "aborted" in events[-1].details["note"]


# -- inspected TLS --------------------------------------------------------------------------------


def test_inspected_bodies_and_injection_through_memory_bios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through inspection (TLS both sides on memory BIOs): bodies arrive identical, the
    placeholder becomes the real key upstream, and the key in a response is shown as the
    placeholder again (in a large body too, which bypasses h11); several requests on one
    connection; the next connection resumes the upstream's TLS session; an upstream reset
    mid-body ends the client's connection."""
    direct: list[int] = []
    real_direct = http1._direct_body

    def watched(*args: Any) -> bool:
        direct.append(args[4])
        return real_direct(*args)

    monkeypatch.setattr(http1, "_direct_body", watched)
    up_ca = make_ca("upstream CA")
    cert, key = up_ca.issue([NAME])
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(up_ca.cert_pem)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    events: list[Event] = []
    with upstream(server_tls) as up:
        proxy = Proxy(lambda name: [LOOP], lambda k, e: events.append(e),
                      ca_dir=tmp_path / "pca", extra_ca=[tmp_path / "ca.pem"])  # fmt: skip
        real_dial, dialled = proxy._dial, []

        def dial(address: str, port: int, name: str | None) -> Stream:
            dialled.append(real_dial(address, up.port, name))
            return dialled[-1]

        proxy._dial = dial  # type: ignore[method-assign]
        g = guest("open", (SECRET,))

        def handle(conn: socket.socket, peer: tuple[str, int]) -> None:
            rec = Record(g, "transparent", peer, ("127.0.0.1", 443), port=443, tls="inspected")
            proxy._serve_tls(conn, rec, NAME, None)

        trust = ssl.create_default_context(cadata=proxy.ca_cert_pem().decode())
        client = trust.wrap_socket(proxied(handle), server_hostname=NAME)
        buf = bytearray()
        for path, n in (("cl", BIG), ("chunked", BIG), ("cl", 10)):
            client.sendall(get(f"/{path}/{n}"))
            head, body = read_response(client, buf)
            assert head.startswith(b"HTTP/1.1 200") and body == pattern(n), (path, len(body))
        client.sendall(get(f"/key/{BIG}"))  # redacted in a body that bypasses h11
        assert read_response(client, buf)[1] == with_key(BIG, SECRET.placeholder)
        client.sendall(get("/echo", f"Authorization: Bearer {SECRET.placeholder}\r\n"))
        _, body = read_response(client, buf)
        assert body == f"Bearer {SECRET.placeholder}".encode()  # redacted on the way back
        client.close()
        settle()
        # A second connection: the upstream's TLS session is resumed (kept when the first
        # upstream connection closed: TLS 1.3 sends its ticket after the handshake).
        again = trust.wrap_socket(proxied(handle), server_hostname=NAME)
        again.sendall(get("/cl/5"))
        assert read_response(again, bytearray())[1] == pattern(5)
        again.close()
        settle()
        # The upstream resets in the middle of a body that bypasses h11: the client's body
        # stops short and its connection ends (nothing pretends the body was whole).
        cut = trust.wrap_socket(proxied(handle), server_hostname=NAME)
        cut.sendall(get(f"/reset/{BIG}"))
        short = bytearray()
        with pytest.raises((EOFError, ConnectionError, ssl.SSLError)):  # not a timeout
            read_response(cut, short)
        assert len(short) < BIG
        cut.close()
        settle()
        proxy.close()
    assert "aborted" in events[-1].details["note"]
    events.pop()
    assert [getattr(s, "session_reused", None) for s in dialled] == [False, True, True]
    assert f"Bearer {REAL}".encode() in up.heads[4]
    assert SECRET.placeholder.encode() not in b"".join(up.heads)
    assert events[4].details["credentials"] == ["injected:api"]
    assert direct == [BIG, BIG, BIG]  # the Content-Length bodies that bypassed h11 (and the cut)
    assert [e.verdict for e in events] == ["allow"] * 6
    assert len(up.heads) == 7  # one upstream connection carried the first five


def test_inspected_bodies_with_nothing_to_redact_leave_from_the_decrypt_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No secret serves the host: a large inspected body goes out from the buffer it was
    decrypted into (tlsio.recv_view), several on one connection and with requests between,
    byte for byte; bytes past a body (the next response) are never taken for it."""
    views: list[int] = []
    real_view = TlsStream.recv_view

    def watched(self: TlsStream, n: int = 1 << 18) -> memoryview:
        got = real_view(self, n)
        views.append(len(got))
        return got

    monkeypatch.setattr(TlsStream, "recv_view", watched)
    up_ca = make_ca("upstream CA")
    cert, key = up_ca.issue([NAME])
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(up_ca.cert_pem)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    events: list[Event] = []
    with upstream(server_tls) as up:
        proxy = Proxy(lambda name: [LOOP], lambda k, e: events.append(e),
                      ca_dir=tmp_path / "pca", extra_ca=[tmp_path / "ca.pem"])  # fmt: skip
        real_dial = proxy._dial
        proxy._dial = lambda a, p, n: real_dial(a, up.port, n)  # type: ignore[method-assign]
        g = guest("open")

        def handle(conn: socket.socket, peer: tuple[str, int]) -> None:
            rec = Record(g, "transparent", peer, ("127.0.0.1", 443), port=443, tls="inspected")
            proxy._serve_tls(conn, rec, NAME, None)

        trust = ssl.create_default_context(cadata=proxy.ca_cert_pem().decode())
        client = trust.wrap_socket(proxied(handle), server_hostname=NAME)
        buf = bytearray()
        sizes = (BIG, 10, BIG + 1, 70_000, BIG)
        for n in sizes:
            client.sendall(get(f"/cl/{n}"))
            head, body = read_response(client, buf)
            assert head.startswith(b"HTTP/1.1 200") and body == pattern(n), (n, len(body))
        client.sendall(get(f"/cl/{BIG}") + get("/cl/3"))  # pipelined behind a big body
        assert read_response(client, buf)[1] == pattern(BIG)
        assert read_response(client, buf)[1] == pattern(3)
        client.close()
        settle()
        proxy.close()
    assert sum(views) > 3 * BIG  # the big bodies went this way
    assert [e.details["bytes_down"] for e in events] == [*sizes, BIG, 3]
