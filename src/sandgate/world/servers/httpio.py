"""HTTP serving for the test-world servers: one handler shape over HTTP/1.1 (h11) and HTTP/2.

A handler is `async (Request) -> Response`. h11 and h2 do all the wire work; this module
only moves their events to and from the socket. A `Response` body is either bytes or an
async iterator of bytes, written as it is produced (each chunk is written and drained
before the next is pulled), which is what SSE and the lock-step tests rely on.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import h11

from sandgate.world.servers.runtime import Addr, JsonLog, format_addr

__all__ = [
    "Body",
    "ConnInfo",
    "Handler",
    "Request",
    "Response",
    "Upgraded",
    "bound_addrs",
    "header_dict",
    "json_response",
    "serve_connection",
    "start_http",
    "text_response",
]

Body = bytes | AsyncIterable[bytes]
READ_SIZE = 256 * 1024
MAX_BODY = 256 * 1024 * 1024


@dataclass(frozen=True)
class ConnInfo:
    """What is known about a connection before its first request."""

    peer: Addr
    local: Addr
    scheme: str  # "http" or "https"
    sni: str | None = None
    alpn: str | None = None


@dataclass
class Request:
    method: str
    target: str
    headers: list[tuple[str, str]]  # names lower-case, in arrival order
    http_version: str  # "1.0", "1.1" or "2"
    conn: ConnInfo
    receive: Callable[[], Awaitable[bytes | None]]  # next body chunk, None at the end
    authority: str | None = None  # HTTP/2 :authority

    @property
    def path(self) -> str:
        return urllib.parse.urlsplit(self.target).path or "/"

    @property
    def query(self) -> dict[str, str]:
        query = urllib.parse.urlsplit(self.target).query
        return dict(urllib.parse.parse_qsl(query, keep_blank_values=True))

    @property
    def host(self) -> str:
        """Host (or :authority) lower-cased, without port; "" when absent."""
        raw = self.authority or self.header("host") or ""
        host = raw.lower()
        if host.startswith("["):
            return host[1:].partition("]")[0]
        return host.rsplit(":", 1)[0] if host.count(":") == 1 else host

    def header(self, name: str) -> str | None:
        name = name.lower()
        values = [v for k, v in self.headers if k == name]
        return ", ".join(values) if values else None

    async def chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self.receive()) is not None:
            yield chunk

    async def body(self, limit: int = MAX_BODY) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                raise ValueError("request body too large")
            parts.append(chunk)
        return b"".join(parts)


@dataclass
class Upgraded:
    """The raw connection after a 101 on HTTP/1.1; `buffered` arrived with the request."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    buffered: bytes


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: Body = b""
    upgrade: Callable[[Upgraded], Awaitable[None]] | None = None  # only with status 101
    log: dict[str, Any] = field(default_factory=dict)  # merged into the request's log line


Handler = Callable[[Request], Awaitable[Response]]


def json_response(
    status: int, payload: Any, headers: list[tuple[str, str]] | None = None
) -> Response:
    body = json.dumps(payload, indent=None, separators=(",", ":")).encode()
    return Response(status, [("content-type", "application/json"), *(headers or [])], body)


def text_response(
    status: int, text: str, content_type: str = "text/plain; charset=utf-8"
) -> Response:
    return Response(status, [("content-type", content_type)], text.encode())


def header_dict(headers: list[tuple[str, str]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for name, value in headers:
        merged[name] = f"{merged[name]}, {value}" if name in merged else value
    return merged


def conn_info(writer: asyncio.StreamWriter, scheme: str) -> ConnInfo:
    peer = writer.get_extra_info("peername") or ("", 0)
    local = writer.get_extra_info("sockname") or ("", 0)
    sslobj: ssl.SSLObject | None = writer.get_extra_info("ssl_object")
    sni = getattr(sslobj, "sg_sni", None) if sslobj is not None else None
    alpn = sslobj.selected_alpn_protocol() if sslobj is not None else None
    return ConnInfo((peer[0], peer[1]), (local[0], local[1]), scheme, sni, alpn)


async def close_body(body: Body) -> None:
    close = getattr(body, "aclose", None)
    if close is not None:
        await close()


async def call_handler(handler: Handler, req: Request, log: JsonLog) -> Response:
    try:
        return await handler(req)
    except Exception as exc:  # a handler bug must show up as a 500 and a log line
        log.write("handler_error", target=req.target, error=repr(exc))
        return text_response(500, f"internal error: {exc!r}\n")


def log_request(log: JsonLog, req: Request, resp: Response, sent: int, started: float) -> None:
    log.write(
        "request",
        proto="h2" if req.http_version == "2" else "http/1.1",
        scheme=req.conn.scheme,
        src=format_addr(req.conn.peer),
        dst=format_addr(req.conn.local),
        sni=req.conn.sni,
        method=req.method,
        host=req.host,
        target=req.target,
        status=resp.status,
        bytes_sent=sent,
        ms=round((time.monotonic() - started) * 1000, 3),
        headers=header_dict(req.headers),
        **resp.log,
    )


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    log: JsonLog,
    scheme: str,
) -> None:
    """Serve one accepted connection until the peer or the protocol ends it."""
    info = conn_info(writer, scheme)
    try:
        if info.alpn == "h2":
            from sandgate.world.servers.http2 import serve_h2

            await serve_h2(reader, writer, handler, log, info)
        else:
            await _serve_h1(reader, writer, handler, log, info)
    except (ConnectionError, ssl.SSLError, TimeoutError):
        pass  # peers vanish mid-response; that is theirs to notice, not ours
    except Exception as exc:  # e.g. a body iterator failing mid-stream: log, drop the conn
        log.write("connection_error", src=format_addr(info.peer), error=repr(exc))
    finally:
        writer.close()


class _H1:
    """One HTTP/1.1 connection: an h11.Connection plus the socket it reads and writes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self.reader, self.writer = reader, writer
        self.sent = 0  # body bytes of the current response written so far

    async def next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return cast("h11.Event | type[h11.PAUSED]", event)
            if self.conn.they_are_waiting_for_100_continue:
                self.writer.write(
                    self.send_event(h11.InformationalResponse(status_code=100, headers=[]))
                )
            self.conn.receive_data(await self.reader.read(READ_SIZE))

    def send_event(self, event: h11.Event) -> bytes:
        return self.conn.send(event) or b""

    async def send_response(self, req: Request, resp: Response) -> None:
        self.sent = 0
        headers = list(resp.headers)
        body = resp.body
        names = {k.lower() for k, _ in headers}
        # 1xx/204/304 carry no body, and a Content-Length on a 204 is a protocol error
        if (
            isinstance(body, bytes)
            and "content-length" not in names
            and resp.status not in (204, 304)
        ):
            headers.append(("content-length", str(len(body))))
        if "server" not in names:
            headers.append(("server", "sg-world"))
        if "date" not in names:  # `sandgate doctor` checks the guest's clock against it
            headers.append(("date", email.utils.formatdate(usegmt=True)))
        self.writer.write(self.send_event(h11.Response(status_code=resp.status, headers=headers)))
        if req.method == "HEAD":
            await close_body(body)
        elif isinstance(body, bytes):
            self._write_data(body)
        else:
            async for chunk in body:
                self._write_data(chunk)
                await self.writer.drain()
        self.writer.write(self.send_event(h11.EndOfMessage()))
        await self.writer.drain()

    def _write_data(self, chunk: bytes) -> None:
        # passthrough: h11 frames the chunk without copying a 1 MiB buffer into a new one
        self.sent += len(chunk)
        if chunk:
            for piece in self.conn.send_with_data_passthrough(h11.Data(data=chunk)) or ():
                self.writer.write(piece)


async def _none() -> None:
    return None


# stands in for the request h11 could not parse, to answer it with a 400
_GET = Request("GET", "/", [], "1.1", ConnInfo(("", 0), ("", 0), "http"), _none)


async def _serve_h1(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    log: JsonLog,
    info: ConnInfo,
) -> None:
    h1 = _H1(reader, writer)
    while True:
        try:
            event = await h1.next_event()
        except h11.RemoteProtocolError as exc:
            log.write("bad_request", src=format_addr(info.peer), error=str(exc))
            if h1.conn.our_state is h11.SEND_RESPONSE:
                await h1.send_response(_GET, text_response(400, "bad request\n"))
            return
        if not isinstance(event, h11.Request):
            return  # ConnectionClosed, or a peer that closed between requests
        started = time.monotonic()
        done = False

        async def receive() -> bytes | None:
            nonlocal done
            if done:
                return None
            ev = await h1.next_event()
            if isinstance(ev, h11.Data):
                return bytes(ev.data)
            done = True  # EndOfMessage, or PAUSED after an Upgrade request's end
            return None

        req = Request(
            method=event.method.decode("ascii"),
            target=event.target.decode("latin-1"),
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers],
            http_version=event.http_version.decode("ascii"),
            conn=info,
            receive=receive,
        )
        resp = await call_handler(handler, req, log)
        if resp.status == 101 and resp.upgrade is not None:
            writer.write(
                h1.send_event(h11.InformationalResponse(status_code=101, headers=resp.headers))
            )
            await writer.drain()
            log_request(log, req, resp, 0, started)
            buffered, _ = h1.conn.trailing_data
            await resp.upgrade(Upgraded(reader, writer, buffered))
            return
        try:
            await h1.send_response(req, resp)
        finally:  # logged even when the client leaves mid-body (bytes_sent says how far)
            log_request(log, req, resp, h1.sent, started)
        if h1.conn.they_are_waiting_for_100_continue:
            return  # they never sent the body; closing is simpler than guessing
        while not done:
            await receive()
        if h1.conn.our_state is not h11.DONE or h1.conn.their_state is not h11.DONE:
            return
        h1.conn.start_next_cycle()


async def start_http(
    addrs: list[Addr],
    handler: Handler,
    log: JsonLog,
    ssl_ctx: ssl.SSLContext | None = None,
) -> list[asyncio.Server]:
    """Listen on each address (port 0 picks a free one); HTTPS when `ssl_ctx` is given."""
    scheme = "https" if ssl_ctx is not None else "http"

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, handler, log, scheme)

    servers = []
    for host, port in addrs:
        servers.append(
            await asyncio.start_server(
                on_connect, host, port, ssl=ssl_ctx, reuse_address=True, limit=READ_SIZE
            )
        )
    return servers


def bound_addrs(servers: list[asyncio.Server]) -> list[str]:
    """The addresses actually listened on, e.g. to report port 0's choice in READY."""
    return [format_addr(sock.getsockname()) for server in servers for sock in server.sockets]
