"""HTTP/1.1 through the proxy: one client connection, request by request, with h11.

Used for plain HTTP (transparent port 80, explicit absolute-form requests) and for inspected
TLS. Each request is judged (``judge_request`` for the protocol, ``flow.judge`` for the policy),
its credential headers rewritten (credentials.py), and its body and the response streamed chunk
by chunk: nothing is held whole, so server-sent events arrive as they are produced. Blocking
sockets on a thread of their own; h11 does all the parsing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import h11

from sandgate.errors import PeerProtocolError
from sandgate.gateway.proxy import httphead, splice
from sandgate.gateway.proxy.chunked import ChunkedCheck
from sandgate.gateway.proxy.credentials import (
    BodyScanner,
    Redactor,
    Secret,
    echoed_by,
    redact_headers,
    rewrite_headers,
    same_lengths,
)
from sandgate.gateway.proxy.flow import (
    Emit,
    Judged,
    Judgements,
    ProxyGuest,
    Record,
    Resolve,
    judge,
)
from sandgate.gateway.proxy.tlsio import Stream, TlsStream
from sandgate.policy.decide import Attempt, Reason, decide, deny
from sandgate.policy.model import Protocol
from sandgate.policy.requests import names_agree, placeholder_sent

MAX_HEAD = 64 * 1024
# Bytes asked of a peer per read. From a TLS peer, large: it decrypts every record it holds in
# one call (tlsio.py), so a bulk body costs h11 and us one pass per read, not one per 16 KiB
# record. From a plain socket, what the kernel usually holds (its bulk bodies are spliced).
RECV = 1 << 20
RECV_PLAIN = 64 * 1024
# How much of a chunked request body is read and checked before the upstream is dialled.
AHEAD_BYTES = 256 * 1024
AHEAD_SECONDS = 1.0
# A Content-Length response body at least this long bypasses h11 (_direct_body): spliced in the
# kernel where nothing needs to read it (splice.py), else moved in large pieces.
DIRECT_MIN = 64 * 1024
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
    }
)

Dial = Callable[[str, int, "str | None"], Stream]  # address, port, TLS server name


@dataclass
class Ctx:
    guest: ProxyGuest
    door: str  # explicit | transparent
    client: tuple[str, int]
    original_dst: tuple[str, int]
    resolve: Resolve
    dial: Dial
    emit: Emit
    tls_name: str | None = None  # set when the client side is inspected TLS: the SNI
    on_connect: Callable[[socket.socket, Record, bytes], None] | None = None
    front: tuple[str, int] | None = None  # a fronted service: (address, port), plain HTTP
    idle: float = 120.0
    # This connection's verdicts, remembered (flow.Judgements: exact, decide() is pure).
    judge: Judgements = field(default_factory=Judgements)


class _Peer:
    """A socket and its h11 state, with a tolerant reader."""

    def __init__(self, sock: Stream, role: type[h11.CLIENT] | type[h11.SERVER]) -> None:
        self.sock = sock
        self.h = h11.Connection(role, max_incomplete_event_size=MAX_HEAD)
        self.raw_head = bytearray()  # bytes received before the current event completed
        self.body_check: ChunkedCheck | None = None
        self.out: list[bytes] = []  # written by send(..., hold=True), sent by flush()

    def next_event(self, flush: _Peer | None = None) -> Any:
        """The next h11 event; before waiting for bytes, ``flush`` is flushed (what was
        held for it is all there is until this peer speaks again)."""
        while True:
            event = self.h.next_event()
            if event is not h11.NEED_DATA:
                return event
            if flush is not None:
                flush.flush()
            try:
                data = self.sock.recv(_chunk(self.sock))
            except (TimeoutError, ssl.SSLError, OSError):
                data = b""
            self.take(data)

    def take(self, data: bytes) -> None:
        """Received bytes: kept for check_head, checked as a chunked body, then given to h11
        (the check first, so h11 never yields data from bytes the check refuses)."""
        if len(self.raw_head) < MAX_HEAD + 1:
            self.raw_head += data[: MAX_HEAD + 1 - len(self.raw_head)]
        if self.body_check is not None and data:
            self.body_check.feed(data)
        self.h.receive_data(data)

    def check_chunked_body(self) -> None:
        """The request just read has a chunked body: check its raw bytes from here on,
        starting with those h11 already holds."""
        self.body_check = ChunkedCheck()
        self.body_check.feed(bytes(self.h._receive_buffer))  # h11 is pinned (see serve)

    def send(self, event: h11.Event, hold: bool = False) -> int:
        """Send an event; with ``hold``, keep its bytes for the next flush() (a response's head,
        body and end in one TLS record and one system call)."""
        data = self.h.send(event)
        if data:
            self.out.append(data)
        if not hold:
            self.flush()
        return len(data or b"")

    def fresh(self, rest: bytes = b"", closed: bool = False) -> None:
        """New h11 state after a body h11 did not see (spliced): ``rest`` is what the peer sent
        after it (a pipelined request), ``closed`` whether it has closed its side since."""
        self.h = h11.Connection(self.h.our_role, max_incomplete_event_size=MAX_HEAD)
        if rest:
            self.h.receive_data(rest)
        if closed:
            self.h.receive_data(b"")

    def next_cycle(self) -> None:
        """Ready for the next request (a fresh state already is)."""
        if self.h.our_state is h11.IDLE and self.h.their_state is h11.IDLE:
            return
        self.h.start_next_cycle()

    def flush(self) -> None:
        if self.out:
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.out.clear()
            self.sock.sendall(data)


@dataclass
class _Upstream:
    key: tuple[str, int, str | None]
    peer: _Peer
    scanner: BodyScanner | None = field(default=None)


def serve(sock: Stream, ctx: Ctx) -> None:
    """Serve one client connection until it closes, a limit is hit, or a request is refused."""
    sock.settimeout(ctx.idle)
    client = _Peer(sock, h11.SERVER)
    upstream: _Upstream | None = None
    try:
        while True:
            # The raw bytes of the coming head, for check_head: what h11 holds unparsed (a
            # pipelined request) plus what arrives next. (h11's buffer is private; h11 is pinned.)
            client.raw_head = bytearray(bytes(client.h._receive_buffer))
            client.body_check = None
            try:
                event = client.next_event()
            except h11.RemoteProtocolError as exc:
                _refuse_protocol(client, ctx, exc.error_status_hint, httphead.h11_message(exc))
                return
            if isinstance(event, h11.ConnectionClosed) or event is None:
                return
            if not isinstance(event, h11.Request):
                return
            keep, upstream = _one_request(client, event, ctx, upstream)
            if not keep:
                return
            if client.h.our_state is h11.MUST_CLOSE or client.h.their_state is h11.MUST_CLOSE:
                return
            try:
                client.next_cycle()
            except h11.LocalProtocolError:
                return
    finally:
        if upstream is not None:
            _close(upstream.peer.sock)


def _one_request(
    client: _Peer, req: h11.Request, ctx: Ctx, upstream: _Upstream | None
) -> tuple[bool, _Upstream | None]:
    rec = _record(ctx)
    rec.method = req.method.decode("latin-1")
    try:
        httphead.check_head(bytes(client.raw_head))
        target = httphead.judge_request(
            req.method,
            req.target,
            list(req.headers),
            explicit_proxy=ctx.door == "explicit" and ctx.tls_name is None,
            http_version=req.http_version,
        )
    except PeerProtocolError as exc:
        _aim(rec, bytes(client.raw_head), ctx)
        rec.decision = deny(Reason.PROTOCOL, exc.message)
        _answer(client, exc.status_hint, exc.message, rec, ctx)
        return False, upstream
    rec.path = target.path
    if target.kind == "authority":  # CONNECT
        if ctx.on_connect is None or ctx.tls_name is not None:
            rec.host, rec.port = target.host, target.port
            rec.decision = deny(Reason.PROTOCOL, "CONNECT inside a tunnel")
            _answer(client, 405, "CONNECT is only for the proxy port", rec, ctx)
            return False, upstream
        _connect(client, target.host, target.port, rec, ctx)
        return False, upstream
    host = target.host
    port = target.port or (443 if ctx.tls_name else 80)
    rec.host, rec.port = host, port
    fronting = names_agree(ctx.tls_name, host or "", f"SNI {ctx.tls_name} but Host {host}")
    if fronting is not None:
        rec.decision = fronting
        _answer(client, 421, f"the Host header ({host}) does not match the TLS name", rec, ctx)
        return False, upstream
    if ctx.door == "transparent" and ctx.tls_name is None and host is None:
        rec.decision = deny(Reason.PROTOCOL, "no Host")
        _answer(client, 400, "a Host header is required", rec, ctx)
        return False, upstream
    dial_tls = ctx.tls_name
    # The request as sent (path and query) for request rules; logs get the redacted rec.path.
    request = (rec.method, target.path_raw.decode("latin-1") or "/")
    who = ctx.guest.who(rec.flow_key())  # for process rules (issue 14)
    if ctx.front is not None:
        # A fronted plain-HTTP service: TLS ends here, the service is dialled as the policy allows.
        port, dial_tls = ctx.front[1], None
        rec.port = port
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv4Address(ctx.front[0])
        judged = ctx.judge(ctx.guest.profile, None, address, port, ctx.resolve, request, who)
    elif _intercepted(ctx):
        # A host:port whose requests are judged (net/compile.py's intercept4): the request goes
        # where the guest sent it, judged by that address; the Host header does not steer it.
        address, port = ipaddress.ip_address(ctx.original_dst[0]), ctx.original_dst[1]
        rec.port = port
        judged = ctx.judge(ctx.guest.profile, None, address, port, ctx.resolve, request, who)
    else:
        judged = ctx.judge(ctx.guest.profile, host, None, port, ctx.resolve, request, who)
        if _asked(ctx, host, judged):
            judged = ctx.judge(ctx.guest.profile, host, None, port, ctx.resolve, request, who)
    rec.decision = judged.decision
    if judged.address is None:
        _answer(
            client, 403, f"sandgate: {judged.decision.key}: {judged.decision.explain()}", rec, ctx
        )
        return True, upstream
    rec.address = str(judged.address)
    assert host is not None
    rewritten = rewrite_headers(
        list(req.headers), host, ctx.guest.secrets, tls=ctx.tls_name is not None, target=req.target
    )
    if rewritten.exfiltration is not None:
        rec.decision = placeholder_sent(rewritten.exfiltration, host)
        _answer(
            client,
            403,
            "sandgate: deny.exfiltration: a placeholder credential may not go here",
            rec,
            ctx,
        )
        return False, upstream
    rec.credentials = [f"injected:{n}" for n in rewritten.injected] + [
        f"dropped:{n}" for n in rewritten.dropped
    ]
    # A chunked body is read (up to a bound) and its framing checked before anything is sent or
    # dialled: a short malformed body never costs an upstream connection (see _read_ahead).
    ahead: list[h11.Data | h11.EndOfMessage] = []
    forwarded = rewritten.headers
    if _chunked(req.headers):
        try:
            if client.h.they_are_waiting_for_100_continue:
                # The body is wanted here first; the upstream is not asked (nor told to wait).
                client.send(h11.InformationalResponse(status_code=100, headers=[]))
                forwarded = [(n, v) for n, v in forwarded if n.lower() != b"expect"]
            client.check_chunked_body()
            ahead = _read_ahead(client, ctx)
        except (PeerProtocolError, h11.RemoteProtocolError) as exc:
            message = (
                exc.message if isinstance(exc, PeerProtocolError) else httphead.h11_message(exc)
            )
            rec.decision = deny(Reason.PROTOCOL, message)
            _answer(client, 400, f"sandgate: malformed request: {message}", rec, ctx)
            return False, upstream
    key = (rec.address, port, dial_tls)
    if upstream is None or upstream.key != key:
        if upstream is not None:
            _close(upstream.peer.sock)
        try:
            sock = ctx.dial(rec.address, port, dial_tls)
        except (OSError, ssl.SSLError) as exc:
            rec.status, rec.note = 502, f"upstream: {exc}"
            _answer(
                client, 502, f"sandgate: cannot reach {host}:{port}: {exc}", rec, ctx, log=False
            )
            ctx.emit(rec.flow_key(), rec.event())
            return False, None
        upstream = _Upstream(key, _Peer(sock, h11.CLIENT))
    target_path = origin_form(req.target) if target.kind == "absolute" else req.target
    headers = [(n, v) for n, v in forwarded if n.lower() not in HOP_BY_HOP]
    websocket = _wants_websocket(req.headers)
    if websocket:
        headers += [(b"connection", b"upgrade"), (b"upgrade", b"websocket")]
    strangers = tuple(s for s in ctx.guest.secrets if not (ctx.tls_name and s.serves(host)))
    scanner = BodyScanner(strangers)
    try:
        keep = _exchange(
            client, upstream.peer, req, target_path, headers, ahead, rec, scanner, websocket, ctx
        )
    except PeerProtocolError as exc:
        # The client's body went bad past the read-ahead: the upstream got only the chunks
        # that had parsed (h11 re-frames them), never the malformed bytes.
        rec.decision = deny(Reason.PROTOCOL, exc.message)
        rec.note = "aborted mid-body"
        _answer(client, 400, f"sandgate: malformed request: {exc.message}", rec, ctx, log=False)
        keep = False
    except h11.ProtocolError as exc:
        rec.note = f"aborted: {httphead.h11_message(exc)}"  # never the bytes h11 quotes
        keep = False
    except (OSError, ssl.SSLError) as exc:
        rec.note = f"aborted: {exc}"
        keep = False
    ctx.emit(rec.flow_key(), rec.event())
    if not keep:
        _close(upstream.peer.sock)
        return False, None
    try:
        upstream.peer.next_cycle()
    except h11.LocalProtocolError:
        _close(upstream.peer.sock)
        upstream = None
    return True, upstream


def _exchange(
    client: _Peer,
    server: _Peer,
    req: h11.Request,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    ahead: list[h11.Data | h11.EndOfMessage],
    rec: Record,
    scanner: BodyScanner,
    websocket: bool,
    ctx: Ctx,
) -> bool:
    """Forward one request and its response, streaming both bodies. True: keep the connection.
    ``ahead``: body events already read (and checked); the rest is read as it comes. Writes are
    held until the side they come from has nothing more buffered (``_Peer.next_event(flush=)``),
    so a small response is one write; whatever was held is sent before this returns."""
    try:
        return _forward(client, server, req, target, headers, ahead, rec, scanner, websocket, ctx)
    finally:
        with contextlib.suppress(OSError, ssl.SSLError):
            client.flush()


def _forward(
    client: _Peer,
    server: _Peer,
    req: h11.Request,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    ahead: list[h11.Data | h11.EndOfMessage],
    rec: Record,
    scanner: BodyScanner,
    websocket: bool,
    ctx: Ctx,
) -> bool:
    echo = echoed_by(ctx.guest.secrets, rec.host)  # what the response's body is redacted for
    server.send(
        h11.Request(
            method=req.method, target=target, headers=headers, http_version=req.http_version
        ),
        hold=True,
    )
    pending = list(ahead)
    while True:
        event = pending.pop(0) if pending else _body_event(client, server)
        if isinstance(event, h11.Data):
            found = scanner.feed(event.data)
            if found is not None:
                rec.decision = placeholder_sent(found, rec.host, "body")
                rec.status = 403
                return False
            rec.bytes_up += len(event.data)
            server.send(event, hold=True)
        elif isinstance(event, h11.EndOfMessage):
            server.send(event)
            break
        else:
            return False
    while True:
        event = server.next_event()
        if isinstance(event, h11.InformationalResponse):
            if event.status_code == 101 and websocket:
                rec.status = 101
                client.send(
                    h11.InformationalResponse(
                        status_code=101, headers=_clean(event.headers), reason=event.reason
                    )
                )
                up, down = _tunnel(client, server)
                rec.bytes_up += up
                rec.bytes_down += down
                return False
            client.send(event)
            continue
        if isinstance(event, h11.Response):
            rec.status = event.status_code
            headers = redact_headers(_clean(event.headers), ctx.guest.secrets)
            if not same_lengths(echo):
                # Redaction may change the body's length: let h11 frame it anew.
                headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
            client.send(
                h11.Response(
                    status_code=event.status_code,
                    headers=headers,
                    reason=event.reason,
                    http_version=b"1.1",
                ),
                hold=True,
            )
            length = _direct_length(server, req, event, echo)
            if length is not None:
                return _direct_body(client, server, req, event, length, rec, echo)
            break
        return False
    redactor = Redactor(echo)
    while True:
        # Held bytes go out before any wait: a streamed response is never held back.
        event = server.next_event(flush=client)
        if isinstance(event, h11.Data):
            rec.bytes_down += len(event.data)
            data = redactor.feed(event.data)
            if data:
                client.send(h11.Data(data=data), hold=True)
        elif isinstance(event, h11.EndOfMessage):
            tail = redactor.flush()
            if tail:
                client.send(h11.Data(data=tail), hold=True)
            client.send(event)
            return server.h.our_state is h11.DONE and server.h.their_state is h11.DONE
        else:
            return False


def _direct_length(
    server: _Peer, req: h11.Request, resp: h11.Response, echo: tuple[Secret, ...]
) -> int | None:
    """The length of a response body that can bypass h11, else None: a Content-Length body
    (chunked and close-delimited ones are framed by h11, request bodies always are) whose
    length the forwarded head keeps (redaction cannot change it: ``same_lengths``)."""
    if req.method == b"HEAD" or resp.status_code in (204, 304):
        return None
    if not same_lengths(echo) or server.h.their_state is not h11.SEND_BODY:
        return None
    lengths = {v for n, v in resp.headers if n == b"content-length"}
    if len(lengths) != 1 or any(n == b"transfer-encoding" for n, _ in resp.headers):
        return None
    length = int(lengths.pop())  # h11 checked it is digits
    return length if length >= DIRECT_MIN else None


def _direct_body(
    client: _Peer,
    server: _Peer,
    req: h11.Request,
    resp: h11.Response,
    length: int,
    rec: Record,
    echo: tuple[Secret, ...],
) -> bool:
    """Move a Content-Length body without h11: spliced in the kernel (splice.py) between plain
    sockets when no secret could need redacting (``echo``: the ones the host is sent), else
    read and written in large pieces (one pass per ``RECV``, TLS on memory BIOs, through the
    ``Redactor``). Then both peers get a
    fresh h11 state for the next request, as h11 would after the body. True: keep it."""
    client.flush()  # the head
    held = bytes(server.h._receive_buffer)  # body bytes h11 already read (h11 is pinned)
    first, extra = held[:length], held[length:]
    redactor = Redactor(echo)
    if first:
        client.sock.sendall(redactor.feed(first))
    rec.bytes_down += len(first)
    left = length - len(first)
    src, dst = server.sock, client.sock
    if isinstance(src, socket.socket) and isinstance(dst, socket.socket) and not echo:
        moved = splice.move(src, dst, left, _idle(src))
        rec.bytes_down += moved.count
        ended = moved.ended
    else:
        ended = None
        # Nothing to redact from a TLS upstream: the plaintext goes out from the thread's
        # buffer it was decrypted into (tlsio.recv_view), not copied into bytes first.
        viewed = src if isinstance(src, TlsStream) and not echo else None
        while left > 0:
            want = min(_chunk(src), left)
            data = viewed.recv_view(want) if viewed is not None else src.recv(want)
            if not data:
                ended = "eof"
                break
            left -= len(data)
            rec.bytes_down += len(data)
            out = data if isinstance(data, memoryview) else redactor.feed(data)
            if out:
                dst.sendall(out)
        tail = redactor.flush()
        if tail and ended is None:
            dst.sendall(tail)
    if ended is not None:
        rec.note = f"aborted: {ended} after {rec.bytes_down} of {length} bytes"
        return False
    if extra or not (_keeps_alive(req) and _keeps_alive(resp)):
        return False  # bytes past the body, or a side that said close: end here
    rest = bytes(client.h._receive_buffer)  # a pipelined request, judged on its own next
    client.fresh(rest, closed=client.h._receive_buffer_closed)
    server.fresh()
    return True


def _keeps_alive(event: h11.Request | h11.Response) -> bool:
    """h11's own rule: HTTP/1.1 and no ``close`` among the Connection header's tokens."""
    tokens = b",".join(v for n, v in event.headers if n == b"connection").lower().split(b",")
    return event.http_version >= b"1.1" and b"close" not in {t.strip() for t in tokens}


def _chunk(sock: Stream) -> int:
    return RECV if isinstance(sock, TlsStream) else RECV_PLAIN


def _idle(sock: socket.socket) -> float:
    return sock.gettimeout() or 120.0


def _asked(ctx: Ctx, host: str | None, judged: Judged) -> bool:
    """internet = "ask": a name the allowlist refuses waits for `sandgate approve` (bounded);
    True when it was asked (judge again: the guest's profile may have gained its rule)."""
    guest = ctx.guest
    if guest.ask is None or not guest.profile.ask or host is None:
        return False
    if judged.decision.reason is not Reason.NOT_ALLOWLISTED:
        return False
    guest.ask(host)
    return True


def _intercepted(ctx: Ctx) -> bool:
    """Plain HTTP the kernel sent here from a port other than 80: an intercepted host:port."""
    return ctx.door == "transparent" and ctx.tls_name is None and ctx.original_dst[1] != 80


def _chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    # judge_request let through only "Transfer-Encoding: chunked", once.
    return any(n.lower() == b"transfer-encoding" for n, _ in headers)


def _body_event(client: _Peer, server: _Peer) -> Any:
    """The client's next body event (what is held for ``server`` is sent before waiting); its
    protocol errors are the client's (a 400)."""
    try:
        return client.next_event(flush=server)
    except h11.RemoteProtocolError as exc:
        raise PeerProtocolError(httphead.h11_message(exc), 400) from exc


def _read_ahead(client: _Peer, ctx: Ctx) -> list[h11.Data | h11.EndOfMessage]:
    """Read a chunked body before the upstream is dialled: to its end, or until
    ``AHEAD_BYTES`` of it are held or ``AHEAD_SECONDS`` have passed. Either way its framing
    was checked as it came (``ChunkedCheck``, fed by ``_Peer.take``), so a malformed body that
    arrives within the bound is refused before any upstream connection exists.

    Validate-ahead rather than forwarding after each chunk parsed: the head and the dial must
    wait for the check too, and a bounded wait costs a streamed upload at most one second
    once, while responses are never held (report 002: buffering turned a 17 s stream into
    6 minutes). A body longer or slower than the bound is streamed on, still checked; what
    the upstream receives is h11's re-framing of chunks that parsed, never the client's bytes.
    """
    events: list[h11.Data | h11.EndOfMessage] = []
    held = 0
    deadline = time.monotonic() + AHEAD_SECONDS
    try:
        while True:
            event = client.h.next_event()
            if isinstance(event, h11.Data):
                events.append(event)
                held += len(event.data)
                continue
            if isinstance(event, h11.EndOfMessage):
                events.append(event)
                return events
            if event is not h11.NEED_DATA:
                raise PeerProtocolError(f"{type(event).__name__} inside a request body")
            left = deadline - time.monotonic()
            if held >= AHEAD_BYTES or left <= 0:
                return events
            client.sock.settimeout(left)
            try:
                data = client.sock.recv(_chunk(client.sock))
            except TimeoutError:
                return events
            except (ssl.SSLError, OSError):
                data = b""
            client.take(data)
    finally:
        client.sock.settimeout(ctx.idle)


def _connect(client: _Peer, host: str | None, port: int | None, rec: Record, ctx: Ctx) -> None:
    rec.host, rec.port = host, port
    assert port is not None and ctx.on_connect is not None
    assert isinstance(client.sock, socket.socket)  # CONNECT is for the plain proxy port only
    if ctx.guest.profile.front(host) is not None and port == 443:
        # A fronted service: the gateway itself answers, after the TLS handshake (server.py).
        rec.decision = decide(ctx.guest.profile, Attempt(Protocol.TCP, None, port, host))
        client.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
        leftover, _ = client.h.trailing_data
        ctx.on_connect(client.sock, rec, bytes(leftover))
        return
    who = ctx.guest.who(rec.flow_key())
    judged = judge(ctx.guest.profile, host, None, port, ctx.resolve, process=who)
    if _asked(ctx, host, judged):
        judged = judge(ctx.guest.profile, host, None, port, ctx.resolve, process=who)
    rec.decision = judged.decision
    if judged.address is None:
        _answer(
            client, 403, f"sandgate: {judged.decision.key}: {judged.decision.explain()}", rec, ctx
        )
        return
    rec.address = str(judged.address)
    client.send(h11.Response(status_code=200, headers=[], reason=b"Connection established"))
    # Whatever the client sent after the CONNECT head belongs to the tunnel.
    leftover, _ = client.h.trailing_data
    ctx.on_connect(client.sock, rec, bytes(leftover))


def _tunnel(a: _Peer, b: _Peer) -> tuple[int, int]:
    """Relay raw bytes both ways on possibly-TLS sockets (after a WebSocket upgrade)."""
    pending_a, _ = a.h.trailing_data
    pending_b, _ = b.h.trailing_data
    if pending_a:
        b.sock.sendall(pending_a)
    if pending_b:
        a.sock.sendall(pending_b)
    return copy_both(a.sock, b.sock, len(pending_a), len(pending_b))


def copy_both(
    a: Stream, b: Stream, up: int = 0, down: int = 0, idle: float = 300.0
) -> tuple[int, int]:
    """One-thread relay that also works for TLS streams (whose buffered bytes select() misses)."""
    open_: dict[Stream, Stream] = {a: b, b: a}
    by_fd = {s.fileno(): s for s in open_}
    poller = select.poll()  # not select: descriptors past 1024 (many guests, many flows)
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    while open_:
        ready: list[Stream] = [s for s in open_ if isinstance(s, TlsStream) and s.pending()]
        if not ready:
            ready = [by_fd[fd] for fd, _ in poller.poll(idle * 1000) if by_fd[fd] in open_]
            if not ready:
                break
        for src in ready:
            dst = open_.get(src)
            if dst is None:
                continue
            try:
                data = src.recv(_chunk(src))
            except ssl.SSLWantReadError:
                continue
            except OSError:
                data = b""
            if not data:
                del open_[src]
                poller.unregister(src.fileno())
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                continue
            dst.sendall(data)
            if src is a:
                up += len(data)
            else:
                down += len(data)
    return up, down


def _answer(client: _Peer, status: int, text: str, rec: Record, ctx: Ctx, log: bool = True) -> None:
    rec.status = status
    body = (text + "\n").encode()
    reason = rec.decision.key if rec.decision is not None else ""
    with contextlib.suppress(OSError, h11.LocalProtocolError):
        client.send(
            h11.Response(
                status_code=status,
                headers=[
                    (b"content-type", b"text/plain"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-sandgate-reason", reason.encode()),
                    (b"connection", b"close"),
                ],
            )
        )
        client.send(h11.Data(data=body))
        client.send(h11.EndOfMessage())
    if log:
        ctx.emit(rec.flow_key(), rec.event())


def _record(ctx: Ctx) -> Record:
    """A new decision record for a request on this connection."""
    return Record(
        ctx.guest,
        ctx.door,
        ctx.client,
        ctx.original_dst,
        tls="inspected" if ctx.tls_name else "plain",
        sni=ctx.tls_name,
    )


def _aim(rec: Record, raw_head: bytes, ctx: Ctx) -> None:
    """Say in a refusal's record what the head was aimed at, as far as it can be read."""
    aim = httphead.aimed_at(raw_head)
    rec.host, rec.path, rec.address = aim.name, aim.path, aim.address
    rec.port = aim.port
    if rec.port is None and ctx.tls_name is not None:
        rec.port = 443
    elif rec.port is None and ctx.door == "transparent":
        rec.port = ctx.original_dst[1]  # origin form: the port the guest connected to


def _refuse_protocol(client: _Peer, ctx: Ctx, status: int, text: str) -> None:
    rec = _record(ctx)
    _aim(rec, bytes(client.raw_head), ctx)
    rec.decision = deny(Reason.PROTOCOL, text)
    # A refusal is the client's fault: always a 4xx (h11 suggests 501 for unknown codings).
    status = status if 400 <= status < 500 else 400
    body = f"sandgate: malformed request: {text}\n".encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        client.sock.sendall(head + body)
    rec.status = status
    ctx.emit(rec.flow_key(), rec.event())


def _clean(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Response headers for the client: hop-by-hop ones dropped, an upgrade kept."""
    pairs = list(headers)
    out = [(n, v) for n, v in pairs if n.lower() not in HOP_BY_HOP]
    upgrade = [(n, v) for n, v in pairs if n.lower() == b"upgrade"]
    if upgrade:
        out += [*upgrade, (b"connection", b"upgrade")]
    return out


def _wants_websocket(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(n.lower() == b"upgrade" and v.lower() == b"websocket" for n, v in headers)


def origin_form(target: bytes) -> bytes:
    """``http://host:port/path?q`` → ``/path?q`` (what the server is sent)."""
    parts = urlsplit(target.decode("latin-1"))
    path = parts.path or "/"
    return (path + (f"?{parts.query}" if parts.query else "")).encode("latin-1")


def _close(sock: Stream) -> None:
    with contextlib.suppress(OSError):
        sock.close()
