"""``sandgate dashboard``: the running gateway's attempts, live, in a browser; and ``/metrics``.

One asyncio listener, HTTP/1.1 parsed by h11:

* ``/``: the page (report/dashpage.py; self-contained, its Content-Security-Policy lets it load
  nothing from elsewhere);
* ``/events``: server-sent events. On connect: the recent sessions and the last ``backlog``
  events from the store, then every event the gateway's control socket ``watch`` op streams,
  each written and flushed as it comes;
* ``/session/ID``: one session's report, rendered from the store;
* ``/metrics``: Prometheus text (report/metrics.py): the gateway's exact totals (its ``metrics``
  op) and the dashboard's own health;
* ``/approvals`` (GET) and ``/approve`` (POST): what waits for an answer in a session run with
  ``--ask``, and the answer, as ``sandgate approve`` gives it (the gateway's ``approvals`` and
  ``approve`` ops). A POST must be ``application/json`` and, when it names an Origin, come from
  this listener's own: a page elsewhere cannot send one without a CORS preflight, which is
  refused, so it cannot answer for a root-owned browser.

Access (``let_in``): a loopback client whose TCP socket belongs to root or to an ``--allow-uid``
is let in by its owner, found with an exact sock_diag lookup of its socket (net/sockdiag.py,
as the gateway finds a flow's sender); anyone else needs the token printed at start, as
``?token=`` or ``Authorization: Bearer``. The Host header must name the listener (a DNS
rebinding page in a root-owned browser would otherwise be let in by owner).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hmac
import ipaddress
import json
import os
import secrets
import sqlite3
import sys
import time
import traceback
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

from sandgate.errors import SandgateError
from sandgate.events.schema import FIELDS, Event
from sandgate.events.store import Store
from sandgate.gateway import control
from sandgate.net import sockdiag
from sandgate.report import dashpage, metrics
from sandgate.report.session import build_report, process_label

DEFAULT_LISTEN = "127.0.0.1:8377"
BACKLOG = 500  # events sent to a page when it opens
SESSIONS = 20  # recent sessions sent with them
CLIENT_QUEUE = 10_000  # events a slow browser may fall behind before it is cut off
MAX_CLIENTS = 64
HEARTBEAT = 15.0
RATE_WINDOW = 10.0
SERVER = "sandgate-dashboard"
# The page is inline HTML, CSS and JS; it may talk to this listener only.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


# -- access: pure ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    token: str
    allow_uids: frozenset[int] = frozenset()
    hosts: frozenset[str] = frozenset()  # Host header values that name this listener; empty: any

    def owner_allowed(self, uid: int | None) -> bool:
        return uid is not None and (uid == 0 or uid in self.allow_uids)


def token_matches(given: str | None, token: str) -> bool:
    """Constant-time: how much of a guess was right must not show in the time it takes."""
    if not given or not token:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def token_given(target: str, headers: Mapping[str, str]) -> str | None:
    """The token a request carries: ``Authorization: Bearer T`` or the ``token`` parameter."""
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    query = urllib.parse.urlsplit(target).query
    values = urllib.parse.parse_qs(query).get("token")
    return values[0] if values else None


def is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", maxsplit=1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def let_in(
    access: Access, peer: str, owner_uid: int | None, token: str | None, host: str | None
) -> bool:
    """Whether a request may see the dashboard: the Host it names must be ours; then a loopback
    peer whose socket is root's (or an allowed uid's) is let in by its owner, anyone else by
    the token."""
    if access.hosts and (host or "").lower() not in access.hosts:
        return False
    if is_loopback(peer) and access.owner_allowed(owner_uid):
        return True
    return token_matches(token, access.token)


VERDICTS = ("allow", "always", "deny")


def approval_call(
    headers: Mapping[str, str], body: bytes, hosts: frozenset[str]
) -> tuple[dict[str, Any] | None, str]:
    """The gateway ``approve`` op a POST /approve asks for, or (None, why not)."""
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return None, "an answer is JSON: content-type application/json"
    origin = headers.get("origin")
    if origin is not None:
        parts = urllib.parse.urlsplit(origin)
        if parts.scheme != "http" or (hosts and parts.netloc.lower() not in hosts):
            return None, f"an answer comes from this dashboard's own page, not {origin!r}"
    try:
        msg = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, "the body is not JSON"
    if not isinstance(msg, dict) or not isinstance(msg.get("name"), str) or not msg["name"]:
        return None, 'the body names what waits: {"name": "pypi.org", "verdict": "allow"}'
    verdict = msg.get("verdict", "allow")
    if verdict not in VERDICTS:
        return None, f"verdict is one of {', '.join(VERDICTS)}, not {verdict!r}"
    call: dict[str, Any] = {"op": "approve", "name": msg["name"], "verdict": verdict}
    if isinstance(msg.get("guest"), str):
        call["guest"] = msg["guest"]
    return call, ""


def listener_hosts(host: str, port: int) -> frozenset[str]:
    """The Host header values a browser sends for this loopback listener."""
    names = {host, "localhost"} | ({"127.0.0.1"} if host.startswith("127.") else set())
    if ":" in host:
        names = {f"[{host}]", "localhost"}
    return frozenset({*names, *(f"{n}:{port}" for n in names)})


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SandgateError(
            f"--listen wants HOST:PORT, not {text!r}", f"e.g. --listen {DEFAULT_LISTEN}"
        )
    host = host.removeprefix("[").removesuffix("]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise SandgateError(
            f"--listen wants an IP address, not {host!r}", f"e.g. --listen {DEFAULT_LISTEN}"
        ) from None
    return host, int(port)


# -- who owns a loopback client's socket -----------------------------------------------------


def socket_owner(peer: str, peer_port: int, local: str, local_port: int) -> int | None:
    """The uid of the socket that connected from ``peer:peer_port`` to us, by an exact sock_diag
    lookup of its 4-tuple (in our namespace, where a loopback client's socket is); None when the
    kernel does not know it. The order matters: the same tuple the other way round is our own
    accepted socket, root's, and would let everyone in (the kernel test with uid 65534 shows it).
    """
    try:
        request = sockdiag.pack_diag_request("tcp", peer, peer_port, local, local_port)
        with sockdiag.open_socket() as sock:
            sock.send(request)
            answer = sockdiag.parse_diag_reply(sock.recv(65536), seq=1)
    except (OSError, ValueError):  # NetlinkParseError is a ValueError
        return None
    # inode 0: an orphan, closed by its process; nobody owns it any more
    return answer[1] if isinstance(answer, tuple) and answer[0] else None


# -- the gateway's stream, fanned out to browsers ----------------------------------------------


@dataclass(eq=False)  # one per open page, kept in a set by identity
class _Client:
    queue: asyncio.Queue[dict[str, Any] | None] = field(
        default_factory=lambda: asyncio.Queue(CLIENT_QUEUE)
    )


@dataclass
class Health:
    streamed: int = 0
    dropped_clients: int = 0
    refused: int = 0
    requests: int = 0
    arrivals: deque[float] = field(default_factory=deque)

    def rate(self, now: float) -> float:
        while self.arrivals and self.arrivals[0] < now - RATE_WINDOW:
            self.arrivals.popleft()
        return len(self.arrivals) / RATE_WINDOW


class Hub:
    """One ``watch`` connection to the gateway, its events handed to every open page."""

    def __init__(self, control_path: Path, health: Health) -> None:
        self.control_path = control_path
        self.health = health
        self.clients: set[_Client] = set()
        self.connected = False

    async def run(self) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(
                    str(self.control_path), limit=control.MAX_LINE
                )
            except OSError:
                await asyncio.sleep(1.0)  # the gateway restarting: keep trying
                continue
            try:
                writer.write(control.encode({"op": "watch"}))
                await writer.drain()
                self._set_connected(True)
                while line := await reader.readline():
                    self.publish(wire(control.decode(line)))
            except (OSError, ValueError):
                pass
            finally:
                self._set_connected(False)
                writer.close()
            await asyncio.sleep(1.0)

    def _set_connected(self, up: bool) -> None:
        if up != self.connected:
            self.connected = up
            self._send({"type": "status", "connected": up})

    def publish(self, event: dict[str, Any]) -> None:
        self.health.streamed += 1
        self.health.arrivals.append(time.monotonic())
        self._send({"type": "event", "event": event})

    def _send(self, message: dict[str, Any]) -> None:
        for client in list(self.clients):
            try:
                client.queue.put_nowait(message)
            except asyncio.QueueFull:
                # Cut off rather than buffer without bound or skip events silently: the page
                # reconnects and starts from the store's backlog.
                self.clients.discard(client)
                self.health.dropped_clients += 1
                while not client.queue.empty():
                    client.queue.get_nowait()
                client.queue.put_nowait(None)


def wire(raw: dict[str, Any]) -> dict[str, Any]:
    """An event as the page gets it: its JSON, plus its sender's ``role:command``."""
    try:
        proc = process_label(Event.from_json(raw))
    except (ValueError, TypeError, KeyError):
        proc = None
    return {**raw, "proc": proc}


def _key(e: Mapping[str, Any]) -> tuple[Any, ...]:
    return (e.get("ts"), e.get("kind"), e.get("guest"), e.get("dst"), e.get("port"),
            e.get("name"), e.get("verdict"), e.get("count"))  # fmt: skip


# -- the store ----------------------------------------------------------------------------


def tail(store_path: Path, n: int) -> list[dict[str, Any]]:
    """The last ``n`` events, oldest first, read-only (the daemon is writing)."""
    if not store_path.exists():
        return []
    uri = f"file:{urllib.parse.quote(str(store_path))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            db.row_factory = sqlite3.Row
            cols = ",".join(FIELDS)
            rows = db.execute(
                f"SELECT {cols} FROM events ORDER BY id DESC LIMIT ?", [int(n)]
            ).fetchall()
    except sqlite3.Error as exc:
        raise SandgateError(f"cannot read the event store {store_path}: {exc}") from exc
    return [wire(Event.from_row(dict(r)).as_json()) for r in reversed(rows)]


def recent_sessions(store_path: Path, n: int) -> list[dict[str, Any]]:
    if not store_path.exists():
        return []
    store = Store(store_path)
    try:
        rows = store.sessions(n)
    finally:
        store.close()
    return [
        {"id": s.id, "started": s.started, "ended": s.ended, "mode": s.mode,
         "profile": s.profile, "guest": s.guest, "exit_code": s.exit_code,
         "command": " ".join(s.command)[:200]}
        for s in rows
    ]  # fmt: skip


def session_page(store_path: Path, sid: str) -> str | None:
    store = Store(store_path)
    try:
        row = store.session(sid)
        if row is None:
            return None
        events = store.events(session=row.id)
    finally:
        store.close()
    return dashpage.session_html(build_report(row, events, row.details.get("counters")), events)


# -- HTTP ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    instance: str
    control_path: Path
    store_path: Path
    host: str
    port: int
    access: Access
    public: bool = False
    backlog: int = BACKLOG


class Dashboard:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.health = Health()
        self.hub = Hub(opts.control_path, self.health)
        self.port = opts.port
        self.access = opts.access

    async def serve(self, ready: Any = None) -> None:
        try:
            server = await asyncio.start_server(self._connection, self.opts.host, self.opts.port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SandgateError(
                    f"port {self.opts.port} on {self.opts.host} is in use",
                    f"stop what listens there (ss -ltnp 'sport = :{self.opts.port}') or pick "
                    f"another port: --listen {self.opts.host}:PORT",
                ) from exc
            raise SandgateError(
                f"cannot listen on {self.opts.host}:{self.opts.port}: {exc}"
            ) from exc
        self.port = server.sockets[0].getsockname()[1]
        if self.access.hosts and self.port != self.opts.port:  # port 0: the one we got
            self.access = dataclasses.replace(
                self.access, hosts=listener_hosts(self.opts.host, self.port)
            )
        hub = asyncio.ensure_future(self.hub.run())
        if ready is not None:
            ready(self)
        try:
            async with server:
                await server.serve_forever()
        finally:
            hub.cancel()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("", 0)
        local = writer.get_extra_info("sockname") or ("", 0)
        conn = h11.Connection(h11.SERVER)
        owner: int | None = None
        looked_up = False
        try:
            while True:
                got = await _next_request(conn, reader)
                if got is None:
                    return
                request, body = got
                self.health.requests += 1
                headers = {k.decode().lower(): v.decode("latin-1") for k, v in request.headers}
                target = request.target.decode("latin-1")
                if not looked_up and is_loopback(peer[0]):
                    owner = socket_owner(peer[0], peer[1], local[0], local[1])
                    looked_up = True
                token = token_given(target, headers)
                if not let_in(self.access, peer[0], owner, token, headers.get("host")):
                    self.health.refused += 1
                    refusal = b"a token is needed: ?token=... or Authorization: Bearer ...\n"
                    await _send(conn, writer, 401, "text/plain; charset=utf-8",
                                b"" if request.method == b"HEAD" else refusal,
                                [(b"www-authenticate", b"Bearer")])  # fmt: skip
                elif not await self._route(conn, writer, request.method, target, headers, body):
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                with contextlib.suppress(Exception):
                    await _send(conn, writer, exc.error_status_hint, "text/plain", b"bad request\n")
        except (ConnectionError, h11.LocalProtocolError):
            pass
        except Exception:  # report, never die of one request
            traceback.print_exc(file=sys.stderr)
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                with contextlib.suppress(Exception):
                    await _send(conn, writer, 500, "text/plain", b"internal error\n")
        finally:
            writer.close()

    async def _route(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        method: bytes,
        target: str,
        headers: Mapping[str, str],
        body: bytes,
    ) -> bool:
        """Answer one request; False when the connection is done (an event stream ended)."""
        path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
        if path == "/approve" and method == b"POST":
            await self._approve(conn, writer, headers, body)
        elif method != b"GET":  # a HEAD answer has no body: h11 refuses one
            body = b"" if method == b"HEAD" else b"GET only\n"
            await _send(conn, writer, 405, "text/plain", body, [(b"allow", b"GET")])
        elif path == "/":
            page = dashpage.page(self.opts.instance).encode()
            await _send(conn, writer, 200, "text/html; charset=utf-8", page)
        elif path == "/events":
            await self._stream(conn, writer)
            return False
        elif path == "/approvals":
            reply = await control_call(self.opts.control_path, {"op": "approvals"})
            await self._json(conn, writer, reply, lambda r: {"pending": r["pending"]})
        elif path == "/metrics":
            text = await self.metrics_text()
            await _send(conn, writer, 200, metrics.CONTENT_TYPE, text.encode())
        elif path.startswith("/session/"):
            sid = path.removeprefix("/session/")
            html = await asyncio.to_thread(session_page, self.opts.store_path, sid)
            if html is None:
                await _send(conn, writer, 404, "text/plain; charset=utf-8",
                            f"no session {sid!r} in the store\n".encode())  # fmt: skip
            else:
                await _send(conn, writer, 200, "text/html; charset=utf-8", html.encode())
        else:
            await _send(conn, writer, 404, "text/plain", b"not found\n")
        return True

    async def _approve(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        headers: Mapping[str, str],
        body: bytes,
    ) -> None:
        call, why = approval_call(headers, body, self.access.hosts)
        if call is None:
            await _send(conn, writer, 400, "application/json", _error(why))
            return
        reply = await control_call(self.opts.control_path, call)
        await self._json(conn, writer, reply, lambda r: r)

    async def _json(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        reply: dict[str, Any] | None,
        shown: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        """A gateway reply as JSON: 502 when it does not answer, 409 with its error."""
        if reply is None:
            why = "the gateway does not answer"
            await _send(conn, writer, 502, "application/json", _error(why))
        elif not reply.get("ok"):
            why = str(reply.get("error")) + (f" (fix: {reply['fix']})" if reply.get("fix") else "")
            await _send(conn, writer, 409, "application/json", _error(why))
        else:
            body = {k: v for k, v in shown(reply).items() if k != "ok"}
            await _send(conn, writer, 200, "application/json", json.dumps(body).encode())

    async def _stream(self, conn: h11.Connection, writer: asyncio.StreamWriter) -> None:
        if len(self.hub.clients) >= MAX_CLIENTS:
            await _send(conn, writer, 503, "text/plain", b"too many open dashboards\n")
            return
        client = _Client()
        self.hub.clients.add(client)  # first: nothing emitted from now on can be missed
        try:
            backlog = await asyncio.to_thread(tail, self.opts.store_path, self.opts.backlog)
            sessions = await asyncio.to_thread(recent_sessions, self.opts.store_path, SESSIONS)
            head = h11.Response(status_code=200, headers=[
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no"),
                *_common_headers()])  # fmt: skip
            writer.write(conn.send(head) or b"")
            hello = {"type": "hello", "instance": self.opts.instance, "sessions": sessions,
                     "backlog": backlog, "connected": self.hub.connected}  # fmt: skip
            await _event(conn, writer, hello, retry=2000)
            # The store holds what was flushed; the stream what came since we subscribed: an
            # event in both is shown once.
            seen = {_key(e) for e in backlog}
            newest = max((e.get("ts") or 0 for e in backlog), default=0.0)
            while True:
                try:
                    message = await asyncio.wait_for(client.queue.get(), HEARTBEAT)
                except TimeoutError:
                    writer.write(conn.send(h11.Data(data=b": keepalive\n\n")) or b"")
                    await writer.drain()
                    continue
                if message is None:
                    return  # cut off for falling behind
                if seen and message.get("type") == "event":
                    event = message["event"]
                    if _key(event) in seen:
                        seen.discard(_key(event))
                        continue
                    if (event.get("ts") or 0) > newest + 5:
                        seen.clear()
                await _event(conn, writer, message)
        finally:
            self.hub.clients.discard(client)

    async def metrics_text(self) -> str:
        reply = await gateway_metrics(self.opts.control_path)
        health = {
            "events_per_second": self.health.rate(time.monotonic()),
            "watch_connected": 1.0 if self.hub.connected else 0.0,
            "clients": float(len(self.hub.clients)),
            "streamed": float(self.health.streamed),
            "dropped_clients": float(self.health.dropped_clients),
            "refused": float(self.health.refused),
            "requests": float(self.health.requests),
        }
        families = [
            *metrics.gateway_families(reply, self.opts.instance),
            *metrics.dashboard_families(health),
        ]
        return metrics.exposition(families)


async def control_call(
    control_path: Path, msg: dict[str, Any], timeout: float = 5.0
) -> dict[str, Any] | None:
    """One call on the gateway's control socket; None when it does not answer."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(
                str(control_path), limit=control.MAX_LINE
            )
            try:
                writer.write(control.encode(msg))
                await writer.drain()
                return control.decode(await reader.readline())
            finally:
                writer.close()
    except (OSError, ValueError, TimeoutError):
        return None


async def gateway_metrics(control_path: Path, timeout: float = 5.0) -> dict[str, Any] | None:
    """The gateway's ``metrics`` reply, or None when it does not answer."""
    reply = await control_call(control_path, {"op": "metrics"}, timeout)
    return reply if reply is not None and reply.get("ok") else None


async def _next_request(
    conn: h11.Connection, reader: asyncio.StreamReader
) -> tuple[h11.Request, bytes] | None:
    """The next request and its body (at most 64 KiB); None when the client is done."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            conn.receive_data(data)
            if not data and request is None:
                return None
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > 65536:
                raise h11.RemoteProtocolError("request body too large", 413)
        elif isinstance(event, h11.EndOfMessage):
            return None if request is None else (request, bytes(body))
        elif isinstance(event, h11.ConnectionClosed):
            return None


def _error(why: str) -> bytes:
    return json.dumps({"error": why}).encode()


def _common_headers() -> list[tuple[bytes, bytes]]:
    return [
        (b"server", SERVER.encode()),
        (b"content-security-policy", CSP.encode()),
        (b"referrer-policy", b"no-referrer"),  # the token may be in the page's address
        (b"x-content-type-options", b"nosniff"),
    ]


async def _send(
    conn: h11.Connection,
    writer: asyncio.StreamWriter,
    status: int,
    ctype: str,
    body: bytes,
    extra: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), *_common_headers(), *extra]  # fmt: skip
    writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
    writer.write(conn.send(h11.Data(data=body)) or b"")
    writer.write(conn.send(h11.EndOfMessage()) or b"")
    await writer.drain()


async def _event(
    conn: h11.Connection, writer: asyncio.StreamWriter, message: dict[str, Any], retry: int = 0
) -> None:
    """One server-sent event, flushed now (no buffering between the gateway and the page)."""
    text = (f"retry: {retry}\n" if retry else "") + f"data: {json.dumps(message)}\n\n"
    writer.write(conn.send(h11.Data(data=text.encode())) or b"")
    await writer.drain()


# -- the command ---------------------------------------------------------------------------


def options(
    instance: str,
    control_path: Path,
    store_path: Path,
    listen: str,
    allow_uids: Iterable[int] = (),
    public: bool = False,
    token_file: Path | None = None,
) -> Options:
    host, port = parse_listen(listen)
    if not is_loopback(host) and not public:
        raise SandgateError(
            f"{host} is not a loopback address: the dashboard would be reachable from other hosts",
            "pass --public to mean it (every client then needs the token), or listen on 127.0.0.1",
        )
    access = Access(
        token=load_token(token_file) if token_file else secrets.token_urlsafe(24),
        allow_uids=frozenset(allow_uids),
        hosts=frozenset() if public else listener_hosts(host, port),
    )
    return Options(instance, control_path, store_path, host, port, access, public)


def load_token(path: Path) -> str:
    """The token kept in ``path`` (a scraper's bearer token stays the same across restarts);
    a new one is written there, readable by root only, when the file does not exist."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = secrets.token_urlsafe(24)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token + "\n")
        except OSError as exc:
            raise SandgateError(f"cannot write the token file {path}: {exc.strerror}") from exc
        return token
    except OSError as exc:
        raise SandgateError(f"cannot read the token file {path}: {exc.strerror}") from exc
    if len(token) < 16:
        raise SandgateError(
            f"the token in {path} is too short to guard anything ({len(token)} characters)",
            f"put 16 or more random characters there, or delete {path} for a new one",
        )
    return token


def run(opts: Options) -> None:
    """Serve until interrupted; prints where, and the token, once listening."""

    def ready(d: Dashboard) -> None:
        host = f"[{opts.host}]" if ":" in opts.host else opts.host
        if opts.public:
            sys.stderr.write(
                f"warning: the dashboard listens on {opts.host}, not only on loopback; every "
                "client needs the token\n"
            )
        sys.stdout.write(
            f"dashboard of gateway {opts.instance}: http://{host}:{d.port}/\n"
            f"token: {opts.access.token}\n"
            f"  (root and allowed uids on this host need none: "
            f"http://{host}:{d.port}/?token={opts.access.token} for the others)\n"
        )
        sys.stdout.flush()

    asyncio.run(Dashboard(opts).serve(ready))


__all__ = [
    "Access",
    "Dashboard",
    "Options",
    "is_loopback",
    "let_in",
    "listener_hosts",
    "load_token",
    "options",
    "parse_listen",
    "run",
    "socket_owner",
    "tail",
    "token_given",
    "token_matches",
]
