"""The proxy's listeners on each guest's gateway address, and what happens per connection.

Three doors per guest, all reaching ``flow.judge`` (and through it ``decide()``):
- explicit, port 3128: HTTP_PROXY/HTTPS_PROXY clients; absolute-form requests and CONNECT;
- transparent HTTP, port 15080: the gateway redirects the guest's TCP 80 here;
- transparent TLS, port 15443: the gateway redirects the guest's TCP 443 here.

TLS is judged on the ClientHello's SNI (peeked, not consumed); where CONNECT target, SNI and Host
are all present they must agree. Allowed TLS passes through raw (spliced), unless the profile
inspects that name: then the gateway terminates TLS with its own CA and speaks HTTP/1.1 both ways
(http1.py), which is where placeholder credentials are swapped.

Each connection gets its own thread with blocking sockets until it is judged; a raw tunnel is
then handed to the kernel (sockmap.py: a BPF sockmap joins the two sockets; where BPF is missing,
the splice hub of relay.py, one epoll thread for every tunnel) and the thread ends.
Decisions are pure and the asyncio loop is only asked to resolve names and to take events.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandgate.gateway.proxy import http1, relay, sni, sockmap
from sandgate.gateway.proxy.accept import Acceptor
from sandgate.gateway.proxy.flow import Emit, ProxyGuest, Record, Resolve, judge
from sandgate.gateway.proxy.tls import Leaves, upstream_context
from sandgate.gateway.proxy.tlsio import Sessions, Stream, TlsStream
from sandgate.net.compile import PROXY_EXPLICIT_PORT, PROXY_HTTP_PORT, PROXY_TLS_PORT
from sandgate.policy.decide import Reason, deny
from sandgate.policy.requests import names_agree, raw_relay, tls_mode

EXPLICIT_PORT, HTTP_PORT, TLS_PORT = PROXY_EXPLICIT_PORT, PROXY_HTTP_PORT, PROXY_TLS_PORT
SO_ORIGINAL_DST = 80
PEEK_LIMIT = 16 * 1024
HELLO_TIMEOUT = 10.0
DIAL_TIMEOUT = 10.0


@dataclass
class _Listeners:
    sockets: list[socket.socket] = field(default_factory=list)


Handler = Callable[[socket.socket, tuple[str, int], ProxyGuest], None]


class Proxy:
    def __init__(
        self,
        resolve: Resolve,
        emit: Emit,
        ca_dir: Path | None = None,
        extra_ca: list[Path] | None = None,
    ) -> None:
        from sandgate.gateway.proxy.tls import load_or_create_ca

        self.resolve = resolve
        self.emit = emit
        self.ca = load_or_create_ca(ca_dir)
        self.leaves = Leaves(self.ca)
        self.upstream_tls = upstream_context(extra_ca)
        self.sessions = Sessions()  # upstream TLS sessions, resumed on the next dial
        self._guests: dict[str, _Listeners] = {}
        self._acceptor = Acceptor(self._accepted)  # every guest's doors, one thread (accept.py)
        self.cut = False  # the watchdog cut the gateway off: every connection is refused

    def ca_cert_pem(self) -> bytes:
        return self.ca.cert_pem

    # -- listeners ------------------------------------------------------------------------------

    def start_guest(self, guest: ProxyGuest) -> None:
        address = str(guest.link.gateway)
        ls = _Listeners()
        doors = [
            (address, EXPLICIT_PORT, self._explicit),
            (address, HTTP_PORT, self._transparent_http),
            (address, TLS_PORT, self._transparent_tls),
        ]
        if guest.profile.uplink_ipv6:  # the guest's IPv6 web flows, redirected (issue 14)
            six = str(guest.link.gateway6)
            doors += [
                (six, HTTP_PORT, self._transparent_http),
                (six, TLS_PORT, self._transparent_tls),
            ]
        try:
            for address, port, _handler in doors:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                sock = socket.socket(family, socket.SOCK_STREAM)
                ls.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((address, port))
                sock.listen(256)
        except BaseException:
            for sock in ls.sockets:
                sock.close()
            raise
        for sock, (_address, _port, handler) in zip(ls.sockets, doors, strict=True):
            self._acceptor.add(sock, (guest, handler))
        self._guests[guest.link.ifname] = ls

    def running(self, guest: ProxyGuest) -> bool:
        ls = self._guests.get(guest.link.ifname)
        return ls is not None and all(self._acceptor.serves(s) for s in ls.sockets)

    def stop_guest(self, guest: ProxyGuest) -> None:
        ls = self._guests.pop(guest.link.ifname, None)
        if ls is None:
            return
        for s in ls.sockets:
            self._acceptor.remove(s)
            s.close()

    def close(self) -> None:
        self.leaves.close()

    def _accepted(
        self, conn: socket.socket, peer: tuple[str, int], door: tuple[ProxyGuest, Handler]
    ) -> None:
        guest, handler = door
        conn.setblocking(True)
        _no_delay(conn)
        threading.Thread(
            target=self._guarded, args=(handler, conn, peer, guest), daemon=True
        ).start()

    def _guarded(
        self,
        handler: Handler,
        conn: socket.socket,
        peer: tuple[str, int],
        guest: ProxyGuest,
    ) -> None:
        if self.cut:
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        try:
            handler(conn, peer, guest)
        except Exception:  # one bad connection must never take the proxy down
            import traceback

            traceback.print_exc()
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    # -- doors ----------------------------------------------------------------------------------

    def _explicit(self, conn: socket.socket, peer: tuple[str, int], guest: ProxyGuest) -> None:
        ctx = http1.Ctx(
            guest=guest,
            door="explicit",
            client=peer,
            original_dst=(str(guest.link.gateway), EXPLICIT_PORT),
            resolve=self.resolve,
            dial=self._dial,
            emit=self.emit,
            on_connect=self._tunnel,
        )
        http1.serve(conn, ctx)

    def _transparent_http(
        self, conn: socket.socket, peer: tuple[str, int], guest: ProxyGuest
    ) -> None:
        ctx = http1.Ctx(
            guest=guest,
            door="transparent",
            client=peer,
            original_dst=original_dst(conn),
            resolve=self.resolve,
            dial=self._dial,
            emit=self.emit,
        )
        http1.serve(conn, ctx)

    def _transparent_tls(
        self, conn: socket.socket, peer: tuple[str, int], guest: ProxyGuest
    ) -> None:
        dst = original_dst(conn)
        rec = Record(guest, "transparent", peer, dst, port=dst[1], tls="passthrough")
        self._tls(conn, rec, name=None, address=ipaddress.ip_address(dst[0]))

    def _tunnel(self, conn: socket.socket, rec: Record, early: bytes) -> None:
        """After CONNECT: TLS (judged again on its SNI) or any other bytes, relayed raw."""
        kind = sni.looks_like_tls(early or _peek(conn, 5))
        if kind:
            rec.tls = "passthrough"
            assert rec.port is not None
            self._tls(conn, rec, name=rec.host, address=None, early=early)
            return
        self._raw(conn, rec, early)

    # -- TLS: peek the ClientHello, judge, then pass through or inspect ------------------------

    def _tls(
        self,
        conn: socket.socket,
        rec: Record,
        name: str | None,
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
        early: bytes = b"",
    ) -> None:
        try:
            hello = _read_hello(conn, early)
        except (sni.Malformed, OSError, TimeoutError) as exc:
            rec.decision = deny(Reason.PROTOCOL, f"ClientHello: {exc}")
            self._refuse(conn, rec)
            return
        rec.sni = hello.sni
        guest = rec.guest
        front = guest.profile.front(hello.sni or name)
        to_gateway = rec.original_dst is not None and rec.original_dst[0] == str(guest.link.gateway)
        if front is not None and to_gateway:
            rec.host, rec.tls = front.name, "inspected"
            self._serve_tls(conn, rec, front.name, (str(front.address), front.port))
            return
        fronting = names_agree(name, hello.sni, f"CONNECT {name} but SNI {hello.sni}")
        if fronting is not None:
            rec.host = name
            rec.decision = fronting
            self._refuse(conn, rec)
            return
        target_name = hello.sni or name
        assert rec.port is not None
        judged = judge(
            guest.profile,
            target_name,
            None if target_name else address,
            rec.port,
            self.resolve,
            process=guest.who(rec.flow_key()),
        )
        rec.host = target_name
        rec.decision = judged.decision
        if judged.address is None:
            self._refuse(conn, rec)
            return
        rec.address = str(judged.address)
        if tls_mode(guest.profile, judged.decision, target_name) == "inspect":
            assert target_name is not None
            self._inspect(conn, rec, target_name, early)
            return
        self._raw(conn, rec, early)

    def _inspect(self, conn: socket.socket, rec: Record, name: str, early: bytes) -> None:
        if early:
            # Bytes already taken off the socket cannot be handed to the TLS layer; CONNECT
            # clients send nothing before the 200 in practice.
            rec.decision = deny(Reason.PROTOCOL, "data before the tunnel was established")
            self._refuse(conn, rec)
            return
        self._serve_tls(conn, rec, name, None)

    def _serve_tls(
        self, conn: socket.socket, rec: Record, name: str, front: tuple[str, int] | None
    ) -> None:
        """Terminate TLS as ``name`` with the gateway's CA, then speak HTTP/1.1 (http1.py)."""
        tls = TlsStream(conn, self.leaves.context(name), server_side=True)
        try:
            tls.handshake(HELLO_TIMEOUT)
        except (ssl.SSLError, OSError) as exc:
            rec.tls, rec.note = "inspected", f"client TLS failed: {exc}"
            self.emit(rec.flow_key(), rec.event())
            return
        ctx = http1.Ctx(
            guest=rec.guest,
            door=rec.door,
            client=rec.client,
            original_dst=rec.original_dst or ("", 0),
            resolve=self.resolve,
            dial=self._dial,
            emit=self.emit,
            tls_name=name,
            front=front,
        )
        with contextlib.suppress(OSError, ssl.SSLError):
            http1.serve(tls, ctx)

    def _raw(self, conn: socket.socket, rec: Record, early: bytes) -> None:
        assert rec.address is not None and rec.port is not None
        if rec.decision is not None:
            address = ipaddress.ip_address(rec.address)
            rec.decision = raw_relay(rec.guest.profile, rec.decision, rec.host, address, rec.port)
            if not rec.decision.allowed:
                self._refuse(conn, rec)
                return
        try:
            upstream = socket.create_connection((rec.address, rec.port), timeout=DIAL_TIMEOUT)
        except OSError as exc:
            rec.note = f"upstream: {exc}"
            self._refuse(conn, rec, log_only=True)
            return
        upstream.settimeout(None)
        _no_delay(upstream)
        with upstream:
            if early:
                upstream.sendall(early)
            profile = rec.guest.profile

            def done(result: relay.RelayResult) -> None:
                rec.bytes_up, rec.bytes_down = result.up + len(early), result.down
                if result.ended not in ("eof",):
                    rec.note = f"ended: {result.ended}"
                self.emit(rec.flow_key(), rec.event())

            # The kernel (or the hub) takes the tunnel, on duplicates of both sockets: this thread
            # ends here. Only raw tunnels come this way; inspected ones never do.
            sockmap.start(
                conn,
                upstream,
                done,
                idle=profile.tunnel_idle,
                total=profile.tunnel_max_seconds,
                cap=profile.tunnel_max_bytes,
            )

    def _refuse(self, conn: socket.socket, rec: Record, log_only: bool = False) -> None:
        """Close with a reset: a TLS client gets no HTTP error page, only a prompt failure."""
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.emit(rec.flow_key(), rec.event())

    # -- dialling ---------------------------------------------------------------------------------

    def _dial(self, address: str, port: int, tls_name: str | None) -> Stream:
        sock = socket.create_connection((address, port), timeout=DIAL_TIMEOUT)
        _no_delay(sock)
        if tls_name is None:
            return sock
        tls = TlsStream(
            sock,
            self.upstream_tls,
            server_side=False,
            server_hostname=tls_name,
            session=self.sessions.get(tls_name, port),
            on_close=lambda session: self.sessions.put(tls_name, port, session),
        )
        try:
            tls.handshake(DIAL_TIMEOUT)
        except BaseException:
            sock.close()
            raise
        return tls


def _no_delay(sock: socket.socket) -> None:
    """Send small writes at once. A proxy writes a response head and its body (or an SSE
    event) separately; with Nagle on, the second write waits for the peer's delayed ACK, which
    added 40 ms to every inspected response and to streamed tokens (bench/run proxy)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def original_dst(conn: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was going (conntrack remembers it)."""
    if conn.family == socket.AF_INET6:  # IP6T_SO_ORIGINAL_DST: a sockaddr_in6
        raw = conn.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        port = struct.unpack_from("!H", raw, 2)[0]
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port = struct.unpack_from("!H", raw, 2)[0]
    return socket.inet_ntoa(raw[4:8]), port


def _peek(conn: socket.socket, n: int) -> bytes:
    conn.settimeout(HELLO_TIMEOUT)
    try:
        return conn.recv(n, socket.MSG_PEEK)
    finally:
        conn.settimeout(None)


def _read_hello(conn: socket.socket, early: bytes) -> sni.ClientHello:
    """Peek (never consume) until the whole ClientHello is buffered, then parse it."""
    deadline = time.monotonic() + HELLO_TIMEOUT
    want = 512
    while True:
        if early:
            buf = early
        else:
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                buf = conn.recv(want, socket.MSG_PEEK)
            finally:
                conn.settimeout(None)
            if not buf:
                raise sni.Malformed("connection closed before the ClientHello")
        result = sni.parse_client_hello(buf)
        if isinstance(result, sni.ClientHello):
            return result
        if early or len(buf) >= PEEK_LIMIT:
            raise sni.Malformed("ClientHello incomplete")
        if time.monotonic() > deadline:
            raise TimeoutError("the ClientHello did not arrive in time")
        want = min(PEEK_LIMIT, max(want * 2, (result.needed or 0) + len(buf)))
        if len(buf) < want // 2:
            time.sleep(0.005)  # the rest is still in flight
