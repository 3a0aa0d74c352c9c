"""The TLS source of ``bench/run proxy``: HTTPS/1.1 with keep-alive, bulk, small and SSE.

    python3 tls_server.py ADDRESS PORT CERT KEY       (prints READY when it listens)

* ``GET /bulk?size=N`` (default 1 GiB): N zero bytes.
* ``GET /small``: ``ok\\n``, keep-alive (one connection carries any number of requests).
* ``GET /sse?n=N&interval_ms=I``: N events (one chunk each), one every I ms on a fixed
  schedule, each ``data: {"n": k, "t": <time.time() just before the send>}``; then it closes.

Why not nginx: with no kTLS on this kernel (CONFIG_TLS is off) nginx hands the kernel one
16 KiB TLS record per ``write()``, and on this veth path the sender's system time (which carries
the forwarding work of every namespace on the way, run in the sending context) made it the
bottleneck: ~850 MB/s at 0.97 of a core. Here TLS runs on memory BIOs: 1 MiB of plaintext is
encrypted into 64 records (OpenSSL, AES-GCM at ~4 GB/s per core here: ``openssl speed``) and
handed to the kernel in one ``send()``: ~1.1 GB/s at 0.5-0.6 of a core (bench/run proxy's
``source`` row), where curl, decrypting, saturates its core first. Only the standard library: it
runs with the system's python3.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

CHUNK = 1 << 20
ZEROS = bytes(CHUNK)
MAX_HEAD = 64 * 1024


class Closed(Exception):
    pass


class Conn:
    """One TLS connection over memory BIOs: decrypted reads, writes flushed in one send."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext) -> None:
        self.sock = sock
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.inc, self.out, server_side=True)
        self.buf = b""

    def _fill(self) -> None:
        self.flush()
        data = self.sock.recv(256 * 1024)
        if not data:
            raise Closed
        self.inc.write(data)

    def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
            except ssl.SSLWantReadError:
                self._fill()
                continue
            self.flush()
            return

    def head(self) -> bytes:
        """The next request head (the bench's clients send no bodies)."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise Closed
            try:
                data = self.tls.read(65536)
            except ssl.SSLWantReadError:
                self._fill()
                continue
            except ssl.SSLZeroReturnError as exc:
                raise Closed from exc
            if not data:  # close_notify: SSLObject.read returns b"" rather than raising
                raise Closed
            self.buf += data
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self.flush()

    def flush(self) -> None:
        data = self.out.read()
        if data:
            self.sock.sendall(data)

    def close(self) -> None:
        """Send close_notify: clients that read to the end see a clean end, not a cut."""
        with contextlib.suppress(ssl.SSLError):  # SSLWantReadError: it waits for the peer's
            self.tls.unwrap()
        self.flush()


def serve(sock: socket.socket, ctx: ssl.SSLContext) -> None:
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = Conn(sock, ctx)
        try:
            conn.handshake()
            while respond(conn, conn.head()):
                pass
            conn.close()
        except (Closed, OSError, ssl.SSLError):
            return


def respond(conn: Conn, head: bytes) -> bool:
    """Answer one request; False: close the connection."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return False
    url = urlsplit(parts[1].decode("latin-1"))
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    close = any(ln.lower().replace(b" ", b"") == b"connection:close" for ln in lines[1:])
    if url.path == "/small":
        conn.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 3\r\n\r\nok\n")
        return not close
    if url.path == "/bulk":
        size = int(query.get("size", 1 << 30))
        conn.tls.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
            b"content-length: %d\r\n\r\n" % size
        )
        left = size
        while left:
            n = min(left, CHUNK)
            conn.send(ZEROS if n == CHUNK else ZEROS[:n])
            left -= n
        return not close
    if url.path == "/sse":
        n, interval = int(query.get("n", 10)), float(query.get("interval_ms", 10)) / 1000
        conn.send(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        start = time.monotonic()
        for k in range(n):
            delay = start + k * interval - time.monotonic()  # a fixed schedule: no drift
            if delay > 0:
                time.sleep(delay)
            event = f"data: {json.dumps({'n': k, 't': time.time()})}\n\n".encode()
            conn.send(b"%x\r\n%s\r\n" % (len(event), event))
        conn.send(b"0\r\n\r\n")
        return False
    conn.send(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
    return not close


def main() -> None:
    address, port, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    listener = socket.create_server((address, port), backlog=128)
    print("READY", flush=True)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=serve, args=(sock, ctx), daemon=True).start()


if __name__ == "__main__":
    main()
