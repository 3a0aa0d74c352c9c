"""A timestamping server-sent-events source (plain HTTP; nginx puts TLS in front of it).

``GET /sse?n=N&interval_ms=I`` answers ``text/event-stream`` and sends N events, one every I ms,
each ``data: {"n": k, "t": <time.time() just before the send>}``, then closes. The client
subtracts ``t`` from its arrival time (same machine, same clock), so the delay is the whole
path: this server's socket, nginx, the proxy under test, the client's TLS and read.

    python3 sse_server.py ADDRESS PORT      (prints READY when it listens)
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"x-accel-buffering: no\r\nconnection: close\r\n\r\n"
)


def serve(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(4096)
            if not data:
                return
            head += data
        target = head.split(b" ", 2)[1].decode("latin-1")
        query = parse_qs(urlsplit(target).query)
        n = int(query.get("n", ["10"])[0])
        interval = float(query.get("interval_ms", ["10"])[0]) / 1000
        conn.sendall(HEAD)
        start = time.monotonic()
        for k in range(n):
            # Paced on a fixed schedule (no drift), the stamp taken just before the send.
            delay = start + k * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            event = f"data: {json.dumps({'n': k, 't': time.time()})}\n\n".encode()
            conn.sendall(event)


def main() -> None:
    address, port = sys.argv[1], int(sys.argv[2])
    listener = socket.create_server((address, port))
    print("READY", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
